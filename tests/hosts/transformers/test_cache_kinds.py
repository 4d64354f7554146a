"""The cache kinds beyond dynamic, static and sliding (oretrofit/hosts/transformers/cache.py):
quantized caches (transformers' built-in fp8 backend; quanto and HQQ take the same functions
where their packages are installed), offloaded caches (dynamic and static) and the cache
operations of contrastive search. Each generates the unpatched model's tokens at τ→0; a
quantized cache keeps the presences unquantized, so null carriers stay exact."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import Counter  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import DynamicCache, QuantizedCache  # noqa: E402
from transformers.cache_utils import CacheLayerMixin, DynamicLayer  # noqa: E402

from oretrofit import RetrofitError, retrofitted  # noqa: E402
from oretrofit.hosts.transformers import cache as cache_module  # noqa: E402
from oretrofit.hosts.transformers.measures import EPS, PROMPTS, TAU  # noqa: E402

from .test_cache import (CACHE, KINDS, _generate, _last_logits,  # noqa: E402,F401
                         smollm2)  # smollm2: a fixture

ARMS = ["oa", "full-o"]


def _presences(layer: Any) -> torch.Tensor:
    """The presences (B, N) a carrying cache layer holds, one per key it holds."""
    return getattr(layer, cache_module._CARRIED).layer.keys[:, 0, :, 0]


# --- quantized caches ---------------------------------------------------------------------

def _group_options(backend: str) -> dict[str, int]:
    """The group-wise backends (quanto, HQQ) keep 2 tokens unquantized and group 8 channels, so
    the prompt and the new tokens are quantized and re-quantized; fp8 takes no options."""
    return {} if backend == "fp8" else {"residual_length": 2, "q_group_size": 8}


def _quantized(backend: str) -> dict[str, Any]:
    """generate's options for a quantized cache."""
    return {"cache_implementation": "quantized",
            "cache_config": {"backend": backend, **_group_options(backend)}}


@pytest.mark.parametrize("options", [{}, {"num_beams": 3}], ids=["greedy", "beams"])
@pytest.mark.parametrize("arm", ARMS)
def test_a_quantized_cache_generates_the_unpatched_tokens(arm: str, options: dict,
                                                          backend: str = "fp8") -> None:
    """The quantized layer returns dequantized keys in the order they were written (and defers a
    beam reordering to its next update); its presence layer is a dynamic one, kept in order."""
    model = KINDS["llama"]()
    ids = torch.randint(1, 100, (2, 7))
    reference = _generate(model, ids, **_quantized(backend), **options)
    with retrofitted(model, arm, TAU, eps=EPS):
        assert _generate(model, ids, **_quantized(backend), **options) == reference


def _decode(model: torch.nn.Module, cache: object, embeds: torch.Tensor,
            positions: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Logits of the prompt's last token and of each step token fed one at a time after it
    (teacher-forced: both runs below read the same tokens); ``positions`` are the prompt's
    position ids, the steps continue from its last real token."""
    def call(inputs: torch.Tensor, position_ids: torch.Tensor, length: int) -> torch.Tensor:
        return model(inputs_embeds=inputs, position_ids=position_ids[None],
                     attention_mask=torch.ones(1, length, dtype=torch.long),
                     **{CACHE: cache}, use_cache=True).logits[:, -1]

    logits = [call(embeds, positions, embeds.shape[1])]
    for step in range(steps.shape[1]):
        at = positions.max() + 1 + step
        logits.append(call(steps[:, step:step + 1], at[None], embeds.shape[1] + step + 1))
    return torch.stack(logits, 1)


def _null_insertion_through(model: torch.nn.Module, make_cache: Any, at: int = 3,
                            count: int = 2) -> dict[str, Any]:
    """A 6-token prompt decoded 3 more steps through a fresh ``make_cache()``, with and without
    ``count`` zero carriers inserted at ``at`` (old tokens keep their positions, as
    report.null_insertion): the logits of both, and the cache that held the nulls."""
    embeds = model.get_input_embeddings()(torch.randint(1, 100, (1, 9)))
    prompt, steps = embeds[:, :6], embeds[:, 6:]
    inserted = torch.cat([prompt[:, :at], prompt.new_zeros(1, count, prompt.shape[-1]),
                          prompt[:, at:]], dim=1)
    old = torch.arange(6)
    positions = torch.cat([old[:at], torch.full((count,), at - 1), old[at:]])
    with torch.no_grad():
        plain = _decode(model, make_cache(), prompt, old, steps)
        cache = make_cache()
        nulls = _decode(model, cache, inserted, positions, steps)
    return {"plain": plain, "nulls": nulls, "cache": cache}


@pytest.mark.parametrize("arm", ARMS)
def test_a_quantized_cache_keeps_the_presences_exact(arm: str, backend: str = "fp8") -> None:
    """The keys are quantized, their presences are not: every layer holds the inserted nulls'
    presences as exact zeros beside the quantized keys, in the model's dtype, and the presences
    of the prompt (run before any key was dequantized) and of every token at the first layer
    (whose carriers are the embeddings) equal those a dynamic cache holds, bit for bit. With
    fp8's per-tensor scale (zero keys leave it unchanged) the nulls change no logit either."""
    model = KINDS["llama"]()
    def quantized() -> QuantizedCache:
        return QuantizedCache(backend=backend, config=model.config, **_group_options(backend))

    with retrofitted(model, arm, TAU, eps=EPS):
        state = torch.get_rng_state()
        run = _null_insertion_through(model, quantized)
        torch.set_rng_state(state)
        dynamic = _null_insertion_through(model, lambda: DynamicCache(config=model.config))
    for index, (layer, exact) in enumerate(zip(run["cache"].layers, dynamic["cache"].layers)):
        p = _presences(layer)
        assert isinstance(getattr(layer, cache_module._CARRIED).layer, DynamicLayer)
        assert p.dtype == torch.float32 and p.shape == (1, 11)
        assert torch.equal(p[:, 3:5], torch.zeros(1, 2))
        reference = _presences(exact)
        assert torch.equal(p[:, :8] if index else p, reference[:, :8] if index else reference)
    if backend == "fp8":
        torch.testing.assert_close(run["nulls"], run["plain"], atol=1e-5, rtol=1e-5)


def test_a_quantized_cache_refuses_to_crop(backend: str = "fp8") -> None:
    """transformers' quantized layers leave their quantized keys uncropped (quanto's silently,
    fp8's then fails on an index): the presences beside them would no longer match them, so a
    crop is refused, naming the fix; ``crop(0)``, which generate may call on any cache, stays a
    no-op."""
    model = KINDS["llama"]()
    ids = torch.randint(1, 100, (1, 6))

    def step(crop_nothing: bool) -> torch.Tensor:
        cache = QuantizedCache(backend=backend, config=model.config, **_group_options(backend))
        _last_logits(model, cache, input_ids=ids[:, :5])
        if crop_nothing:
            cache.crop(0)
        with pytest.raises(RetrofitError, match="QuantizedLayer cannot crop.*dynamic or static"):
            cache.crop(-2)
        return _last_logits(model, cache, input_ids=ids[:, 5:])

    with torch.no_grad(), retrofitted(model, "full-o", TAU, eps=EPS):
        torch.testing.assert_close(step(True), step(False), atol=0, rtol=0)


# --- offloaded caches ---------------------------------------------------------------------

OFFLOADED = ["offloaded", "offloaded_static"]


@pytest.mark.parametrize("implementation", OFFLOADED)
def test_an_offloaded_cache_needs_cuda_as_the_unpatched_model_does(implementation: str) -> None:
    """transformers' offloading path synchronises a prefetch stream with the CUDA default stream
    at every write: a CPU build of torch cannot run it, the unpatched model no more than the
    retrofitted one (which fails the same way, never with other tokens). Where CUDA is there,
    both generate on it and give the same tokens."""
    model = KINDS["llama"]()
    ids = torch.randint(1, 100, (2, 7))
    options = {"cache_implementation": implementation}
    if not torch.cuda.is_available():
        for patched in (False, True):
            with retrofitted(model, "full-o", TAU, eps=EPS) if patched else nullcontext():
                with pytest.raises(AssertionError, match="not compiled with CUDA"):
                    _generate(model, ids, **options)
        return
    model, ids = model.cuda(), ids.cuda()
    reference = _generate(model, ids, **options)
    with retrofitted(model, "full-o", TAU, eps=EPS):
        assert _generate(model, ids, **options) == reference


class _HostStream(nullcontext):
    """A stand-in for the CUDA streams of transformers' offloading path on a CPU, where every
    copy is synchronous: waiting on another stream has nothing to wait for."""

    def wait_stream(self, other: object) -> None:
        return None


@pytest.fixture
def host_streams(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """The offloading path on a CPU (its streams stood in by :class:`_HostStream`), counting the
    offload and prefetch calls each cache layer gets: ``Counter[(name, layer)]``."""
    monkeypatch.setattr(torch, "Stream", _HostStream)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: _HostStream())
    calls: Counter = Counter()
    for name in ("offload", "prefetch"):
        def counted(layer: Any, _name: str = name, _method: Any = getattr(CacheLayerMixin, name)
                    ) -> None:
            calls[_name, layer] += 1
            _method(layer)
        monkeypatch.setattr(CacheLayerMixin, name, counted)
    return calls


def _layers_in(calls: Counter) -> set:
    return {layer for _, layer in calls}


# a static offloaded cache keeps sliding layers resident: with every layer sliding (the tiny
# Mistral) there is none to offload and transformers' prefetch fails, unpatched as well
@pytest.mark.parametrize("kind, implementation", [("llama", "offloaded"),
                                                  ("llama", "offloaded_static"),
                                                  ("sliding", "offloaded")])
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("arm", ARMS)
def test_an_offloaded_cache_moves_the_presences_with_the_keys(arm: str, beams: int, kind: str,
                                                             implementation: str,
                                                             host_streams: Counter) -> None:
    """The offloading path run on a CPU (streams stood in): each layer is prefetched before its
    write and offloaded after it; every offload and prefetch of a carrying layer is made on its
    presence layer as well, and the tokens are the unpatched model's (beam search's too)."""
    model = KINDS[kind]()
    ids = torch.randint(1, 100, (2, 7))
    options = {"cache_implementation": implementation, "num_beams": beams}
    reference = _generate(model, ids, **options)
    host_streams.clear()
    with retrofitted(model, arm, TAU, eps=EPS):
        assert _generate(model, ids, **options) == reference
    carrying = [layer for layer in _layers_in(host_streams)
                if getattr(layer, cache_module._CARRIED, None) is not None]
    assert len(carrying) == model.config.num_hidden_layers
    for layer in carrying:
        presence_layer = getattr(layer, cache_module._CARRIED).layer
        for name in ("offload", "prefetch"):
            assert host_streams[name, layer] > 0
            assert host_streams[name, presence_layer] == host_streams[name, layer]


# --- contrastive search -------------------------------------------------------------------

def _contrastive_search(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int = 5,
                        alpha: float = 0.6, top_k: int = 4) -> list[list[int]]:
    """Contrastive search (Su et al. 2022): of the ``top_k`` likeliest next tokens v, the one
    maximising ``(1-α)·p(v) - α·max_j cos(h_v, h_j)`` over the context's last hidden states h_j.
    Built here with the cache operations transformers' implementation makes at every step (its
    ``_contrastive_search`` up to 4.55, the Hub's ``custom_generate`` since, which an offline
    host cannot load): the cache repeated ``top_k`` times per row (``batch_repeat_interleave``),
    the candidates run as one batch, the chosen candidates' rows kept (``batch_select_indices``)."""
    cache, rows = DynamicCache(config=model.config), torch.arange(ids.shape[0])
    with torch.no_grad():
        out = model(ids, **{CACHE: cache}, use_cache=True, output_hidden_states=True)
        context, logits = out.hidden_states[-1], out.logits[:, -1]
        for _ in range(new_tokens):
            probs, candidates = logits.softmax(-1).topk(top_k, dim=-1)               # (B, k)
            cache.batch_repeat_interleave(top_k)
            out = model(candidates.reshape(-1, 1), **{CACHE: cache}, use_cache=True,
                        output_hidden_states=True)
            hidden = out.hidden_states[-1][:, -1]                                   # (B·k, d)
            similarity = F.cosine_similarity(hidden[:, None],
                                             context.repeat_interleave(top_k, 0), dim=-1)
            score = (1 - alpha) * probs.reshape(-1) - alpha * similarity.amax(-1)
            chosen = score.view(-1, top_k).argmax(-1)                               # (B,)
            kept = rows * top_k + chosen
            cache.batch_select_indices(kept)
            ids = torch.cat([ids, candidates[rows, chosen, None]], dim=1)
            context = torch.cat([context, hidden[kept, None]], dim=1)
            logits = out.logits[kept, -1]
    return ids.tolist()


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("arm", ARMS)
def test_contrastive_search_generates_the_unpatched_tokens(arm: str, kind: str) -> None:
    """Its cache is repeated per candidate and narrowed to the chosen ones at every step: the
    presences follow both (a sliding window's too)."""
    model = KINDS[kind]()
    ids = torch.randint(1, 100, (2, 7))
    reference = _contrastive_search(model, ids)
    with retrofitted(model, arm, TAU, eps=EPS):
        assert _contrastive_search(model, ids) == reference


# --- SmolLM2 ------------------------------------------------------------------------------

def test_smollm2_quantized_offloaded_and_contrastive(smollm2: tuple,
                                                     host_streams: Counter) -> None:
    """The real weights: an fp8-quantized cache, an offloaded one (streams stood in, as above)
    and contrastive search give the unpatched model's tokens."""
    model, tokenizer = smollm2
    ids = tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"]

    def run() -> list[list[list[int]]]:
        return [_generate(model, ids, **_quantized("fp8")),
                _generate(model, ids, cache_implementation="offloaded"),
                _contrastive_search(model, ids)]

    reference = run()
    with retrofitted(model, "full-o", TAU, eps=EPS):
        assert run() == reference
