"""``calibrate_tabpfn`` on random hosts of other model versions: a v3.5 model used as a
regressor leaves the classifier's head sites out by itself (recorded in the spec); a v2.5 host
calibrates every site."""

from __future__ import annotations

import importlib.util

import pytest

from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn.checkpoints import write_random_checkpoint
from oretrofit.regress.calibrate import calibrate_tabpfn
from oretrofit.regress.data import load_dataset
from oretrofit.regress.protocol import SplitProtocol

SMALL = SplitProtocol(max_train=40, max_test=8)


def _spec(tmp_path, version: str) -> dict | None:
    """The calibrated spec, or None where the installed tabpfn ships no ``version`` (after
    checking that the host refuses it naming the release that does)."""
    if importlib.util.find_spec(f"tabpfn.architectures.tabpfn_{version.replace('.', '_')}") \
            is None:
        with pytest.raises(RetrofitError, match=f"TabPFN {version} ships from tabpfn"):
            write_random_checkpoint(tmp_path / f"tabpfn-{version}-random.ckpt", "small",
                                    version=version)
        return None
    path = write_random_checkpoint(tmp_path / f"tabpfn-{version}-random.ckpt", "small",
                                   version=version)
    return calibrate_tabpfn(path, [load_dataset("sklearn:diabetes")], [11], protocol=SMALL)


def test_v3_5_regressor_leaves_the_classifier_head_out(tmp_path):
    spec = _spec(tmp_path, "v3.5")
    if spec is None:                                # tabpfn 8.x: refused, checked above
        return
    other = ["head.cls.norm", "head.cls.ffn", "dec"]
    assert spec["calibration"]["data"]["task"] == "regressor"
    assert spec["calibration"]["data"]["other_task_sites"] == other
    assert spec["exclude"] == other
    assert not set(other) & set(spec["sites"]) and {"head.reg.norm", "head.reg.ffn"} <= set(
        spec["sites"])
    assert set(spec["site_tau"]) == set(spec["sites"])


def test_v2_5_calibrates_every_site(tmp_path):
    spec = _spec(tmp_path, "v2.5")
    assert spec["calibration"]["data"]["other_task_sites"] == [] and not spec["exclude"]
    assert set(spec["site_tau"]) == set(spec["sites"]) and "blk.0.col" in spec["sites"]
    assert spec["host_versions"]["architecture"] == "tabpfn_v2_5"
