"""`oretrofit regress --host`: each family's regressor in the runner, a family that does not
import refused by name, and the table across hosts generated from run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from oretrofit.cli.app import app
from oretrofit.regress import families
from oretrofit.regress.store import read_cells

import tabicl  # noqa: E402,F401  (the `tabicl` extra, in `all`)
from oretrofit.tabicl import write_random_checkpoint  # noqa: E402

SMALL = ["--datasets", "sklearn:diabetes", "--seeds", "11", "--max-train", "32",
         "--max-test", "16", "--no-plots", "--tau", "1e-08"]


def _regress(*args: object):
    return CliRunner().invoke(app, ["regress", *map(str, args)])


@pytest.fixture(scope="module")
def tabicl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tabicl")
    checkpoint = write_random_checkpoint(root / "regressor.ckpt", "regressor", seed=3)
    out = root / "run"
    result = _regress("--host", "tabicl", "--model-path", checkpoint, "--out", out, "--json",
                      *SMALL)
    assert result.exit_code == 0, result.output
    return out


def test_regress_host_tabicl_runs_every_arm_end_to_end(tabicl_run: Path):
    settings, _, cells = read_cells([tabicl_run])
    assert settings["host"] == "tabicl"
    assert sorted(c["arm"] for c in cells) == ["base", "full-o", "oa"]
    assert all(c["rmse"] > 0 and c["n_train"] == 32 and c["n_test"] == 16 for c in cells)
    assert all(c["sites_patched"] > 0 for c in cells if c["arm"] != "base")
    rmse = {c["arm"]: c["rmse"] for c in cells}
    assert abs(rmse["full-o"] - rmse["base"]) <= 1e-5 * rmse["base"]     # τ → 0: the host
    tables = (tabicl_run / "tables" / "tables.md").read_text()
    assert "Table 2 layout" in tables and "Table 7 layout" in tables


def test_a_family_without_its_package_is_refused_by_name_with_the_fix(monkeypatch):
    real = families.importlib.import_module

    def missing(name: str):
        if name == "tabdpt":
            raise ImportError("cannot import name 'x' from 'huggingface_hub'")
        return real(name)
    monkeypatch.setattr(families.importlib, "import_module", missing)
    result = _regress("--host", "tabdpt", "--model-path", "x.safetensors", *SMALL)
    assert result.exit_code != 0
    assert "--host tabdpt needs the tabdpt package" in result.output
    assert "environment with it" in result.output


def test_settings_a_family_has_no_argument_for_are_refused():
    with pytest.raises(ValueError, match="--inference-precision is TabPFN's"):
        families.vendor_kwargs("tabicl", {"inference_precision": torch.float16}, seed=1)
    assert families.vendor_kwargs("tabicl", {"n_estimators": 2, "device": "cpu"}, seed=7) == (
        {"n_estimators": 2, "device": "cpu", "random_state": 7}, {})
    assert families.vendor_kwargs("tabdpt", {"n_estimators": 2, "device": "cpu"}, seed=7) == (
        {"device": "cpu"}, {"n_ensembles": 2, "seed": 7})
    assert families.vendor_kwargs("mitra", {"n_estimators": 2, "device": "cpu"}, seed=7) == (
        {"n_estimators": 2, "device": "cpu", "seed": 7}, {})
    with pytest.raises(ValueError, match=r"--host mitra runs at its own \(bfloat16 autocast"):
        families.vendor_kwargs("mitra", {"inference_precision": torch.float16}, seed=1)
    with pytest.raises(ValueError, match="needs --model-path FILE"):
        families.checkpoint_file("tabicl", "demo")


def test_a_mitra_checkpoint_is_a_directory_digested_by_its_weights_file(tmp_path: Path):
    with pytest.raises(ValueError, match=r"--host mitra needs --model-path DIR, a checkpoint "
                                         r"directory in the vendor's format \(config.json and "
                                         r"model.safetensors"):
        families.checkpoint_file("mitra", str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    assert families.checkpoint_file("mitra", str(tmp_path)) == tmp_path
    assert families.weights_file("mitra", tmp_path) == tmp_path / "model.safetensors"
    assert families.weights_file("tabicl", tmp_path / "x.ckpt") == tmp_path / "x.ckpt"


def test_mitra_without_autogluon_is_refused_naming_its_own_environment():
    """This environment has no autogluon (it pins pandas<2.4): ``make test-mitra`` has one."""
    with pytest.raises(ValueError, match=r"--host mitra needs the autogluon\.tabular\.models\."
                                         r"mitra\.sklearn_interface package.*pip install "
                                         r"'autogluon\.tabular\[mitra\]==1\.6\.3', in its own "
                                         r"environment: autogluon pins pandas<2\.4; `make "
                                         r"test-mitra` builds one\)"):
        families.check_host("mitra")
