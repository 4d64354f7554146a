"""`oretrofit regress`, `reproduce` and `tables` through the real command line app."""

from __future__ import annotations

import json
from pathlib import Path

import openml
import pandas as pd
import pytest
import requests
from typer.testing import CliRunner

from oretrofit._files.provenance import portable
from oretrofit.cli.app import app
from oretrofit.regress.reference import PAPER_DATASETS
from oretrofit.tabpfn import write_random_checkpoint

from .conftest import write_openml_cache

CAPS = ["--max-train", "32", "--max-test", "16"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ckpt") / "tabpfn-v3-random-cli.ckpt"
    return str(write_random_checkpoint(path, "small", seed=5))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise requests.ConnectionError("network disabled in tests")
    monkeypatch.setattr(openml._api_calls, "_send_request", refuse)


def _invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_regress_json_then_tables(checkpoint, openml_cache, tmp_path):
    pd.DataFrame({"a": range(40), "b": [i % 7 for i in range(40)],
                  "y": [0.5 * i for i in range(40)]}).to_csv(tmp_path / "t.csv", index=False)
    out = tmp_path / "run"
    result = _invoke("regress", "--datasets", "42", "--data", tmp_path / "t.csv",
                     "--target-column", "y",
                     "--seeds", "11", "--arms", "base,oa", "--tau", "1",
                     "--model-path", checkpoint, "--openml-cache", openml_cache, "--out", out,
                     "--no-plots", "--json", *CAPS)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)                         # exactly one JSON object
    assert summary["schema_version"] == 1 and summary["cells_run"] == 4
    assert {r["dataset"] for r in summary["rows"]} >= {"openml:42", f"file:{tmp_path}/t.csv#y"}
    assert summary["settings"]["protocol"]["max_train"] == 32
    tables = _invoke("tables", out, "--no-plots")
    assert tables.exit_code == 0 and "τ = 1: means over seeds (Table 2 layout)" in tables.stdout
    assert json.loads(_invoke("tables", out, "--json", "--no-plots").stdout)["folders"] == [
        str(out)]


def test_reproduce_runs_the_paper_preset_from_an_openml_cache(checkpoint, tmp_path):
    cache = write_openml_cache(tmp_path / "cache", tuple(PAPER_DATASETS))
    result = _invoke("reproduce", "table2", "--model-path", checkpoint, "--openml-cache", cache,
                     "--out", tmp_path / "run", "--shard", "1/27", "--json", "--no-plots", *CAPS)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["cells_in_shard"], summary["cells_run"]) == (2, 2)   # 54 cells / 27 shards
    cells = [json.loads(p.read_text()) for p in (tmp_path / "run" / "cells").glob("*.json")]
    assert {(c["dataset"], c["seed"], c["arm"]) for c in cells} == {   # cells 0 and 27
        ("openml:560", 11, "base"), ("openml:507", 11, "base")}
    datasets = list((tmp_path / "run" / "datasets").glob("*.json"))
    assert len(datasets) == 6                                   # every dataset checksummed


def test_reproduce_names_missing_datasets_and_records_standins(checkpoint, tmp_path):
    result = _invoke("reproduce", "table7", "--model-path", checkpoint,
                     "--openml-cache", tmp_path / "empty", "--offline-standins",
                     "--out", tmp_path / "run", *CAPS)
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "4 of 6 datasets are missing" in err
    for did in (505, 507, 227, 189):
        assert f"OpenML dataset {did} ({PAPER_DATASETS[did]})" in err
    assert "OpenML dataset 560" not in err and "OpenML dataset 44959" not in err
    assert "--openml-cache" in err and not (tmp_path / "run" / "cells").exists()
    result = _invoke("regress", "--datasets", "560,44959", "--offline-standins", "--seeds", "11",
                     "--arms", "base", "--model-path", checkpoint, "--out", tmp_path / "run",
                     "--no-plots", *CAPS)
    assert result.exit_code == 0, result.stderr
    assert "bodyfat (faraway) †" in result.stdout and "stand-in for openml:44959" in result.stdout
    receipts = {r["spec"]: r for r in (json.loads(p.read_text())
                                       for p in (tmp_path / "run" / "datasets").glob("*.json"))}
    assert receipts["openml:560"]["source"]["loaded_spec"] == "faraway:fat"
    assert receipts["openml:44959"]["source"]["standin_for"] == "openml:44959"
    invocation = json.loads(next((tmp_path / "run" / "invocations").glob("*.json")).read_text())
    assert invocation["standins"]["openml:560"] == "faraway:fat"
    # the record names the checkpoint as portable() does: the temp folder, not its place
    assert invocation["model"]["checkpoint"] == invocation["model"]["model_path"] == portable(Path(checkpoint))
    assert invocation["model"]["checkpoint"].startswith("<tmp>/")


def test_reproduce_over_a_chosen_dataset_list_keeps_the_preset_grid(checkpoint, tmp_path):
    result = _invoke("reproduce", "table7", "--datasets", "560,sklearn:diabetes", "--offline-standins",
                     "--model-path", checkpoint, "--out", tmp_path / "run", "--shard", "1/9",
                     "--json", "--no-plots", *CAPS)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["cells_in_shard"], summary["cells_run"]) == (2, 2)   # 2 × 3 seeds × 3 arms / 9
    invocation = json.loads(next((tmp_path / "run" / "invocations").glob("*.json")).read_text())
    assert invocation["matrix"] == {"datasets": ["openml:560", "sklearn:diabetes"],
                                    "seeds": [11, 23, 37], "arms": ["base", "oa", "full-o"],
                                    "taus": [1.0], "variants": []}


def test_bad_options_fail_with_a_message(checkpoint, tmp_path):
    result = _invoke("regress", "--datasets", "sklearn:diabetes", "--arms", "base,xx",
                     "--model-path", checkpoint, "--out", tmp_path / "run")
    assert result.exit_code == 2 and "unknown arm(s) xx" in result.stderr
    result = _invoke("reproduce", "table9", "--model-path", checkpoint)
    assert result.exit_code == 2 and "No such command 'table9'" in result.stderr  # table2|table7 only
    result = _invoke("tables", tmp_path / "nothing")
    assert result.exit_code == 2 and "not a regression run folder" in result.stderr
