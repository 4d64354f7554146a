"""Every zoo architecture called the ways users call it, retrofitted at the defaults against
the unpatched model: with a padded attention mask, without one, with ``inputs_embeds`` (and
zero rows appended to them, no mask: exactly zero there, the others unchanged), through
``generate`` with a KV cache over a left-padded batch (decoders and encoder-decoders, by their
LM head), and one training step's gradients in ``train()`` mode. Each call is exact (every
hidden state, the generated tokens, their logits and the gradients within :data:`TOLERANCE`
relative) or refused by a :class:`RetrofitError` naming what is not supported (:func:`_refused`);
a call the unpatched model cannot run either is listed in :data:`UNPATCHED_FAILS`. Runs on the
oldest and the newest admitted transformers (the Makefile's TRANSFORMERS_TESTS).

The defaults are ``full-o``, τ = 1e-8, ε → 0⁺: what a user gets. Tolerance:
τ = 1e-8 moves a present token's presence by ~1e-8 relative, so what is left is the rounding of
two summation orders (~1e-7 relative per op); 1e-4 is a thousand times that, and far below what
a dropped bias, mask or position (≥ 1e-2 on these jittered models) moves.
"""

from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Any, Callable  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from oretrofit import RetrofitError, retrofitted  # noqa: E402
from oretrofit.hosts.transformers.contracts import hidden_states, relative_max_diff  # noqa: E402
from oretrofit.hosts.transformers.inputs import accepts  # noqa: E402
from hosts.transformers import zoo  # noqa: E402

TOLERANCE = 1e-4
APPENDED = 2                      # zero rows appended to inputs_embeds
# (architecture, call) -> the error the unpatched model itself raises (nothing to compare with)
UNPATCHED_FAILS: dict[tuple[str, str], str] = {
    (f"DeepSeek-{v} (MLA)", call): "must match the size of tensor b"   # SDPA given fewer key heads
    for v in ("V2", "V3") for call in ("padded mask", "generate")}

Outcome = dict[str, Any]


def _head_class(arch: zoo.Architecture) -> Any:
    """The Auto class whose head ``generate`` runs on (None: no generation for this model)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    if arch.model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForSeq2SeqLM
    if arch.family in ("decoder-only", "MoE") and arch.model_type in \
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    return None


def _without_dropout(model: nn.Module) -> None:
    """Every dropout probability 0 (modules and the float rates attention modules pass to the
    attention function), and no SpecAugment masking of an audio model's frames (which needs
    longer inputs than the tiny ones), so ``train()`` mode draws nothing."""
    if hasattr(model.config, "apply_spec_augment"):
        model.config.apply_spec_augment = False
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


def _padded(inputs: dict[str, Any]) -> dict[str, Any]:
    """The second row's last two tokens masked out (right padding)."""
    mask = inputs["attention_mask"].clone()
    mask[1, -2:] = 0
    return {**inputs, "attention_mask": mask}


def _real(call: Callable[[], dict[str, Tensor]], inputs: dict[str, Any]
          ) -> Callable[[], dict[str, Tensor]]:
    """``call``'s states at the tokens its attention mask keeps (what a padded position holds is
    no output: ESM zeroes its embedding, which a retrofit then keeps at exactly 0)."""
    kept = inputs["attention_mask"].bool()

    def run() -> dict[str, Tensor]:
        return {k: v[kept] if v.shape[:2] == kept.shape else v for k, v in call().items()}
    return run


def _unmasked(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in inputs.items() if not k.endswith("attention_mask")}


def _embedded(model: nn.Module, inputs: dict[str, Any], appended: int) -> dict[str, Any]:
    """``inputs_embeds`` for ``input_ids`` with ``appended`` zero rows at the end (per-token
    side inputs grown by zeros), no mask."""
    ids = inputs["input_ids"]
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    grow = lambda t: torch.cat([t, t.new_zeros(t.shape[0], appended, *t.shape[2:])], 1)  # noqa: E731
    given = {k: grow(v) if isinstance(v, Tensor) and v.shape[:2] == ids.shape else v
             for k, v in _unmasked(inputs).items() if k != "input_ids"}
    return {**given, "inputs_embeds": grow(embeds)}


def _states(model: nn.Module, inputs: dict[str, Any]) -> Callable[[], dict[str, Tensor]]:
    return lambda: hidden_states(model, lambda: model(**inputs))


def _generated(model: nn.Module, ids: Tensor) -> Callable[[], dict[str, Tensor]]:
    """Greedy generation of 3 tokens over a left-padded batch (the second row one token shorter),
    with the model's KV cache: the tokens and every step's logits."""
    mask = torch.ones_like(ids)
    mask[1, 0] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=3, do_sample=False, min_new_tokens=3,
                  return_dict_in_generate=True, output_logits=True,
                  pad_token_id=0, use_cache=True)

    def run() -> dict[str, Tensor]:
        with torch.no_grad():
            out = model.generate(ids, **kwargs)
        return {"sequences": out.sequences.float(), "logits": torch.stack(out.logits)}
    return run


def _loss(model: nn.Module, inputs: dict[str, Any], lm: bool) -> Tensor:
    if lm:
        labels = inputs.get("decoder_input_ids", inputs["input_ids"]).contiguous()
        return model(**inputs, labels=labels).loss
    out = model(**inputs)
    state = out[0] if isinstance(out, tuple) else next(
        v for v in out.values() if isinstance(v, Tensor) and v.is_floating_point())
    return state.pow(2).mean()


def _gradients(model: nn.Module, inputs: dict[str, Any], lm: bool
               ) -> Callable[[], dict[str, Tensor]]:
    """One training step's gradients (``train()``, no dropout, one seed for what else draws,
    e.g. a router's jitter): every parameter's as one row, zeros where it got none."""
    def run() -> dict[str, Tensor]:
        model.train()
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        try:
            _loss(model, inputs, lm).backward()
        finally:
            model.eval()
        grads = [torch.zeros(p.numel()) if p.grad is None else p.grad.flatten()
                 for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return {"gradients": torch.cat(grads)}
    return run


def _calls(arch: zoo.Architecture, model: nn.Module, lm: bool
           ) -> dict[str, Callable[[], dict[str, Tensor]]]:
    inputs = zoo.example_inputs(model)
    calls: dict[str, Callable[[], dict[str, Tensor]]] = {}
    if "attention_mask" in inputs:
        calls["padded mask"] = _real(_states(model, _padded(inputs)), _padded(inputs))
        calls["no mask"] = _states(model, _unmasked(inputs))
    else:
        calls["as given"] = _states(model, inputs)
    if "input_ids" in inputs and accepts(model, "inputs_embeds"):
        calls["inputs_embeds"] = _states(model, _embedded(model, inputs, 0))
        calls["inputs_embeds, zero rows"] = _states(model, _embedded(model, inputs, APPENDED))
    if lm:
        calls["generate"] = _generated(model, inputs["input_ids"])
    calls["training step"] = _gradients(model, inputs, lm)
    return calls


def _zero_rows(states: dict[str, Tensor], n: int) -> tuple[dict[str, Tensor], float]:
    """The states without the appended rows, and the largest |h| on those rows."""
    kept, largest = {}, 0.0
    for key, state in states.items():
        if state.dim() == 3 and state.shape[1] == n + APPENDED:
            largest = max(largest, state[:, n:].abs().max().item())
            state = state[:, :n]
        kept[key] = state
    return kept, largest


def _model(arch: zoo.Architecture) -> nn.Module:
    """The tiny model with its LM head where it generates (:func:`_head_class`), no dropout."""
    model = zoo.build(arch, auto=_head_class(arch))
    _without_dropout(model)
    return model


def _measure(arch: zoo.Architecture, model: nn.Module) -> dict[str, Outcome]:
    """Each call's outcome: ``{"difference": …}`` (and ``"zero_rows"``) or ``{"refused": …}``,
    or ``{"unpatched fails": …}``."""
    calls = _calls(arch, model, _head_class(arch) is not None)
    with torch.no_grad():
        n = zoo.example_inputs(model)["input_ids"].shape[1] if "inputs_embeds" in calls else 0
    outcomes: dict[str, Outcome] = {}
    reference = {}
    for name, call in calls.items():
        try:
            reference[name] = (reference["inputs_embeds"] if name == "inputs_embeds, zero rows"
                               else call())
        except Exception as error:                  # noqa: BLE001 - named in the outcome
            outcomes[name] = {"unpatched fails": f"{type(error).__name__}: {error}"}
    with retrofitted(model):
        for name, call in calls.items():
            if name in outcomes:
                continue
            try:
                states = call()
            except RetrofitError as error:
                outcomes[name] = {"refused": str(error)}
                continue
            outcome: Outcome = {}
            if name == "inputs_embeds, zero rows":
                states, outcome["zero_rows"] = _zero_rows(states, n)
            if name == "generate":
                outcome["tokens_equal"] = torch.equal(states["sequences"],
                                                      reference[name]["sequences"])
            outcome["difference"] = relative_max_diff(states, reference[name])
            outcomes[name] = outcome
    return outcomes


def _refused(call: str, model: nn.Module) -> str | None:
    """What the RetrofitError of ``call`` names, where it is refused (else None): generation
    through a model that takes its cache as legacy tuples only (transformers 4.x's PLBart)."""
    if call == "generate" and getattr(model, "_supports_cache_class", True) is False:
        return "KV cache as legacy tuples"
    return None


def _failures(arch: zoo.Architecture, model: nn.Module, outcomes: dict[str, Outcome]
              ) -> dict[str, Any]:
    failures = {}
    for call, outcome in outcomes.items():
        expected, fails = _refused(call, model), UNPATCHED_FAILS.get((arch.name, call))
        if "unpatched fails" in outcome or fails is not None:
            if fails is None or fails not in outcome.get("unpatched fails", ""):
                failures[call] = outcome
        elif "refused" in outcome:
            if expected is None or expected not in outcome["refused"]:
                failures[call] = outcome["refused"]
        elif expected is not None:
            failures[call] = f"runs, though listed as refused naming {expected!r}"
        elif not (outcome["difference"] <= TOLERANCE and outcome.get("zero_rows", 0) == 0
                  and outcome.get("tokens_equal", True)):
            failures[call] = outcome
    return failures


@pytest.mark.parametrize("arch", zoo.ARCHITECTURES, ids=[a.name for a in zoo.ARCHITECTURES])
def test_every_call_is_exact_or_refused_by_name(arch: zoo.Architecture) -> None:
    if zoo.expectation(arch) != "covered":
        return zoo.assert_refused_in_this_release(arch)
    model = _model(arch)
    assert _failures(arch, model, _measure(arch, model)) == {}


def _attentions(output: Any) -> list[Tensor]:
    return [w for key in ("attentions", "encoder_attentions", "decoder_attentions",
                          "cross_attentions") for w in (getattr(output, key, None) or ())]


@pytest.mark.parametrize("name", ["Llama", "GPT-2", "BERT", "BART", "T5", "XGLM",
                                  "GPT-OSS (attention sinks, sliding window 4)"])
def test_output_attentions_returns_the_o_weights(name: str) -> None:
    """``output_attentions=True`` on an eager model: the O weights ``p_i w_ij`` of every layer
    (self, encoder, decoder and cross-attention; interface and softmax routes; a sink's column
    dropped), which at τ → 0 are the model's own weights."""
    arch = next(a for a in zoo.ARCHITECTURES if a.name == name)
    if zoo.expectation(arch) != "covered":
        return zoo.assert_refused_in_this_release(arch)
    model = zoo.build(replace(arch, config={**arch.config, "attn_implementation": "eager"}))
    inputs = _padded(zoo.example_inputs(model))
    with torch.no_grad():
        reference = _attentions(model(**inputs, output_attentions=True))
        with retrofitted(model):
            weights = _attentions(model(**inputs, output_attentions=True))
    assert len(weights) == len(reference) >= 2
    assert all(w is not None for w in weights)
    assert relative_max_diff(dict(enumerate(weights)), dict(enumerate(reference))) <= TOLERANCE
