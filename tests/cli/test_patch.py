"""`oretrofit patch`: site table, JSON, round trip patch → artifact → load → predict."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from oretrofit import RetrofitError
from oretrofit.cli import patch as patch_verb
from oretrofit.tabpfn_v3 import load_patched_regressor, make_regressor


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)          # keep `patch` a sub-command
    patch_verb.register(app)
    return app


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                   ) -> None:
    monkeypatch.setenv("ORETROFIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _run(cli: typer.Typer, *args: str):
    return CliRunner().invoke(cli, ["patch", "--model-path", "random", *args])


def test_round_trip_patch_artifact_load_predict(cli, tmp_path):
    out = tmp_path / "patched-tabpfn-v3.ckpt"
    result = _run(cli, "--arm", "full-o", "--tau", "1e-8", "--site-tau", r"re:icl\..*=1e-6",
                  "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["schema_version"] == 1 and summary["out"] == str(out)
    assert summary["weights"].startswith("random weights")
    taus = {row["site"]: row["tau"] for row in summary["sites"]}
    assert taus["icl.0.attn"] == 1e-6 and taus["te.col"] == 1e-8
    assert summary["spec"]["source_checkpoint_sha256"] == summary["checkpoint_sha256"]

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(36, 3)), rng.normal(size=36)
    loaded, retrofit = load_patched_regressor(out)
    assert retrofit.plan.arm == "full-o" and retrofit.plan.site_tau == {r"re:icl\..*": 1e-6}
    direct, _ = make_regressor("random", "full-o", 1e-8, site_tau={r"re:icl\..*": 1e-6})
    np.testing.assert_array_equal(loaded.fit(x[:28], y[:28]).predict(x[28:]),
                                  direct.fit(x[:28], y[:28]).predict(x[28:]))
    from tabpfn import TabPFNRegressor                  # tabpfn still reads it, unpatched
    vendor = TabPFNRegressor(model_path=str(out), device="cpu", n_estimators=1,
                             inference_precision=torch.float32, random_state=0)
    base, _ = make_regressor("random", "base")
    np.testing.assert_array_equal(vendor.fit(x[:28], y[:28]).predict(x[28:]),
                                  base.fit(x[:28], y[:28]).predict(x[28:]))


def test_table_and_dry_run(cli, tmp_path):
    result = _run(cli, "--arm", "oa", "--tau", "1e-8")
    assert result.exit_code == 0, result.output
    assert "fde.0.induce1" in result.stdout and "inducing_vectors.min" in result.stdout
    out = tmp_path / "x-v3.ckpt"
    result = _run(cli, "--arm", "full-o", "--dry-run", "--json", "--out", str(out))
    summary = json.loads(result.stdout)
    assert summary["dry_run"] and summary["spec"] is None and not out.exists()
    assert {row["kind"] for row in summary["sites"]} == {"attention", "norm", "ffn", "inject"}


def test_bad_input_exits_with_the_fix(cli, tmp_path):
    result = _run(cli, "--site-tau", "icl.*")
    assert result.exit_code == 2 and "PATTERN=TAU" in result.output
    result = _run(cli, "--arm", "everything")
    assert result.exit_code == 2 and "unknown arm" in result.output
    result = CliRunner().invoke(cli, ["patch", "--model-path", str(tmp_path / "none-v3.ckpt")])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = _run(cli, "--tau", "-1")
    assert result.exit_code == 2 and "tau must be a positive" in result.output


def test_plain_checkpoint_is_not_an_artifact():
    from oretrofit.tabpfn_v3 import resolve_model_path
    with pytest.raises(RetrofitError, match="without an oretrofit patch spec"):
        load_patched_regressor(resolve_model_path("random"))
