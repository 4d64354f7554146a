"""The training loop: bar NLL, a 2-step run whose checkpoint loads in tabpfn, exact resume, budget parsing."""

import dataclasses
import math
import os

import numpy as np
import pytest
import torch
import typer

from oretrofit.cli.demo_host import parse_budget, parse_host_overrides, parse_prior_overrides
from oretrofit.demo_host.prior import PriorConfig
from oretrofit.demo_host.train import (CHECKPOINT_NAME, STATE_NAME, HostConfig, TrainConfig, bar_nll, build_host,
                                       checkpoint_name, class_nll, export_checkpoint, spline_borders, train)

TINY = TrainConfig(
    seed=1, batch_size=2, warmup_steps=50, save_every_s=1e9, log_every=1,
    host=HostConfig(embed_dim=16, nlayers=1, num_buckets=20, dist_embed_num_heads=2,
                    dist_embed_num_inducing_points=8, feat_agg_num_blocks=1, feat_agg_num_heads=2,
                    icl_num_heads=2),
    prior=PriorConfig(min_rows=24, max_rows=40, min_features=1, max_features=3,
                      mlp_max_width=8, fourier_features=8))


def assert_same_weights(a: dict, b: dict) -> None:
    """Every tensor of state dict ``a`` equals ``b``'s of the same name, bit for bit."""
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def test_bar_nll_matches_hand_formula():
    borders = torch.tensor([-2.0, -1.0, 0.5, 3.0])
    logits = torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    y = torch.tensor([0.7, -1.5])
    log_z = math.log(math.exp(0) + math.exp(1) + math.exp(2))
    expected = ((log_z - 2.0 + math.log(2.5)) + (math.log(3) + math.log(1.0))) / 2
    assert bar_nll(logits, y, borders).item() == pytest.approx(expected, rel=1e-6)
    # Outside the support, y is clamped into the edge buckets.
    assert bar_nll(logits[1:], torch.tensor([50.0]), borders).item() == pytest.approx(
        math.log(3) + math.log(2.5), rel=1e-6)


def test_spline_borders_are_v3s():
    borders = spline_borders(100)
    assert borders.shape == (101,) and torch.all(borders[1:] > borders[:-1])
    assert borders[0].item() == -128 and borders[-1].item() == 128 and borders[50].item() == 0


def test_two_steps_write_a_checkpoint_tabpfn_loads_and_resume_is_exact(tmp_path):
    from tabpfn import TabPFNRegressor

    summary = train(tmp_path / "run", dataclasses.replace(TINY, max_steps=2), progress=False)
    assert summary["steps"] == 2 and np.isfinite(summary["final_nll"])
    assert (tmp_path / "run" / CHECKPOINT_NAME).exists() and (tmp_path / "run" / STATE_NAME).exists()
    resumed = train(tmp_path / "run", TrainConfig(max_steps=3), resume=True, progress=False)
    straight = train(tmp_path / "straight", dataclasses.replace(TINY, max_steps=3), progress=False)
    assert resumed["steps"] == straight["steps"] == 3
    a = torch.load(tmp_path / "run" / STATE_NAME, weights_only=True)
    b = torch.load(tmp_path / "straight" / STATE_NAME, weights_only=True)
    assert [r[3] for r in a["loss_log"]] == [r[3] for r in b["loss_log"]]
    assert_same_weights(a["model"], b["model"])

    for bad, message in (("demo.ckpt", "must contain 'v3'"), ("tabpfn-v3.5-demo.ckpt", "must contain 'v3'.*it reads v3.5"),
                         ("tabpfn-v3-demo.pt", ".ckpt or .safetensors")):  # names tabpfn would misread
        with pytest.raises(ValueError, match=message):
            export_checkpoint(tmp_path / "run", tmp_path / bad)
        assert not (tmp_path / bad).exists()
    shipped = export_checkpoint(tmp_path / "run", tmp_path / "tabpfn-v3-exported.ckpt")
    assert torch.load(shipped, weights_only=True)["oretrofit"]["steps"] == 3
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = X[:, 0] + 0.1 * rng.normal(size=30)
    model = TabPFNRegressor(model_path=str(shipped), device="cpu", n_estimators=1, random_state=0)
    pred = model.fit(X[:20], y[:20]).predict(X[20:])
    assert pred.shape == (10,) and np.isfinite(pred).all()


def test_a_new_stage_starts_from_the_earlier_weights_and_counts_its_steps(tmp_path):
    train(tmp_path / "one", dataclasses.replace(TINY, max_steps=2), progress=False)
    first = torch.load(tmp_path / "one" / STATE_NAME, weights_only=True)
    wider = dataclasses.replace(TINY.prior, max_rows=60, noise_max=3.0)
    second_cfg = dataclasses.replace(TINY, max_steps=1, lr=5e-4, seed=2, prior=wider)
    # Zero steps: the new stage's weights are exactly the earlier stage's.
    train(tmp_path / "zero", dataclasses.replace(second_cfg, max_steps=0), init_from=tmp_path / "one",
          progress=False)
    zero = torch.load(tmp_path / "zero" / STATE_NAME, weights_only=True)
    assert_same_weights(first["model"], zero["model"])
    train(tmp_path / "two", second_cfg, init_from=tmp_path / "one", progress=False)
    two = torch.load(tmp_path / "two" / STATE_NAME, weights_only=True)
    assert [s["steps"] for s in two["stages"]] == [2] and two["step"] == 1
    assert two["stages"][0]["loss_log"] == first["loss_log"]
    assert two["train_config"]["prior"]["max_rows"] == 60 and two["train_config"]["lr"] == 5e-4
    meta = torch.load(tmp_path / "two" / CHECKPOINT_NAME, weights_only=True)["oretrofit"]
    assert (meta["steps"], meta["stages"], meta["seed"]) == (3, 2, TINY.seed)   # seed of the initial weights
    assert meta["elapsed_s"] == pytest.approx(first["elapsed_s"] + two["elapsed_s"], abs=0.1)
    # Resuming the new stage keeps its stage history.
    train(tmp_path / "two", dataclasses.replace(second_cfg, max_steps=2), resume=True, progress=False)
    resumed = torch.load(tmp_path / "two" / STATE_NAME, weights_only=True)
    assert resumed["step"] == 2 and [s["steps"] for s in resumed["stages"]] == [2]


def test_a_new_stage_keeps_the_architecture(tmp_path):
    train(tmp_path / "one", dataclasses.replace(TINY, max_steps=1), progress=False)
    other = dataclasses.replace(TINY, host=dataclasses.replace(TINY.host, embed_dim=8))
    with pytest.raises(ValueError, match="a new stage keeps the task and architecture"):
        train(tmp_path / "two", other, init_from=tmp_path / "one", progress=False)
    with pytest.raises(ValueError, match="point --init-from at a `demo-host train` output folder"):
        train(tmp_path / "three", TINY, init_from=tmp_path / "missing", progress=False)
    with pytest.raises(ValueError, match="give one of them"):
        train(tmp_path / "one", TINY, resume=True, init_from=tmp_path / "one", progress=False)


def test_prior_overrides_are_typed_and_unknown_keys_are_refused():
    cfg = parse_prior_overrides(["max_rows=512", "noise_max=3", "family_weights=0.3,0.3,0.4"])
    assert cfg.max_rows == 512 and isinstance(cfg.max_rows, int) and cfg.noise_max == 3.0
    assert cfg.family_weights == (0.3, 0.3, 0.4) and cfg.min_rows == PriorConfig().min_rows
    with pytest.raises(ValueError, match="KEY one of min_rows"):
        parse_prior_overrides(["max_row=512"])
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_prior_overrides(["max_rows"])
    trees = parse_prior_overrides(["family_weights=0.4,0.35,0.25,0.35", "zero_inflated=0.25"])
    assert trees.family_weights == (0.4, 0.35, 0.25, 0.35) and trees.zero_inflated == 0.25
    with pytest.raises(ValueError, match=r"family_weights \(1.0, 2.0\) must be 3 to 5"):
        parse_prior_overrides(["family_weights=1,2"])


def test_host_overrides_set_the_architecture_and_unknown_keys_are_refused():
    host = parse_host_overrides(["embed_dim=64", "nlayers=2"])
    assert host.embed_dim == 64 and isinstance(host.embed_dim, int) and host.nlayers == 2
    assert host.num_buckets == HostConfig().num_buckets
    assert host.tabpfn_config().embed_dim == 64
    with pytest.raises(ValueError, match="--host 'emsize=64' is not KEY=VALUE with KEY one of embed_dim"):
        parse_host_overrides(["emsize=64"])
    with pytest.raises(ValueError, match=r"--host 'embed_dim=wide': embed_dim takes int values \(default 32\)"):
        parse_host_overrides(["embed_dim=wide"])
    with pytest.raises(ValueError, match="--prior 'noise_max=lots': noise_max takes float values"):
        parse_prior_overrides(["noise_max=lots"])


def test_resume_without_state_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="drop --resume"):
        train(tmp_path, TINY, resume=True, progress=False)


class _Payload:
    """An object whose unpickling would run code: it appends to a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "a"))


@pytest.mark.parametrize("entry", ["resume", "init_from", "export", "card"])
def test_a_state_with_a_pickle_payload_runs_nothing_and_names_the_file(tmp_path, entry):
    """Every reader of train_state.pt (resume, a new stage, export, card) goes through
    load_state, which unpickles weights-only: the payload never runs."""
    from oretrofit.demo_host.card import write_card

    run, marker = tmp_path / "run", tmp_path / "pwned"
    train(run, dataclasses.replace(TINY, max_steps=1), progress=False)
    state = torch.load(run / STATE_NAME, weights_only=True)
    torch.save({**state, "extra": _Payload(marker)}, run / STATE_NAME)
    calls = {"resume": lambda: train(run, TINY, resume=True, progress=False),
             "init_from": lambda: train(tmp_path / "next", TINY, init_from=run, progress=False),
             "export": lambda: export_checkpoint(run, tmp_path / "tabpfn-v3-out.ckpt"),
             "card": lambda: write_card(run, tmp_path / "eval.json", tmp_path / "card.md", "cmd")}
    with pytest.raises(ValueError, match=r"train_state\.pt is not a run state oretrofit wrote"):
        calls[entry]()
    assert not marker.exists()


def test_a_truncated_state_is_a_clear_error(tmp_path):
    run = tmp_path / "run"
    train(run, dataclasses.replace(TINY, max_steps=1), progress=False)
    (run / STATE_NAME).write_bytes((run / STATE_NAME).read_bytes()[:100])
    with pytest.raises(ValueError, match="cannot be read as a run state"):
        export_checkpoint(run, tmp_path / "tabpfn-v3-out.ckpt")


def test_a_run_state_that_is_not_a_file_is_refused_by_what_it_is(tmp_path):
    """A FIFO as ``train_state.pt`` made torch.load wait for a writer forever."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / STATE_NAME)
    with pytest.raises(ValueError, match=r"the run state .*train_state\.pt is a named pipe "
                                         r"\(FIFO\), not a regular file; point --run at"):
        export_checkpoint(run, tmp_path / "tabpfn-v3-out.ckpt")


@pytest.mark.parametrize("text,seconds", [("2h", 7200), ("90m", 5400), ("1h30m", 5400),
                                          ("45s", 45), ("300", 300)])
def test_parse_budget(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "2d", "h", "soon"])
def test_parse_budget_rejects_non_durations(text):
    with pytest.raises(typer.BadParameter, match="not a duration"):
        parse_budget(text)


def test_cli_errors_name_the_fix(tmp_path):
    from typer.testing import CliRunner

    from oretrofit.cli.demo_host import register

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["demo-host", "export", "--run", str(tmp_path), "--out",
                                      str(tmp_path / "tabpfn-v3-x.ckpt")])
    assert result.exit_code == 2 and "point --run at a `demo-host train` output folder" in result.output
    result = CliRunner().invoke(app, ["demo-host", "card", "--run", str(tmp_path), "--evaluation",
                                      str(tmp_path / "eval.json"), "--out", str(tmp_path / "card.md"),
                                      "--command", "x"])
    assert result.exit_code == 2 and "point --run at a `demo-host train` output folder" in result.output
    result = CliRunner().invoke(app, ["demo-host", "train", "--out", str(tmp_path), "--budget", "soon"])
    assert result.exit_code == 2 and "not a duration" in result.output
    result = CliRunner().invoke(app, ["demo-host", "train", "--out", str(tmp_path), "--host", "emsize=8"])
    assert result.exit_code == 2 and "--host 'emsize=8' is not KEY=VALUE" in result.output
    result = CliRunner().invoke(app, ["demo-host", "train", "--out", str(tmp_path), "--budget-steps", "0"])
    assert result.exit_code == 2 and "budget_steps must be a positive step count" in result.output
    result = CliRunner().invoke(app, ["demo-host", "train", "--out", str(tmp_path), "--workers", "2", "--batch-size", "3"])
    assert result.exit_code == 2 and "give a batch size that is a multiple of the worker count" in result.output
    assert not (tmp_path / STATE_NAME).exists()


def test_cli_host_option_sets_the_trained_architecture(tmp_path):
    from typer.testing import CliRunner

    from oretrofit.cli.demo_host import register

    app = typer.Typer()
    register(app)
    host_args = [a for k, v in dataclasses.asdict(TINY.host).items() for a in ("--host", f"{k}={v}")]
    prior_args = [a for k in ("max_rows", "max_features") for a in ("--prior", f"{k}={getattr(TINY.prior, k)}")]
    result = CliRunner().invoke(app, ["demo-host", "train", "--out", str(tmp_path), "--max-steps", "1",
                                      *host_args, *prior_args])
    assert result.exit_code == 0, result.output
    checkpoint = torch.load(tmp_path / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    assert checkpoint["config"]["embed_dim"] == TINY.host.embed_dim == 16
    assert checkpoint["config"]["nlayers"] == TINY.host.nlayers


def test_a_step_budget_trains_the_same_host_whatever_the_clock(tmp_path, monkeypatch):
    # past warm-up the wall-clock schedule depends on elapsed time; a step budget must not
    cfg = dataclasses.replace(TINY, warmup_steps=1, budget_s=1e-9, budget_steps=4)
    first = train(tmp_path / "a", cfg, progress=False)
    import oretrofit.demo_host.train as train_module

    ticks = iter(range(0, 10**6, 1000))  # a clock 1000 s per reading: any time-based horizon is spent
    monkeypatch.setattr(train_module.time, "monotonic", lambda: float(next(ticks)))
    second = train(tmp_path / "b", cfg, progress=False)
    assert first["steps"] == second["steps"] == 4
    a = torch.load(tmp_path / "a" / STATE_NAME, weights_only=True)
    b = torch.load(tmp_path / "b" / STATE_NAME, weights_only=True)
    assert [r[2] for r in a["loss_log"]] == [r[2] for r in b["loss_log"]]  # the same learning rates
    assert a["loss_log"][-1][2] < a["loss_log"][1][2]  # and they do anneal over the 4 steps
    assert_same_weights(a["model"], b["model"])


def test_a_step_budget_must_be_positive():
    with pytest.raises(ValueError, match="positive step count"):
        dataclasses.replace(TINY, budget_steps=0)


def test_class_nll_matches_hand_formula():
    logits = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    y = torch.tensor([2.0, 0.0])
    log_z = math.log(math.exp(0) + math.exp(1) + math.exp(2))
    assert class_nll(logits, y).item() == pytest.approx(((log_z - 2.0) + math.log(3)) / 2, rel=1e-6)


def test_a_few_classifier_steps_reduce_the_cross_entropy_of_a_batch():
    from oretrofit.demo_host.classes import sample_class_batch
    from oretrofit.demo_host.train import build_optimizer, training_step

    cfg = dataclasses.replace(TINY, task="classifier", lr=3e-3)
    model = build_host(cfg.host, cfg.seed, cfg.task)
    batch = sample_class_batch(np.random.default_rng(0), 4, cfg.prior, cfg.classes)
    opt = build_optimizer(model, cfg)
    losses = [training_step(model, opt, batch, spline_borders(cfg.host.num_buckets), cfg.grad_clip)
              for _ in range(15)]
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0]


def test_a_classifier_run_starts_from_the_regressor_and_writes_a_checkpoint_tabpfn_loads(tmp_path):
    from tabpfn import TabPFNClassifier

    from oretrofit._files.provenance import sha256_file

    train(tmp_path / "reg", dataclasses.replace(TINY, max_steps=1), progress=False)
    regressor = export_checkpoint(tmp_path / "reg", tmp_path / "tabpfn-v3-reg.ckpt")
    cfg = dataclasses.replace(TINY, task="classifier", warm_start=str(regressor))
    train(tmp_path / "zero", dataclasses.replace(cfg, max_steps=0), progress=False)
    zero = torch.load(tmp_path / "zero" / STATE_NAME, weights_only=True)["model"]
    assert torch.equal(zero["x_embed.weight"], torch.load(regressor, weights_only=True)["state_dict"]["x_embed.weight"])
    summary = train(tmp_path / "cls", dataclasses.replace(cfg, max_steps=2), progress=False)
    assert summary["checkpoint"].endswith(checkpoint_name("classifier")) and np.isfinite(summary["final_nll"])
    written = torch.load(summary["checkpoint"], weights_only=True)
    assert written["config"]["max_num_classes"] == 10
    assert written["oretrofit"]["warm_start"]["sha256"] == sha256_file(regressor)
    assert "demo classifier (prior-fitted, 2 steps" in written["oretrofit"]["weights"]
    resumed = train(tmp_path / "cls", dataclasses.replace(cfg, max_steps=3), resume=True, progress=False)
    assert resumed["steps"] == 3
    exported = export_checkpoint(tmp_path / "cls", tmp_path / "tabpfn-v3-demo-classifier.ckpt")
    with pytest.raises(ValueError, match="drop --inference"):
        export_checkpoint(tmp_path / "cls", tmp_path / "tabpfn-v3-x.ckpt", inference="plain")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 1).astype(int)
    proba = TabPFNClassifier(model_path=str(exported), device="cpu", n_estimators=1,
                             random_state=0).fit(X[:30], y[:30]).predict_proba(X[30:])
    assert proba.shape == (10, 3) and np.allclose(proba.sum(axis=1), 1.0, atol=1e-5)


def test_a_warm_start_is_for_a_classifier_and_the_task_is_checked():
    with pytest.raises(ValueError, match="give task='classifier'"):
        TrainConfig(warm_start="tabpfn-v3-demo.ckpt")
    with pytest.raises(ValueError, match="task must be one of regressor, classifier"):
        TrainConfig(task="ranker")
