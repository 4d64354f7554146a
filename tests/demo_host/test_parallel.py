"""Data-parallel training: gradients averaged over worker processes, exact resume, a refused split."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from oretrofit.demo_host.parallel import Workers, spawn, weights_digest
from oretrofit.demo_host.train import STATE_NAME, TrainConfig, train

from .test_train import TINY, assert_same_weights


def _record_averaged_gradient(workers: Workers, out: Path) -> None:
    """Worker k sets every gradient of a 2x3 linear layer to k + 1 (the bias has none) and loss k."""
    layer = torch.nn.Linear(3, 2)
    layer.weight.grad = torch.full_like(layer.weight, workers.rank + 1.0)
    loss = workers.average_gradients(layer, torch.tensor(float(workers.rank)))
    (out / f"rank{workers.rank}.json").write_text(json.dumps({
        "weight": layer.weight.grad.tolist(), "bias": layer.bias.grad.tolist(), "loss": loss,
        "clock": workers.from_rank0(10.0 + workers.rank), "gathered": workers.gather(workers.rank)}))


def test_workers_average_gradients_and_share_rank0s_clock(tmp_path):
    spawn(3, _record_averaged_gradient, tmp_path)
    for rank in range(3):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["weight"] == [[2.0] * 3] * 2            # (1 + 2 + 3) / 3
        assert got["bias"] == [0.0, 0.0]                   # no gradient anywhere counts as zero
        assert got["loss"] == 1.0 and got["clock"] == 10.0 and got["gathered"] == [0, 1, 2]


def _rank1_fails(workers: Workers) -> None:
    if workers.rank == 1:
        raise ValueError("worker 1 failed on purpose")


def test_a_worker_that_raises_fails_spawn_with_its_error():
    # the other worker finishes and leaves at once (without finalizing): the error still comes back
    with pytest.raises(torch.multiprocessing.ProcessRaisedException, match="worker 1 failed on purpose"):
        spawn(2, _rank1_fails)


def test_two_workers_train_and_resume_exactly(tmp_path):
    two = dataclasses.replace(TINY, workers=2, max_steps=2)
    summary = train(tmp_path / "run", two, progress=False)
    state = torch.load(tmp_path / "run" / STATE_NAME, weights_only=True)
    assert summary["steps"] == state["step"] == 2 and summary["train_config"]["workers"] == 2
    assert len(state["worker_rngs"]) == 1 and state["worker_rngs"][0][0] != state["rng"]
    # resuming restores both workers' samplers: the same weights and losses as 3 steps straight
    # (which saves before every step: a save, with its digest check, changes nothing)
    train(tmp_path / "run", TrainConfig(max_steps=3), resume=True, progress=False)
    train(tmp_path / "straight", dataclasses.replace(two, max_steps=3, save_every_s=0.0), progress=False)
    a = torch.load(tmp_path / "run" / STATE_NAME, weights_only=True)
    b = torch.load(tmp_path / "straight" / STATE_NAME, weights_only=True)
    assert [r[3] for r in a["loss_log"]] == [r[3] for r in b["loss_log"]]
    assert_same_weights(a["model"], b["model"])
    # two workers draw other tasks than one worker with the same batch
    train(tmp_path / "one", dataclasses.replace(TINY, max_steps=3), progress=False)
    one = torch.load(tmp_path / "one" / STATE_NAME, weights_only=True)
    assert [r[3] for r in one["loss_log"]] != [r[3] for r in b["loss_log"]]


def test_a_batch_the_workers_cannot_split_is_refused():
    with pytest.raises(ValueError, match="multiple of the worker count"):
        dataclasses.replace(TINY, batch_size=3, workers=2)
    with pytest.raises(ValueError, match="multiple of the worker count"):
        dataclasses.replace(TINY, workers=0)


def test_weights_digest_sees_one_changed_bit():
    layer = torch.nn.Linear(3, 2)
    before = weights_digest(layer)
    with torch.no_grad():
        layer.bias[0] = torch.nextafter(layer.bias[0], torch.tensor(1.0))
    assert weights_digest(layer) != before
