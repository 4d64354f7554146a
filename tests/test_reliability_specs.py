"""The reliability sweep of the calibrated-τ surfaces through the Python API (issue 33's kind of
catalogue, for ``oretrofit.calibrate``, ``read_spec`` / ``apply_spec`` and ``make_regressor(...,
spec=)``): each case gives a correct result or a clear error that names the fix, and a refused
spec leaves the model unpatched. (CLI: tests/cli/test_reliability_calibrate.py; run folders:
tests/regress/test_reliability_variants.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version
import torch
from torch import nn

from oretrofit import Retrofit, RetrofitError, apply_spec, calibrate, read_spec, retrofit
from oretrofit.tabpfn import build_model, load_checkpoint, make_regressor, resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
DEMO_SPEC = ROOT / "results" / "demo-host" / "calibrated" / "spec-full-o.json"


class TwoBranches(nn.Module):
    """Two attention blocks; ``forward`` runs ``a`` only, so ``b`` never sees a carrier."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.MultiheadAttention(8, 2, batch_first=True)
        self.b = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x, x, x)[0]


class OneBranch(nn.Module):
    """:class:`TwoBranches` without ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.MultiheadAttention(8, 2, batch_first=True)


def _batches() -> list[torch.Tensor]:
    return [torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))]


def _calibrated(model: nn.Module, *args, **kwargs) -> dict:
    return calibrate(model, _batches(), *args, exclude=["b"], allow_partial=True, **kwargs)


@pytest.fixture(scope="module")
def demo_spec() -> dict:
    return json.loads(DEMO_SPEC.read_text())


# --- calibrate: δ and q ------------------------------------------------------------------

def test_numpy_and_torch_scalars_are_numbers_like_floats():
    model = TwoBranches()
    want = _calibrated(model, 1e-3, 0.01)["site_tau"]
    assert _calibrated(model, np.float32(1e-3), np.float64(0.01))["site_tau"] == pytest.approx(
        want, rel=1e-6)
    assert _calibrated(model, torch.tensor(1e-3), torch.tensor(0.01))["site_tau"] == pytest.approx(
        want, rel=1e-6)


@pytest.mark.parametrize("delta, quantile, message", [
    (True, 0.01, "delta must be in (0, 1)"), (1e-3, False, "quantile must be in [0, 1)"),
    (torch.tensor([1e-3, 2e-3]), 0.01, "delta must be in (0, 1)"),
    (float("nan"), 0.01, "delta must be in (0, 1)"), (0.0, 0.01, "delta must be in (0, 1)"),
    (1e-3, 1.0, "quantile must be in [0, 1)"), (1e-3, "0.01", "quantile must be in [0, 1)")])
def test_a_bool_or_out_of_range_delta_or_quantile_is_refused(delta, quantile, message):
    with pytest.raises(ValueError) as refused:
        _calibrated(TwoBranches(), delta, quantile)
    assert message in str(refused.value)


def test_a_site_without_carriers_is_named_with_the_fix():
    model = TwoBranches()
    with pytest.raises(RetrofitError, match=r"site 'b' saw no non-zero carrier.*exclude="):
        calibrate(model, _batches(), allow_partial=True)
    with pytest.raises(RetrofitError, match=r"site 'a' saw no non-zero carrier"):
        calibrate(model, [torch.zeros(2, 5, 8)], exclude=["b"], allow_partial=True)
    assert Retrofit.of(model) is None


# --- read_spec: the entries' types -----------------------------------------------------------

@pytest.mark.parametrize("edit, message", [
    ({"site_tau": [1, 2]}, "site_tau must be an object of pattern -> τ"),
    ({"site_tau": {"te.col": "abc"}}, "site_tau['te.col'] must be a positive finite number"),
    ({"site_tau": {"te.col": 0}}, "site_tau['te.col'] must be a positive finite number"),
    ({"site_tau": {"te.col": float("nan")}}, "must be a positive finite number"),
    ({"targets": "icl.*"}, "targets must be a list of site names or patterns"),
    ({"exclude": "icl.*"}, "exclude must be a list"), ({"sites": "te.col"}, "sites must be a list"),
    ({"arm": 1}, "arm must be a string"), ({"tau": "abc"}, "tau must be a positive finite number"),
    ({"eps": True}, "eps must be a finite number ≥ 0"), ({"eps": None}, "eps must be"),
    ({"calibration": "x"}, "calibration record must be an object"),
    ({"calibration": {"data": "x"}}, "calibration record must be an object")])
def test_a_spec_entry_of_the_wrong_type_is_refused_before_patching(demo_spec, edit, message):
    """A string where a list belongs was read letter by letter (``targets: "icl.*"`` patched
    every site, through ``'*'``); a list where an object belongs was an AttributeError."""
    model = build_model(load_checkpoint(resolve_model_path("demo")))[0]
    with pytest.raises(RetrofitError, match="re-create the spec") as refused:
        apply_spec(model, {**demo_spec, **edit})
    assert message in str(refused.value)
    assert Retrofit.of(model) is None


@pytest.mark.parametrize("given", [[1, 2], None, 42])
def test_something_that_is_not_a_spec_is_named(given):
    with pytest.raises(RetrofitError, match="a patch spec is a dict or the path of its JSON"):
        read_spec(given)


@pytest.mark.parametrize("edit, message", [
    ({"site_tua": {"te.col": 1e-3}}, "unknown entry 'site_tua'"),
    ({"calibration": "keep"}, "unknown entry 'calibration.quantil'"),
    ({"targets": []}, "targets is an empty list"),
    ({"uncovered": ["te.col"]}, "list of uncovered modules is ['te.col'], applying it here "
                                "gives []")])
def test_an_entry_no_check_reads_or_that_misstates_the_model_is_refused(demo_spec, edit, message):
    """An unknown entry, ``targets: []`` (read as no filter: every site patched) and an
    ``uncovered`` list the model does not give were all applied without a word."""
    if edit == {"calibration": "keep"}:
        edit = {"calibration": {**demo_spec["calibration"], "quantil": 0.5}}
    model = build_model(load_checkpoint(resolve_model_path("demo")))[0]
    with pytest.raises(RetrofitError, match="(?i)re-create") as refused:
        apply_spec(model, {**demo_spec, **edit})
    assert message in str(refused.value)
    assert Retrofit.of(model) is None


def test_a_patched_artifacts_own_entries_are_known(demo_spec):
    spec = {**demo_spec, "source_checkpoint_sha256": "0" * 64, "weights": "demo"}
    assert read_spec(spec) is spec


@pytest.mark.parametrize("text, message", [
    ('{"tau": 1e-8, "tau": 1e-3}', "gives the key 'tau' twice in one object"),
    ('{"calibration": ' * 40 + "null" + "}" * 40, "nests objects or lists more than 32 levels "
                                                   "deep, below ['calibration']['calibration']"),
    ("[" * 100_000 + "]" * 100_000, "deeper than Python's JSON parser follows"),
    ("{", "the patch spec is not valid JSON (line 1, column 2: Expecting property name")])
def test_spec_json_with_a_key_twice_or_nested_too_deep_is_refused(tmp_path, text, message):
    """A key given twice kept the last; deep nesting was a RecursionError."""
    path = tmp_path / "spec.json"
    path.write_text(text)
    with pytest.raises(RetrofitError, match=r"re-create the spec") as refused:
        read_spec(path)
    assert message in str(refused.value)


# --- apply_spec: the model the spec was made for --------------------------------------------

def test_a_calibrated_spec_is_refused_on_other_weights_and_fits_its_own():
    model = TwoBranches()
    spec = _calibrated(model)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.a.out_proj.weight[0, 0] += 1e-3
    with pytest.raises(RetrofitError, match="calibrated on other weights"):
        apply_spec(other, spec)
    assert Retrofit.of(other) is None
    apply_spec(model, spec).revert()
    apply_spec(model.double(), spec).revert()        # the same weights in float64 fit


def test_a_spec_of_another_host_names_both_hosts(demo_spec):
    with pytest.raises(RetrofitError, match="made for host 'tabpfn-v3', but this TwoBranches is "
                                            "patched by host 'torch.nn'.*re-create it"):
        apply_spec(TwoBranches(), demo_spec)


def test_a_spec_of_another_model_of_the_same_host_says_so():
    spec = retrofit(TwoBranches(), "full-o", site_tau={"b": 1e-3}).spec()
    with pytest.raises(RetrofitError, match="does not apply to this OneBranch.*re-create it"):
        apply_spec(OneBranch(), spec)


def test_make_regressor_applies_the_calibrated_demo_spec_and_refuses_it_for_another_host(
        demo_spec):
    _, applied = make_regressor("demo", spec=demo_spec)
    assert applied.plan.site_tau == demo_spec["site_tau"]
    with pytest.raises(RetrofitError, match="calibrated on the checkpoint with SHA-256"):
        make_regressor("random", spec=demo_spec)


# --- apply_spec: versions are provenance, sites are what must match ------------------------

class Branches(TwoBranches):
    """:class:`TwoBranches` with ``b`` of another width or attention class."""

    def __init__(self, width: int = 8, attention: type = nn.MultiheadAttention) -> None:
        super().__init__()
        self.b = attention(width, 2, batch_first=True)


class CountingAttention(nn.MultiheadAttention):
    """A user's attention class (the host's own forward, so the host covers it)."""


def _releases_after(version: str) -> list[str]:
    """The next patch and the next minor release after ``version``."""
    major, minor, patch = Version(version).release[:3]
    return [f"{major}.{minor}.{patch + 1}", f"{major}.{minor + 1}.0"]


@pytest.mark.parametrize("release", _releases_after(torch.__version__))
def test_a_spec_recorded_under_another_release_applies_when_its_sites_match(release):
    model = TwoBranches()
    spec = retrofit(model, "full-o").spec()
    Retrofit.of(model).revert()
    recorded = {**spec, "oretrofit": "0.0.1", "host_versions": {"torch": release}}
    applied = apply_spec(model, recorded)
    assert applied.spec()["sites"] == ["a", "b"]
    assert applied.spec()["host_versions"] == spec["host_versions"]     # this install's, recorded


@pytest.mark.parametrize("model, edit, message", [
    (OneBranch, {}, r"its site list is '2 sites, 1 unknown: b'"),
    (TwoBranches, {"kind": "ffn"}, r"its site 'b' is of kind 'ffn' in the spec, 'attention' here"),
    (lambda: Branches(attention=CountingAttention), {},
     r"its site 'b' has the module b of class MultiheadAttention in the spec, of class "
     r"CountingAttention here"),
    (lambda: Branches(width=16), {},
     r"its site 'b' has the weight b\.in_proj_weight of shape 24x8 in the spec, of shape 48x16 "
     r"here")], ids=["site missing", "another kind", "another class", "another shape"])
def test_a_spec_whose_site_differs_from_the_models_is_refused_naming_it(model, edit, message):
    spec = retrofit(TwoBranches(), "full-o").spec()
    records = {**spec["site_modules"], "b": {**spec["site_modules"]["b"], **edit}}
    target = model()
    with pytest.raises(RetrofitError, match=message + r".*Re-create the spec from this model"):
        apply_spec(target, {**spec, "site_modules": records})
    assert Retrofit.of(target) is None


def test_a_spec_of_schema_1_is_checked_by_its_site_names(demo_spec):
    """A spec saved before site records existed still applies (the calibrated demo spec)."""
    assert demo_spec["schema_version"] == 1 and "site_modules" not in demo_spec
    model = build_model(load_checkpoint(resolve_model_path("demo")))[0]
    applied = apply_spec(model, demo_spec)
    assert list(applied.spec()["site_modules"]) == demo_spec["sites"]
    applied.revert()
    with pytest.raises(RetrofitError, match="the patch spec lacks site_modules"):
        apply_spec(model, {**demo_spec, "schema_version": 2})
