"""`oretrofit patch`: site table, JSON, round trip patch → artifact → load → predict."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from oretrofit import RetrofitError
from oretrofit._files.provenance import portable
from oretrofit.cli import patch as patch_verb
from oretrofit.tabpfn import load_patched_regressor, make_regressor

ONE = {"device": "cpu", "n_estimators": 1}            # one estimator: tabpfn's "auto" runs more


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
    assert summary["schema_version"] == 1 and summary["out"] == portable(out)     # no local path
    assert summary["weights"].startswith("random weights")
    taus = {row["site"]: row["tau"] for row in summary["sites"]}
    assert taus["icl.0.attn"] == 1e-6 and taus["te.col"] == 1e-8
    assert summary["spec"]["source_checkpoint_sha256"] == summary["checkpoint_sha256"]

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(36, 3)), rng.normal(size=36)
    loaded, retrofit = load_patched_regressor(out, **ONE)
    assert retrofit.plan.arm == "full-o" and retrofit.plan.site_tau == {r"re:icl\..*": 1e-6}
    direct, _ = make_regressor("random", "full-o", 1e-8, site_tau={r"re:icl\..*": 1e-6}, **ONE)
    patched = loaded.fit(x[:28], y[:28]).predict(x[28:])
    np.testing.assert_array_equal(patched, direct.fit(x[:28], y[:28]).predict(x[28:]))
    from tabpfn import TabPFNRegressor          # tabpfn's own estimator loads it patched too
    vendor = TabPFNRegressor(model_path=str(out), **ONE)
    np.testing.assert_array_equal(vendor.fit(x[:28], y[:28]).predict(x[28:]), patched)


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
    result = _run(cli, "--site-tau", "icl.*=1e-6", "--site-tau", "te.*=1", "--site-tau",
                  "icl.*=1e-3")                      # the last τ won, without a word
    assert result.exit_code == 2 and "pattern 'icl.*' is given twice (τ 1e-06 and 0.001)" in \
        " ".join(result.output.replace("│", " ").split())
    result = _run(cli, "--arm", "everything")
    assert result.exit_code == 2 and "'everything' is not one of base, oa, full-o" in \
        " ".join(result.output.replace("│", " ").split())
    result = CliRunner().invoke(cli, ["patch", "--model-path", str(tmp_path / "none-v3.ckpt")])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = _run(cli, "--tau", "-1")
    assert result.exit_code == 2 and "tau must be a positive" in result.output


def test_plain_checkpoint_is_not_an_artifact():
    from oretrofit.tabpfn import resolve_model_path
    with pytest.raises(RetrofitError, match="without an oretrofit patch spec"):
        load_patched_regressor(resolve_model_path("random"))


SITE_TAU = {"icl.*": 0.3, "fde.*": 2.0, "te.*": 0.05}


@pytest.fixture()
def spec_file(tmp_path, calibration_record):
    """A spec as `oretrofit calibrate` writes one: per-site τ and a calibration record."""
    import oretrofit
    from oretrofit.tabpfn import checkpoint_sha256, resolve_model_path
    from oretrofit.hosts.tabpfn.checkpoints import build_model, load_checkpoint
    path = resolve_model_path("random")
    model, _, _ = build_model(load_checkpoint(path))
    spec = oretrofit.retrofit(model, "full-o", 0.5, site_tau=SITE_TAU).spec()
    spec["calibration"] = calibration_record(model, checkpoint_sha256=checkpoint_sha256(path))
    out = tmp_path / "spec.json"
    out.write_text(json.dumps(spec))
    return out


def test_a_spec_file_patches_prints_each_sites_tau_and_is_recorded(cli, spec_file, tmp_path):
    given = json.loads(spec_file.read_text())
    out = tmp_path / "calibrated-tabpfn-v3.ckpt"
    result = _run(cli, "--spec", str(spec_file), "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["arm"] == "full-o" and summary["site_tau"] == SITE_TAU
    taus = {row["site"]: row["tau"] for row in summary["sites"]}
    assert taus["icl.0.attn"] == 0.3 and taus["fde.0.induce1"] == 2.0 and taus["te.col"] == 0.05
    from oretrofit.tabpfn import read_patch_spec
    recorded = read_patch_spec(out)
    assert recorded["calibration"] == given["calibration"] and recorded["site_tau"] == SITE_TAU
    assert recorded["source_checkpoint_sha256"] == summary["checkpoint_sha256"]
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(36, 3)), rng.normal(size=36)
    loaded, _ = load_patched_regressor(out, **ONE)
    direct, _ = make_regressor("random", spec=spec_file, **ONE)
    np.testing.assert_array_equal(loaded.fit(x[:28], y[:28]).predict(x[28:]),
                                  direct.fit(x[:28], y[:28]).predict(x[28:]))
    table = _run(cli, "--spec", str(spec_file), "--dry-run", "--out", str(tmp_path / "n-v3.ckpt"))
    assert table.exit_code == 0, table.output
    assert "spec spec.json (arm full-o)" in table.stdout
    assert "│ fde.0.induce1.ffn  │ ffn       │ 2 " in table.stdout
    assert "dry run" in table.stdout and not (tmp_path / "n-v3.ckpt").exists()


@pytest.mark.parametrize("flags", [["--tau", "1e-6"], ["--arm", "full-o"], ["--eps", "1e-6"],
                                   ["--site-tau", "icl.*=1"], ["--target", "icl.*"]])
def test_a_spec_file_with_retrofit_flags_is_refused(cli, spec_file, tmp_path, flags):
    out = tmp_path / "x-v3.ckpt"
    result = _run(cli, "--spec", str(spec_file), *flags, "--out", str(out))
    assert result.exit_code == 2 and f"drop {flags[0]}" in result.output
    assert not out.exists()


def test_a_spec_that_does_not_fit_the_checkpoint_is_refused(cli, spec_file, tmp_path):
    spec = json.loads(spec_file.read_text())
    for changed, message in (({"sites": spec["sites"][:-1]}, "site list"),
                             ({"calibration": {**spec["calibration"],
                                               "data": {"checkpoint_sha256": "0" * 64}}},
                              "make the spec from this checkpoint")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**spec, **changed}))
        out = tmp_path / "x-v3.ckpt"
        result = _run(cli, "--spec", str(bad), "--out", str(out))
        assert result.exit_code == 2 and message in result.output, result.output
        assert not out.exists()
    missing = _run(cli, "--spec", str(tmp_path / "nowhere.json"))
    assert missing.exit_code == 2 and (f"the patch spec {tmp_path / 'nowhere.json'} does not "
                                       "exist; pass a spec saved by Retrofit.save_spec"
                                       ) in " ".join(missing.output.split())


def test_a_spec_file_giving_a_key_twice_is_refused_naming_the_flag_file_and_key(cli, spec_file,
                                                                                tmp_path):
    """The second ``tau`` won without a word."""
    twice = tmp_path / "twice.json"
    twice.write_text(spec_file.read_text().replace('"tau":', '"tau": 1, "tau":', 1))
    result = _run(cli, "--spec", str(twice), "--dry-run")
    output = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and f"--spec {twice}: the patch spec gives the key 'tau' " \
                                      "twice in one object" in output, output
