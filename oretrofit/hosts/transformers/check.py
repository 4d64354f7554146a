"""The paper's contracts and the model's answers, measured on one transformers model at the
settings the user runs (an arm at τ and ε, by default the library's own defaults, or a patch
spec), each against its limit (:data:`LIMITS`): what ``oretrofit check`` prints and
:func:`oretrofit.transformers.check` returns.

    agreement         every hidden state patched vs unpatched, per arm (relative max
                      difference ≤ 1e-4); revert() bit-identical; state_dict keys unchanged
    null insertion    2 zero carriers inserted (old position ids kept): old states' drift
                      ≤ 1e-4, inserted states exactly 0 in every layer
    mask-free padding right zero padding with no attention mask vs each sequence alone (≤ 1e-4;
                      models with token ids only)
    answers           with a tokenizer (:mod:`.answers`): greedy continuations unchanged and
                      logits within 1e-3, or sentence embeddings' cosine ≥ 0.999999; when they
                      move, the sites that move them most are named
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from torch import nn

from .answers import (CHAT_PROMPTS, COSINE_LIMIT, LOGIT_LIMIT, NEW_TOKENS, Answers,
                      compare_answers, reference_answers, site_deviations)
from .contracts import agreement, example_inputs, null_insertion, padding_delta
from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT

__all__ = ["LIMITS", "Setting", "check", "failed"]

LIMITS = {"agreement": 1e-4, "drift": 1e-4, "padding": 1e-4, "logits": LOGIT_LIMIT,
          "cosine": COSINE_LIMIT}


@dataclass(frozen=True)
class Setting:
    """What the user runs: ``arm`` at ``tau`` and ``eps``, or ``spec`` (a patch spec: its arm
    and ε, each site at its own τ)."""

    arm: str
    tau: float
    eps: float
    spec: Mapping[str, Any] | None = None

    @contextlib.contextmanager
    def patched(self, model: nn.Module) -> Iterator[Any]:
        """``model`` under this setting (a spec checked against it by
        :func:`oretrofit.apply_spec`); reverted on exit."""
        from ..._surgery.registry import apply_spec, retrofit
        applied = (apply_spec(model, self.spec) if self.spec is not None
                   else retrofit(model, self.arm, self.tau, eps=self.eps))
        try:
            yield applied
        finally:
            applied.revert()


def settings(arm: str | None, tau: float | None, eps: float | None,
             spec: Mapping[str, Any] | None) -> list[Setting]:
    """One :class:`Setting` per arm measured: the spec's, ``arm``, or ``oa`` and ``full-o``;
    τ and ε not given are a retrofit's own defaults, ``TAU_RETROFIT`` and ``EPS_RETROFIT``
    (0: the limit ε → 0⁺)."""
    if spec is not None:
        if arm is not None or tau is not None or eps is not None:
            raise ValueError("a spec sets the arm, τ and ε itself; pass either spec or "
                             "arm / tau / eps")
        if spec["arm"] == "base":
            raise ValueError("the spec has arm 'base': it patches nothing, so there is nothing "
                             "to check; pass a spec of arm oa or full-o")
        return [Setting(spec["arm"], spec["tau"], spec["eps"], spec)]
    tau = TAU_RETROFIT if tau is None else tau
    eps = EPS_RETROFIT if eps is None else eps
    return [Setting(a, tau, eps) for a in ([arm] if arm is not None else ["oa", "full-o"])]


def _require_transformers_model(model: nn.Module) -> None:
    """Refuse a model that is no transformers model (a plain ``nn.Module`` around one): its
    inputs are not known, so nothing can be measured on it; name the model inside to pass."""
    from transformers import PreTrainedModel
    if isinstance(model, PreTrainedModel):
        return
    inside = [name for name, m in model.named_modules() if isinstance(m, PreTrainedModel)]
    fix = (f"call check(model.{inside[0]}) on the transformers model inside it" if inside
           else "pass a transformers model (a PreTrainedModel)")
    raise ValueError(f"check measures a transformers model, whose config names its inputs; "
                     f"{type(model).__name__} is no PreTrainedModel, so its inputs are "
                     f"unknown: {fix}")


def _sites_named(rows: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{r['site']} ({r['deviation']:.3g})" for r in rows) or "none measured"


def failed(summary: Mapping[str, Any]) -> list[str]:
    """The contracts a :func:`check` summary shows broken, by name (empty when all hold)."""
    broken = []
    for a in summary["agreement"]:
        if not a["relative_max_diff"] <= LIMITS["agreement"]:
            broken.append(f"agreement ({a['arm']}: relative difference "
                          f"{a['relative_max_diff']:.3g} > {LIMITS['agreement']:g})")
        if not (a["revert_bit_identical"] and a["state_dict_keys_unchanged"]):
            broken.append(f"exact revert ({a['arm']}: revert() not bit-identical or the "
                          "state_dict keys changed)")
    inserted = summary["null_insertion"]
    if "not_defined" not in inserted:
        if inserted["inserted_max_abs"] != 0:
            broken.append(f"null insertion (inserted states not exactly 0: max |h| "
                          f"{inserted['inserted_max_abs']:.3g})")
        if not inserted["old_max_delta"] <= LIMITS["drift"]:
            broken.append(f"null insertion (old states drift by {inserted['old_max_delta']:.3g}"
                          f" > {LIMITS['drift']:g})")
    padding = summary["padding_max_delta"]
    if padding is not None and not padding <= LIMITS["padding"]:
        broken.append(f"mask-free padding (difference {padding:.3g} > {LIMITS['padding']:g})")
    answers = summary["answers"]
    for a in answers["arms"] if answers else ():
        if not _keeps_answers(a):
            moved = (f"min cosine {a['min_cosine']:.7f} < {LIMITS['cosine']:g}"
                     if answers["kind"] == "embed" else
                     f"{len(a['changed'])} of {answers['prompts']} greedy continuations change, "
                     f"logits move by up to {a['logits_max_delta']:.3g} (limit "
                     f"{LIMITS['logits']:g})")
            broken.append(f"answers ({a['arm']}: {moved}; moved most by "
                          f"{_sites_named(a['sites'])})")
    return broken


def _keeps_answers(measured: Mapping[str, Any]) -> bool:
    if "min_cosine" in measured:
        return measured["min_cosine"] >= LIMITS["cosine"]
    return not measured["changed"] and measured["logits_max_delta"] <= LIMITS["logits"]


def _answers(model: nn.Module, tokenizer: Any, reference: Answers, setting: Setting
             ) -> dict[str, Any]:
    """The answers under ``setting`` against ``reference``; when they move, the sites that
    move them most on the prompt that moved most."""
    with setting.patched(model):
        measured = compare_answers(model, tokenizer, reference)
    forced = reference.forced[measured["worst"]]
    sites = [] if _keeps_answers(measured) else site_deviations(
        model, lambda: setting.patched(model), lambda: model(**forced))
    return {"arm": setting.arm, **measured, "sites": sites}


def _null_insertion(model: nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """:func:`.contracts.null_insertion`, or ``{"not_defined": why}`` for an input it is not
    defined for."""
    try:
        return null_insertion(model, inputs)
    except ValueError as error:
        return {"not_defined": str(error)}


def check(model: nn.Module, tokenizer: Any = None, arm: str | None = None,
          tau: float | None = None, eps: float | None = None,
          spec: Mapping[str, Any] | None = None, prompts: Sequence[str] | None = None,
          new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    """Measure every contract on ``model`` at the user's settings (:func:`settings`: ``arm``,
    default ``oa`` and ``full-o``, at ``tau`` and ``eps``, default the library's, or ``spec``),
    and with a ``tokenizer`` its answers to ``prompts`` (default :data:`.answers.CHAT_PROMPTS`;
    ``new_tokens`` greedy tokens each). ``holds`` is True when all are within :data:`LIMITS`;
    ``failed`` names those that are not (:func:`failed`).

    Contracts run on example inputs of 2 × 12 tokens; padding batches the first row with the
    second's first 7 tokens; null insertion and padding run under the last setting (``full-o``
    when both arms are measured). The model is left as it was given. Raises
    :class:`oretrofit.RetrofitError` for a model the host does not cover (by name) and
    ValueError for a model that is no transformers model.
    """
    if prompts is not None and tokenizer is None:
        raise ValueError("prompts are tokenised by the model's tokenizer: pass tokenizer= too")
    measured = settings(arm, tau, eps, spec)
    _require_transformers_model(model)
    for setting in measured:            # a model the host refuses, or a spec that does not fit
        with setting.patched(model) as applied:         # it, is refused before anything runs
            host = applied.plan.host
    inputs = example_inputs(model, batch=2, tokens=12)
    ids_only = "input_ids" in inputs and not any(k.startswith("pixel") for k in inputs)
    sequences = ([inputs["input_ids"][0].tolist(), inputs["input_ids"][1, :7].tolist()]
                 if ids_only else [])
    last = measured[-1]
    with last.patched(model):
        inserted = _null_insertion(model, inputs)
        padding = padding_delta(model, sequences) if sequences else None
    answers = None
    if tokenizer is not None:
        reference = reference_answers(model, tokenizer,
                                      CHAT_PROMPTS if prompts is None else prompts, new_tokens)
        answers = {"kind": reference.kind, "prompts": len(reference.prompts),
                   "new_tokens": new_tokens if reference.kind == "generate" else None,
                   "arms": [_answers(model, tokenizer, reference, s) for s in measured]}
    summary = {"host": host, "arms": [s.arm for s in measured], "tau": last.tau,
               "eps": last.eps, "insertion_arm": last.arm,
               "agreement": [agreement(model, inputs, s.arm, s.tau, s.eps, s.spec)
                             for s in measured],
               "null_insertion": inserted,
               "null_insertion_unpatched": _null_insertion(model, inputs),
               "padding_max_delta": padding, "answers": answers, "limits": LIMITS}
    broken = failed(summary)
    return {**summary, "holds": not broken, "failed": broken}
