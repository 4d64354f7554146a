"""scripts/transformers_census_report.py: every text or vision type that does not pass is put
in a named family, and the by-design bound is the share left once those families are out."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "transformers_census_report", _ROOT / "scripts" / "transformers_census_report.py")
report = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(report)


def test_every_committed_text_or_vision_type_that_does_not_pass_has_a_named_family() -> None:
    records = json.loads((_ROOT / "results" / "transformers-census.json").read_text())
    unnamed = [t for t, r in records["architectures"].items()
               if r.get("category") in report.TARGET
               and r["status"] not in ("passes", "not buildable")
               and report.family_of(r) is report.OTHER]
    assert not unnamed, f"add a family for these reasons: {unnamed}"


def _record(model_type: str, status: str, reason: str = "", attention: bool = True) -> dict:
    return {"model_type": model_type, "category": "vision", "status": status, "reason": reason,
            "softmax_attention": attention}


def test_the_bound_counts_out_only_the_by_design_families() -> None:
    receipt = {"transformers": "5.24.0", "torch": "2.13.0", "seed": 0, "date": "2026-12-04",
               "tau_agreement": 1e-12, "eps_agreement": 1e-30, "tau_null_insertion": 1e-6,
               "tolerance": 1e-4, "architectures": {r["model_type"]: r for r in [
                   _record("a", "passes"),
                   _record("b", "refused", "no attention here", attention=False),
                   _record("c", "refused", "x (layout '2-D token grid'): …"),
                   _record("d", "refused", "D is only partly covered: …"),
                   _record("e", "unchecked", "the example inputs do not run it: …")]}}
    assert [report.family_of(r).by_design for r in receipt["architectures"].values()] == [
        False, True, True, False, False]
    text = report.census_markdown(receipt)
    assert "**1 of 5 (20 %)**" in text
    assert "refused by design: **2**, so no host reaches more than **3 of 5 (60 %)**" in text
    assert "host: inputs the census cannot build yet: **1** (`e`)" in text
