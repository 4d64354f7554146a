"""The reliability sweep of `regress --tau-spec/--ablate-sites` and of `tables` on folders with
variants: a bad spec is refused by its path before anything is written, a spec made on other
weights is refused, and a run.json whose variants were edited (removed, retyped, renamed, a δ
changed) is refused by `tables` and by a resumed run, naming the file and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from typer.testing import CliRunner

from oretrofit.cli.app import app
from oretrofit.regress import RunFolder, RunMismatch, render

ROOT = Path(__file__).resolve().parents[2]
CALIBRATED = ROOT / "results" / "demo-host" / "calibrated"
SPEC = json.loads((CALIBRATED / "spec-full-o.json").read_text())
KEY = "full-o/calibrated-d0.001-q0.01"


def _regress(out: Path, *extra: object):
    args = ["regress", "--datasets", "sklearn:diabetes", "--seeds", "11", "--arms",
            "base,full-o", "--model-path", "demo", "--max-train", "16", "--max-test", "8",
            "--no-plots", "--out", out, *extra]
    return CliRunner().invoke(app, [str(a) for a in args])


def _calibration(**change: Any) -> dict:
    return {"calibration": {**SPEC["calibration"], **change}}


@pytest.mark.parametrize("edit, message", [
    ({"schema_version": 3}, "the patch spec has schema_version 3, not one this oretrofit reads"),
    ({"site_tau": {**SPEC["site_tau"], "te.col": "abc"}},
     "site_tau['te.col'] must be a positive finite number, got 'abc'"),
    ({"site_tau": [1]}, "site_tau must be an object"),
    ({"tau": "abc"}, "tau must be a positive finite number"),
    ({"eps": None}, "eps must be a finite number ≥ 0"),
    (_calibration(delta=None), "calibration record's delta must be a number in (0, 1)"),
    (_calibration(delta="abc"), "calibration record's delta must be a number in (0, 1)"),
    (_calibration(quantile=1.5), "calibration record's quantile must be a number in [0, 1)")])
def test_a_bad_tau_spec_is_refused_by_its_path_before_anything_is_written(tmp_path, edit,
                                                                          message):
    """Each was a traceback, a bare `could not convert string to float`, or (schema_version 3)
    run as if it were a spec this version reads."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, **edit}))
    out = tmp_path / "run"
    result = _regress(out, "--tau-spec", spec)
    assert result.exit_code == 2 and f"--tau-spec {spec}: " in result.stderr, result.stderr
    assert message in result.stderr and "re-create" in result.stderr
    assert not out.exists()


def test_a_tau_spec_calibrated_on_other_weights_is_refused(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, **_calibration(weights_sha256="0" * 64)}))
    result = _regress(tmp_path / "run", "--tau-spec", spec)
    assert result.exit_code == 2
    assert f"variant {KEY} was calibrated on other weights (SHA-256 000000000000…)" in \
        result.stderr and "calibrate on this run's checkpoint" in result.stderr
    assert not (tmp_path / "run" / "run.json").exists()


def _variants(change: Callable[[dict], Any]) -> Callable[[dict], None]:
    return lambda manifest: change(manifest["variants"])


EDITS = {
    "removed": (lambda m: m.pop("variants"), "its run.json defines no such variant"),
    "a list": (lambda m: m.__setitem__("variants", [1]), "variants must be an object"),
    "record a string": (_variants(lambda v: v.__setitem__(KEY, "x")), "must be an object"),
    "kind unknown": (_variants(lambda v: v[KEY].__setitem__("kind", "weird")),
                     "its kind 'weird' is none of calibrated, ablation, spec"),
    "site_tau removed": (_variants(lambda v: v[KEY].pop("site_tau")), "lacks site_tau"),
    "site_tau a string": (_variants(lambda v: v[KEY].__setitem__("site_tau", {"te.col": "x"})),
                          "site_tau['te.col'] must be a positive finite number"),
    "delta changed": (_variants(lambda v: v[KEY].__setitem__("delta", 0.5)),
                      "its record defines variant calibrated-d0.5-q0.01, not "
                      "calibrated-d0.001-q0.01"),
    "renamed": (_variants(lambda v: v.__setitem__("full-o/other", v.pop(KEY))),
                "its record defines variant calibrated-d0.001-q0.01, not other"),
    "arm changed": (_variants(lambda v: v[KEY].__setitem__("arm", "oa")),
                    "its record names arm 'oa'"),
}


@pytest.mark.parametrize("label", EDITS)
def test_tables_and_a_resumed_run_refuse_an_edited_variant_record(tmp_path, label):
    """Each was a TypeError, or a table rendered under a name its record no longer defines."""
    folder = tmp_path / "run"
    shutil.copytree(CALIBRATED / "run", folder, ignore=shutil.ignore_patterns("tables"))
    edit, message = EDITS[label]
    manifest = json.loads((folder / "run.json").read_text())
    edit(manifest)
    (folder / "run.json").write_text(json.dumps(manifest))
    with pytest.raises(RunMismatch) as refused:
        render([folder], tmp_path / "tables", plots=False)
    assert message in str(refused.value)
    assert "restore" in str(refused.value) and "new --out folder" in str(refused.value)
    assert not (tmp_path / "tables").exists()
    if label != "removed":                        # a removed record is bound again on resume
        with pytest.raises(RunMismatch, match="restore it or re-run into a new --out folder"):
            RunFolder(folder).bind_variants({KEY: {}})
    result = CliRunner().invoke(app, ["tables", str(folder), "--no-plots"])
    assert result.exit_code == 2 and message in result.stderr


def test_the_committed_folders_variant_records_pass_the_check(tmp_path):
    for name in ("run", "ablation"):
        assert RunFolder(CALIBRATED / name).variants()
        render([CALIBRATED / name], tmp_path / name, plots=False)
