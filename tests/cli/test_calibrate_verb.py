"""`oretrofit calibrate`: per-site τ for the TabPFN v3 demo host from a dataset's train rows."""

from __future__ import annotations

import json

import numpy as np
import torch
import pytest
import typer
from typer.testing import CliRunner

from oretrofit.cli import calibrate as calibrate_verb
from oretrofit.regress.data import load_dataset
from oretrofit.regress.protocol import PAPER_PROTOCOL
from oretrofit.tabpfn import make_regressor

DELTA = 1e-3


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)          # keep `calibrate` a sub-command
    calibrate_verb.register(app)
    return app


@pytest.fixture(scope="module")
def spec(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrate") / "spec.json"
    result = CliRunner().invoke(cli, ["calibrate", "--model-path", "demo", "--dataset",
                                      "sklearn:diabetes", "--seed", "11", "--delta", str(DELTA),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "spec written to" in result.output
    return json.loads(out.read_text())


def test_the_spec_records_what_it_was_calibrated_on(spec):
    data = spec["calibration"]["data"]
    diabetes = load_dataset("sklearn:diabetes")
    split = PAPER_PROTOCOL.split(len(diabetes.y), 11)
    assert data["splits"] == [{"dataset": "sklearn:diabetes", "sha256": diabetes.checksum,
                               "seed": 11, "split_sha256": split.digest(),
                               "rows": len(split.train)}]
    assert len(data["checkpoint_sha256"]) == 64 and data["protocol"]["name"]
    assert spec["calibration"]["delta"] == DELTA and spec["arm"] == "full-o"
    # one τ per site, every one far above the paper's global 1e-8
    assert set(spec["site_tau"]) == set(spec["sites"]) and len(spec["sites"]) > 10
    assert min(spec["site_tau"].values()) > 1e-6


def test_the_calibrated_spec_keeps_predictions_near_base_on_held_out_rows(spec):
    diabetes = load_dataset("sklearn:diabetes")
    split = PAPER_PROTOCOL.split(len(diabetes.y), 11)
    X, y = diabetes.X, diabetes.y
    pinned = {"device": "cpu", "n_estimators": 1, "inference_precision": torch.float32}
    base, _ = make_regressor("demo", "base", **pinned)
    calibrated, retrofit = make_regressor("demo", spec=spec, **pinned)
    assert retrofit is not None and retrofit.plan.site_tau == spec["site_tau"]
    assert len(spec["calibration"]["weights_sha256"]) == 64
    p_base = base.fit(X[split.train], y[split.train]).predict(X[split.test])
    p_cal = calibrated.fit(X[split.train], y[split.train]).predict(X[split.test])
    rmse = lambda p: float(np.sqrt(np.mean((p - y[split.test]) ** 2)))     # noqa: E731
    assert abs(rmse(p_cal) / rmse(p_base) - 1) < 0.01


@pytest.mark.parametrize("args,message", [
    (["--seed", "11", "--seed", "11"], "must not repeat"),
    (["--delta", "0"], "delta must be in"),
    (["--arm", "nope"], "'nope' is not one of oa, full-o"),
])
def test_bad_settings_are_refused_and_write_nothing(cli, tmp_path, args, message):
    out = tmp_path / "spec.json"
    result = CliRunner().invoke(cli, ["calibrate", "--model-path", "demo", "--dataset",
                                      "sklearn:diabetes", "--out", str(out), *args])
    assert result.exit_code == 2 and message in result.output
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--model", "minilm", "--dataset", "sklearn:diabetes"], "--dataset belong to the TabPFN form"),
    (["--model", "minilm", "--model-path", "demo", "--seed", "3"],
     "--model-path, --seed belong to the TabPFN form"),
    (["--text-file", "lines.txt", "--dataset", "sklearn:diabetes"],
     "--text-file belong to the transformers form"),
    (["--model-path", "demo"], "give --dataset SPEC"),
])
def test_the_two_forms_do_not_mix(cli, tmp_path, args, message):
    out = tmp_path / "spec.json"
    result = CliRunner().invoke(cli, ["calibrate", "--out", str(out), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()


def test_a_transformers_folder_without_a_tokenizer_is_refused(cli, tmp_path):
    from hosts.transformers import zoo
    folder = tmp_path / "bert"
    zoo.build(next(a for a in zoo.ARCHITECTURES if a.name == "BERT")).save_pretrained(folder)
    out = tmp_path / "spec.json"
    result = CliRunner().invoke(cli, ["calibrate", "--model", str(folder), "--out", str(out)])
    assert result.exit_code == 2 and "holds no tokenizer" in result.output, result.output
    assert not out.exists()
