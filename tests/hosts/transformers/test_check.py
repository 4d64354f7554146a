"""The contracts checked together (oretrofit/hosts/transformers/check.py): all hold on a model the
host covers, and a broken contract is named."""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from oretrofit.hosts.transformers import check as checks  # noqa: E402
from oretrofit.transformers import check  # noqa: E402
from hosts.transformers import zoo  # noqa: E402

BERT = next(a for a in zoo.ARCHITECTURES if a.model_type == "bert")


def test_every_contract_holds_on_a_covered_model_and_it_is_left_as_given():
    model = zoo.build(BERT)
    before, implementation = ({k: v.clone() for k, v in model.state_dict().items()},
                              model.config._attn_implementation)
    summary = check(model)
    assert summary["holds"] and summary["failed"] == [], summary["failed"]
    assert [a["arm"] for a in summary["agreement"]] == ["oa", "full-o"]
    assert summary["null_insertion"]["inserted_max_abs"] == 0
    assert summary["padding_max_delta"] is not None
    assert summary["padding_max_delta"] <= checks.LIMITS["padding"]
    assert model.config._attn_implementation == implementation
    assert not [m for m in model.modules() if type(m).__module__ == "oretrofit._surgery.patching"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("broken, named", [
    ({"relative_max_diff": 0.5}, r"τ→0 agreement \(oa: relative difference 0\.5 > 0\.0001\)"),
    ({"revert_bit_identical": False}, r"exact revert \(oa: "),
])
def test_a_broken_agreement_or_revert_is_named(monkeypatch, broken, named):
    measured = checks.agreement

    def agreement(model, inputs, arm):
        found = measured(model, inputs, arm)
        return {**found, **broken} if arm == "oa" else found

    monkeypatch.setattr(checks, "agreement", agreement)
    summary = check(zoo.build(BERT))
    assert not summary["holds"] and len(summary["failed"]) == 1
    assert re.match(named, summary["failed"][0]), summary["failed"]
