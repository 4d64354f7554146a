"""A curriculum run is exactly its stages run one after another, and resumes where it stopped."""

import dataclasses

import pytest
import torch
import typer
from typer.testing import CliRunner

from oretrofit.demo_host.curriculum import CURRICULUM, Stage, stage_configs, stage_folders, train_curriculum
from oretrofit.demo_host.train import STATE_NAME, train

from .test_train import TINY, assert_same_weights

SMALL = (Stage(24, 1.0), Stage(32, 0.7), Stage(40, 0.5))  # TINY's task sizes, so the test stays fast
CFG = dataclasses.replace(TINY, warmup_steps=1, budget_s=1e-9, budget_steps=6)


def _weights(run):
    return torch.load(run / STATE_NAME, weights_only=True)["model"]


def test_stages_split_the_budget_and_set_rate_seed_and_task_length():
    cfg = dataclasses.replace(TINY, lr=7e-4, seed=10, budget_s=7200.0)
    stages = stage_configs(cfg)
    assert [s.seed for s in stages] == [10, 11, 12]
    assert [s.lr for s in stages] == pytest.approx([7e-4, 4.9e-4, 3.5e-4])  # v13c's peak rates
    assert [s.budget_s for s in stages] == [2400.0] * 3
    assert [s.prior.max_rows for s in stages] == [128, 256, 512] == [s.max_rows for s in CURRICULUM]
    assert all(s.prior.noise_max == cfg.prior.noise_max and s.host == cfg.host for s in stages)
    assert [s.budget_steps for s in stage_configs(dataclasses.replace(cfg, budget_steps=7))] == [2, 2, 2]
    with pytest.raises(ValueError, match="split over 3 stages; give at least 3"):
        stage_configs(dataclasses.replace(cfg, budget_steps=2))


def test_a_curriculum_is_its_stages_run_by_hand(tmp_path):
    summary = train_curriculum(tmp_path / "run", CFG, stages=SMALL, progress=False)
    folders = stage_folders(tmp_path / "run", 3)
    assert folders == [tmp_path / "run" / "stage1", tmp_path / "run" / "stage2", tmp_path / "run"]
    assert [s["steps"] for s in summary["stages"]] == [2, 2, 2] and summary["steps"] == 6
    by_hand = [tmp_path / "hand1", tmp_path / "hand2", tmp_path / "hand3"]
    for k, (run, cfg) in enumerate(zip(by_hand, stage_configs(CFG, SMALL))):
        train(run, cfg, init_from=by_hand[k - 1] if k else None, progress=False)
    assert_same_weights(_weights(tmp_path / "run"), _weights(by_hand[-1]))
    state = torch.load(tmp_path / "run" / STATE_NAME, weights_only=True)
    assert [s["train_config"]["prior"]["max_rows"] for s in state["stages"]] == [24, 32]
    assert state["train_config"]["prior"]["max_rows"] == 40 and state["train_config"]["seed"] == CFG.seed + 2


def test_an_interrupted_curriculum_resumes_to_the_same_weights(tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train_curriculum(straight, CFG, stages=SMALL, progress=False)
    # killed one step into stage 2: stage 1 done, stage 2 saved after a step, stage 3 never started
    stopped = tmp_path / "stopped"
    first, second, _ = stage_configs(CFG, SMALL)
    train(stopped / "stage1", first, progress=False)
    train(stopped / "stage2", dataclasses.replace(second, max_steps=1), init_from=stopped / "stage1", progress=False)
    import oretrofit.demo_host.curriculum as curriculum_module

    calls = []

    def spy(out, cfg, **kwargs):
        calls.append((out.name, kwargs.get("resume", False), kwargs.get("init_from")))
        return train(out, cfg, **kwargs)

    monkeypatch.setattr(curriculum_module, "train", spy)
    summary = train_curriculum(stopped, CFG, stages=SMALL, resume=True, progress=False)
    # the saved stages continue (a restart would give the same weights, so the calls are checked too)
    assert calls == [("stage1", True, None), ("stage2", True, None), ("stopped", False, stopped / "stage2")]
    assert [s["steps"] for s in summary["stages"]] == [2, 2, 2]
    assert_same_weights(_weights(stopped), _weights(straight))


def test_cli_curriculum_runs_three_stages_and_refuses_what_it_sets(tmp_path):
    from oretrofit.cli.demo_host import register

    app = typer.Typer()
    register(app)
    host_args = [a for k, v in dataclasses.asdict(TINY.host).items() for a in ("--host", f"{k}={v}")]
    ok = CliRunner().invoke(app, ["demo-host", "train", "--curriculum", "--out", str(tmp_path / "run"),
                                  "--budget-steps", "3", "--prior", "max_features=2", *host_args])
    assert ok.exit_code == 0, ok.output
    state = torch.load(tmp_path / "run" / STATE_NAME, weights_only=True)
    assert len(state["stages"]) == 2 and state["step"] == 1
    assert state["train_config"]["prior"]["max_features"] == 2  # other prior overrides reach every stage
    for extra, message in ((["--init-from", str(tmp_path / "run")], "drop --init-from"),
                           (["--prior", "max_rows=64"], "drop --prior max_rows")):
        refused = CliRunner().invoke(app, ["demo-host", "train", "--curriculum", "--out", str(tmp_path / "x"), *extra])
        assert refused.exit_code == 2 and message in refused.output
        assert not (tmp_path / "x").exists()
