"""The paper's contracts checked together on one transformers model, each against its limit
(:data:`LIMITS`): what ``oretrofit check`` prints and :func:`oretrofit.transformers.check` returns.

    τ→0 agreement     every hidden state patched at τ = ε = 1e-12 vs unpatched, per arm
                      (relative max difference ≤ 1e-4); revert() bit-identical; state_dict keys
                      unchanged
    null insertion    2 zero carriers inserted (old position ids kept) under the arm at τ:
                      old states' drift ≤ 1e-4, inserted states exactly 0 in every layer
    mask-free padding right zero padding with no attention mask vs each sequence alone (≤ 1e-4;
                      models with token ids only)
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

from torch import nn

from .contracts import agreement, example_inputs, null_insertion, padding_delta

__all__ = ["LIMITS", "check", "failed"]

LIMITS = {"agreement": 1e-4, "drift": 1e-4, "padding": 1e-4}


@contextlib.contextmanager
def _patched(model: nn.Module, arm: str, tau: float, spec: Mapping[str, Any] | None
             ) -> Iterator[Any]:
    """``model`` under ``spec`` (checked against it by :func:`oretrofit.apply_spec`), or under
    ``arm`` at ``tau``; reverted on exit."""
    from ..._surgery.registry import apply_spec, retrofit
    applied = apply_spec(model, spec) if spec is not None else retrofit(model, arm, tau)
    try:
        yield applied
    finally:
        applied.revert()


def failed(summary: Mapping[str, Any]) -> list[str]:
    """The contracts a :func:`check` summary shows broken, by name (empty when all hold)."""
    broken = []
    for a in summary["agreement"]:
        if not a["relative_max_diff"] <= LIMITS["agreement"]:
            broken.append(f"τ→0 agreement ({a['arm']}: relative difference "
                          f"{a['relative_max_diff']:.3g} > {LIMITS['agreement']:g})")
        if not (a["revert_bit_identical"] and a["state_dict_keys_unchanged"]):
            broken.append(f"exact revert ({a['arm']}: revert() not bit-identical or the "
                          "state_dict keys changed)")
    inserted = summary["null_insertion"]
    if inserted["inserted_max_abs"] != 0:
        broken.append(f"null insertion (inserted states not exactly 0: max |h| "
                      f"{inserted['inserted_max_abs']:.3g})")
    if not inserted["old_max_delta"] <= LIMITS["drift"]:
        broken.append(f"null insertion (old states drift by {inserted['old_max_delta']:.3g} > "
                      f"{LIMITS['drift']:g})")
    padding = summary["padding_max_delta"]
    if padding is not None and not padding <= LIMITS["padding"]:
        broken.append(f"mask-free padding (difference {padding:.3g} > {LIMITS['padding']:g})")
    return broken


def check(model: nn.Module, arms: Sequence[str] = ("oa", "full-o"), tau: float | None = 1e-6,
          spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Measure every contract on ``model`` (example inputs of 2 × 12 tokens; padding batches the
    first row with the second's first 7 tokens); ``holds`` is True
    when all are within :data:`LIMITS`, ``failed`` names those that are not (:func:`failed`).

    Null insertion and padding run under ``full-o`` at ``tau`` (the last of ``arms`` when it is
    not among them), or under ``spec`` (a patch spec: each site at its own τ; its arm is then the
    one agreement is measured for). The model is left as it was given.
    """
    if spec is not None:
        if spec["arm"] == "base":
            raise ValueError("the spec has arm 'base': it patches nothing, so there is nothing "
                             "to check; pass a spec of arm oa or full-o")
        arms = [spec["arm"]]
    inputs = example_inputs(model, batch=2, tokens=12)
    insertion_arm = "full-o" if "full-o" in arms else arms[-1]
    sequences = ([inputs["input_ids"][0].tolist(), inputs["input_ids"][1, :7].tolist()]
                 if "input_ids" in inputs else [])
    # first, so a spec that does not fit (apply_spec checks host, sites and weights) is refused
    # before anything is measured
    with _patched(model, insertion_arm, tau, spec) as applied:
        inserted = null_insertion(model, inputs)
        padding = padding_delta(model, sequences) if sequences else None
        host = applied.plan.host
    summary = {"host": host, "insertion_arm": insertion_arm,
               "agreement": [agreement(model, inputs, arm) for arm in arms],
               "null_insertion": inserted,
               "null_insertion_unpatched": null_insertion(model, inputs),
               "padding_max_delta": padding, "limits": LIMITS}
    broken = failed(summary)
    return {**summary, "holds": not broken, "failed": broken}
