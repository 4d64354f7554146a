"""What a retrofit does to a model's answers, measured against the unpatched model on text.

A model with a tokenizer and an LM head (one that generates) answers with its greedy
continuation of each prompt (``NEW_TOKENS`` new tokens, KV cache on, as users run it) and its
logits: the retrofit keeps the answers when every continuation is the unpatched one and the
logits on the prompt followed by the unpatched continuation (teacher-forced, so both models read
the same tokens) move by at most :data:`LOGIT_LIMIT` (max |Δ| over positions and vocabulary).
A model without an LM head (an encoder) answers with its sentence embeddings, the final hidden
states mean-pooled over the prompt's tokens: cosine to the unpatched embedding at least
:data:`COSINE_LIMIT`.

When the answers move, :func:`site_deviations` names the sites that move them most: each site's
own deviation, its output given the unpatched model's input to it (replayed by hooks, so
upstream sites' changes do not reach it) against the unpatched output, relative to that output's
largest entry. One unpatched and one patched forward, whatever the number of sites.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CHAT_PROMPTS", "NEW_TOKENS", "LOGIT_LIMIT", "COSINE_LIMIT", "Answers",
           "answer_kind", "reference_answers", "compare_answers", "site_deviations"]

# varied chat turns: facts, arithmetic, code, translation, lists, a poem, a definition
CHAT_PROMPTS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What is 17 times 3?",
    "Write a Python function that reverses a string.",
    "Translate 'good morning' into Spanish.",
    "Give me three tips for sleeping better.",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
)
NEW_TOKENS = 12
LOGIT_LIMIT = 1e-3
COSINE_LIMIT = 0.999999


@dataclass
class Answers:
    """The unpatched model's answers to ``prompts`` (tokenised: ``inputs``): ``kind``
    ``generate`` (``continuations``, and ``readouts`` the logits ``(N, V)`` on ``forced``: prompt
    then continuation) or ``embed`` (``readouts`` the unit sentence embeddings ``(d,)`` of
    ``forced``: the prompt)."""

    kind: str
    prompts: list[str]
    new_tokens: int
    inputs: list[dict[str, Tensor]]
    forced: list[dict[str, Tensor]]
    readouts: list[Tensor]
    continuations: list[list[int]]


def answer_kind(model: nn.Module) -> str:
    """``generate`` for a model with an LM head that generates, else ``embed``."""
    can_generate = getattr(model, "can_generate", None)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    return "generate" if callable(can_generate) and can_generate() and head is not None \
        else "embed"


def _prompt_ids(tokenizer: Any, prompt: str, chat: bool) -> dict[str, Tensor]:
    """The prompt's tokens, wrapped in the tokenizer's chat template for a generating model
    that has one (as a chat user's turn reaches it)."""
    if chat and getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                               tokenize=False, add_generation_prompt=True)
    encoded = tokenizer(prompt, return_tensors="pt")
    return {k: encoded[k] for k in ("input_ids", "attention_mask") if k in encoded}


def _greedy(model: nn.Module, tokenizer: Any, ids: dict[str, Tensor], new_tokens: int
            ) -> Tensor:
    """The generated sequence: the prompt and its continuation for a decoder, the decoder's
    tokens (from its start token) for an encoder–decoder."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return model.generate(**ids, max_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=pad)[0]


def _forced_and_continuation(model: nn.Module, ids: dict[str, Tensor], generated: Tensor
                             ) -> tuple[dict[str, Tensor], list[int]]:
    """The teacher-forced inputs (prompt and continuation) and the continuation's tokens."""
    if getattr(model.config, "is_encoder_decoder", False):
        return {**ids, "decoder_input_ids": generated[None]}, generated[1:].tolist()
    n = ids["input_ids"].shape[1]
    return {"input_ids": generated[None]}, generated[n:].tolist()


def _readout(model: nn.Module, kind: str, forced: dict[str, Tensor]) -> Tensor:
    """Logits ``(N, V)`` (``generate``), or the unit sentence embedding ``(d,)``: the final
    hidden states (an encoder–decoder's encoder's) mean-pooled over the tokens."""
    if kind == "generate":
        return model(**forced, use_cache=False).logits[0].float()
    encoder = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) \
        else model
    output = encoder(**forced, output_hidden_states=True)
    hidden = getattr(output, "last_hidden_state", None)
    hidden = output.hidden_states[-1] if hidden is None else hidden                 # (1, N, d)
    return F.normalize(hidden[0].float().mean(0), dim=-1)


@torch.no_grad()
def reference_answers(model: nn.Module, tokenizer: Any, prompts: Sequence[str],
                      new_tokens: int = NEW_TOKENS) -> Answers:
    """The answers of ``model`` as it is (unpatched) to ``prompts``."""
    if isinstance(prompts, str):
        raise ValueError("prompts is one string (it would be read character by character); give "
                         f"a list of prompts: [{prompts[:40]!r}]")
    if not prompts or any(not isinstance(p, str) or not p.strip() for p in prompts):
        raise ValueError(f"prompts must be non-empty strings, got {list(prompts)!r}")
    kind = answer_kind(model)
    inputs = [_prompt_ids(tokenizer, prompt, chat=kind == "generate") for prompt in prompts]
    forced, continuations = list(inputs), []
    if kind == "generate":
        answered = [_forced_and_continuation(model, ids, _greedy(model, tokenizer, ids,
                                                                  new_tokens)) for ids in inputs]
        forced, continuations = [a[0] for a in answered], [a[1] for a in answered]
    return Answers(kind, list(prompts), new_tokens, inputs, forced,
                   [_readout(model, kind, f) for f in forced], continuations)


@torch.no_grad()
def compare_answers(model: nn.Module, tokenizer: Any, reference: Answers) -> dict[str, Any]:
    """The answers of ``model`` as it is (patched) against ``reference``.

    ``generate``: ``changed`` (indices of the prompts whose greedy continuation differs),
    ``logits_max_delta`` (max |Δ logit| over prompts, positions and vocabulary),
    ``logits_max_abs`` (the unpatched logits' largest |value|, for scale); ``embed``:
    ``min_cosine``. ``worst``: the index of the prompt that moved most.
    """
    readouts = [_readout(model, reference.kind, f) for f in reference.forced]
    if reference.kind == "embed":
        cosines = [float((a * b).sum()) for a, b in zip(readouts, reference.readouts)]
        return {"min_cosine": min(cosines), "worst": cosines.index(min(cosines))}
    deltas = [(a - b).abs().max().item() for a, b in zip(readouts, reference.readouts)]
    changed = [i for i, (ids, expected) in enumerate(zip(reference.inputs,
                                                          reference.continuations))
               if _forced_and_continuation(model, ids, _greedy(
                   model, tokenizer, ids, reference.new_tokens))[1] != expected]
    return {"changed": changed, "logits_max_delta": max(deltas),
            "logits_max_abs": max(r.abs().max().item() for r in reference.readouts),
            "worst": deltas.index(max(deltas))}


def _stream(args: tuple, kwargs: dict[str, Any]) -> Tensor | None:
    """A module call's stream: its first positional tensor, else ``hidden_states=``."""
    if args and isinstance(args[0], Tensor):
        return args[0]
    stream = kwargs.get("hidden_states")
    return stream if isinstance(stream, Tensor) else None


def _first(output: Any) -> Tensor | None:
    """A module output's main tensor (itself, or the head of a tuple / ``ModelOutput``)."""
    if isinstance(output, Tensor):
        return output
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    head = output[0] if isinstance(output, (tuple, list)) and output else None
    return head if isinstance(head, Tensor) else None


@contextlib.contextmanager
def _hooked(model: nn.Module, names: Sequence[str], replay: dict[str, list] | None
            ) -> Iterator[dict[str, list]]:
    """Record each named module's ``[stream input, output]`` per call; with ``replay``, first
    overwrite its stream input in place by the one recorded at the same call in ``replay`` (in
    place: the host traces which tensor a branch reads)."""
    seen: dict[str, list] = {name: [] for name in names}
    handles = []
    for name in names:
        module = model.get_submodule(name)

        def pre(m: nn.Module, args: tuple, kwargs: dict, name: str = name) -> None:
            stream, calls = _stream(args, kwargs), seen[name]
            given = replay[name][len(calls)][0] if replay and len(replay[name]) > len(calls) \
                else None
            if stream is not None and given is not None and given.shape == stream.shape:
                stream.copy_(given)
            calls.append([None if stream is None else stream.clone(), None])

        def post(m: nn.Module, args: tuple, output: Any, name: str = name) -> None:
            seen[name][-1][1] = _first(output)

        # prepended: the host's capture hooks read the replayed input
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
        handles.append(module.register_forward_hook(post))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def site_deviations(model: nn.Module, patched: Callable[[], ContextManager[Any]],
                    call: Callable[[], Any], top: int = 3) -> list[dict[str, Any]]:
    """The ``top`` sites whose own output moves most: ``{"site", "deviation"}``, deviation
    = max over calls of max|out_patched − out| / max|out|, each site fed the unpatched model's
    input to it. ``patched()`` patches ``model`` (a context yielding the ``Retrofit``)."""
    with patched() as applied:
        names = [site.name for site, _ in applied.plan.entries]
    modules = dict(model.named_modules())
    names = [n for n in names if n in modules]      # sites that are modules of their own
    with _hooked(model, names, None) as unpatched:
        call()
    with patched(), _hooked(model, names, unpatched) as replayed:
        call()
    found = []
    for name in names:
        pairs = [(a[1], b[1]) for a, b in zip(replayed[name], unpatched[name])
                 if isinstance(a[1], Tensor) and isinstance(b[1], Tensor)
                 and a[1].shape == b[1].shape]
        if pairs and len(replayed[name]) == len(unpatched[name]):
            found.append({"site": name, "deviation": max(
                ((p.float() - u.float()).abs().max() / u.float().abs().max().clamp_min(1e-30))
                .item() for p, u in pairs)})
    return sorted(found, key=lambda row: -row["deviation"])[:top]
