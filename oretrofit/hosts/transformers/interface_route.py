"""The ``oretrofit`` attention implementation for transformers 5.x.

* One attention function and one mask function, both registered under the name ``oretrofit``
  (``AttentionInterface`` / ``AttentionMaskInterface``). The mask function is required: for an
  implementation name it does not know, transformers builds no mask at all and passes
  ``attention_mask=None``, so padding, causality and sliding windows would silently be lost.
  Ours materialises the boolean relation (``True`` = visible), except where the model's own
  implementation is SDPA and SDPA's skips it: a missing mask then means causality as SDPA reads
  it, from the ``is_causal`` argument or the module's ``is_causal``.
* Every argument the attention function receives is honoured or refused:

    attention_mask, is_causal, sliding_window   the visibility relation m_ij (the mask function
                                                builds sliding windows into the mask; a window
                                                or causal flag without a mask is built here or
                                                refused)
    position_bias, alibi                        additive score biases b_ij (T5 relative
                                                positions, ALiBi): s_ij + b_ij
    softcap                                     s_ij = c·tanh(scale·q·k / c) (Gemma2)
    indices                                     top-k sparse attention (DeepSeek-V3.2): m_ij ∧
                                                [j ∈ indices_i], the keys an O indexer chose
                                                (:mod:`.indexer`); also for a module without
                                                an O site, whose own kernel would ignore them
    s_aux                                       attention sinks (GPT-OSS): one more key of
                                                logit s_h, value 0, presence 1
    scaling                                     the score scale
    dropout                                     attention-weight dropout on w_ij while the
                                                module is in train() mode, as eager attention
                                                does: w_ij zeroed with probability `dropout`,
                                                survivors scaled 1/(1 - dropout) (reference
                                                path); ignored in eval() mode
    output_attentions                           returns the O weights p_i w_ij (B, H, Nq, Nk)
                                                the output is Σ_j p_i w_ij v_j of (reference
                                                path); also where transformers 5 collects the
                                                weights without passing it, or a 4.x module
                                                is called with it and does not pass it on
    position_ids, use_cache, cache_position,    metadata for other kernels and outputs (packed
    encoder_hidden_states, key_value_states,    sequences, caches, flash-attention determinism,
    output_hidden_states, deterministic,        cross-attention sources: their presences are
    output_router_logits                        captured by hooks; an MoE block's router
                                                logits)

  Any other argument that is not None raises a :class:`RetrofitError` naming it.
* A module without an O site (excluded by ``targets``) runs the implementation the config had.
* The retrofit follows the model's attention implementation: ``set_attn_implementation`` after
  ``retrofit`` keeps the retrofit on and records the new implementation as the user's
  (:class:`FollowsRetrofit`): excluded modules run it, masks follow it, ``revert`` restores it.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

import torch
from torch import Tensor, nn

from ..._operators.attention import o_attention
from ..._surgery.patching import PopAttribute, SiteConfig, Undo, o_subclass
from ..._surgery.host import RetrofitError
from ..torch_nn import patch_all
from .indexer import selected_keys
from .layouts import forward_source
from .capture import CarrierPresence, by_name

__all__ = ["IMPLEMENTATION", "ADDITIVE_BIASES", "METADATA", "attach_o_attention",
           "o_attention_function", "register_implementation"]

IMPLEMENTATION = "oretrofit"
ADDITIVE_BIASES = ("position_bias", "alibi")
METADATA = frozenset({"position_ids", "use_cache", "cache_position", "encoder_hidden_states",
                      "key_value_states", "output_hidden_states", "deterministic",
                      "return_dict", "output_router_logits"})
_STATE = "_oretrofit_attention"          # attribute on a patched attention module
_ASKED = "_oretrofit_output_attentions"  # its call's output_attentions (transformers 4.x)
# id(config) -> its switch, while a retrofit holds it
_SWITCHED: weakref.WeakValueDictionary[int, "_ImplementationSwitch"] = weakref.WeakValueDictionary()


def _check_keys(owner: str, attention_mask: Tensor | None, n_q: int, n_k: int,
                is_causal: bool | None, first_write: bool) -> None:
    """Refuse a call whose mask does not describe the keys it attends to: a mask over other than
    ``n_k`` keys, or a causal call without a mask over more keys than queries into a cache that
    held keys before it (SDPA aligns that relation to the first ``n_q`` keys, which is right only
    for the ``first_write`` into a pre-allocated cache: its keys fill the first slots, the rest
    are unfilled slots of presence 0; eager cannot run it). Both arise
    when a layer attends to its cache again within one forward (Dory with more input and output
    layers than layers: each layer runs twice on one cache), so the model's own masks, built once
    per forward, no longer fit."""
    masked = attention_mask is not None and attention_mask.shape[-1] not in (1, n_k)
    if masked or (attention_mask is None and is_causal and 1 < n_q < n_k and not first_write):
        given = ("no mask" if attention_mask is None
                 else f"a mask over {attention_mask.shape[-1]} keys")
        raise RetrofitError(
            f"{owner} attends {n_q} queries to {n_k} keys with {given}: the model's mask "
            "does not describe the keys (a layer that attends to its KV cache again within one "
            "forward, e.g. a recurrent or repeated layer), so its own attention is ill-defined "
            "there (eager fails; SDPA drops the newest keys); call it with use_cache=False, or "
            "with a config whose layer counts add up")


def _mask_over_keys(attention_mask: Tensor | None, n_k: int) -> Tensor | None:
    """The mask's columns of the ``n_k`` keys given, ``m[..., :n_k]``: transformers before 5.0
    builds a decoder's mask without a 2-D ``attention_mask`` over one key past the cache
    (``_update_causal_mask``: target length = cached + new + 1, GPT-2, BioGPT), and its eager and
    SDPA functions read the first ``n_k`` columns; a mask over fewer keys is
    :func:`_check_keys`' to refuse."""
    if attention_mask is None or attention_mask.shape[-1] <= n_k:
        return attention_mask
    return attention_mask[..., :n_k]


def _untracked_presences(module: nn.Module, state: CarrierPresence, n_q: int, n_k: int
                         ) -> str | None:
    """Why the captured presences do not fit the call's ``n_q`` queries and ``n_k`` keys (None
    when they do): no batch axis, a call on one chunk of a packed sequence (vision towers that
    split their tokens by ``cu_seqlens``), none captured for these queries (the attention module
    called alone), or keys the KV cache holds at a slot other than ``layer_idx``, whose presences the
    capture (which reads the cache at ``layer_idx``) cannot follow."""
    owner = type(module).__name__
    unbatched = state.without_batch_axis(owner)
    if unbatched:
        return unbatched
    if (state.query is not None and state.query.shape[1] > n_q
            and "cu_seqlens" in forward_source(type(module))):
        return (f"{owner} attends its packed sequence one chunk per call (cu_seqlens splits the "
                f"{state.query.shape[1]} tokens of its input into images, and this call holds "
                f"{n_q} queries), and no call says which of the tokens it holds, so the host "
                "cannot place their presences on it; this host has no O form for it")
    if state.query is None or state.query.shape[1] != n_q:
        return (f"{owner} was called without its carrier presences (the query length differs "
                "from the captured layer input): call the model, not the attention module alone")
    if state.keys is not None and state.keys.shape[1] == n_k:
        return None
    held = ("no presences for its keys" if state.keys is None
            else f"presences for {state.keys.shape[1]}")
    return (f"{owner} attends to {n_k} keys where its KV cache at layer_idx "
            f"{getattr(module, 'layer_idx', None)} holds {held}: the layer runs more than once "
            "per forward and writes its keys to cache slots other than its layer_idx (HRM's H/L "
            "cycles write slot layer_idx + cycle_offset, Dory's recurrent loops one slot a loop), "
            "so the presences of its cached keys cannot be followed; call the model with "
            "use_cache=False")


def _score_mask(attention_mask: Tensor | None, query: Tensor, key: Tensor, is_causal: bool | None,
                sliding_window: int | None, biases: list[Tensor], sinks: Tensor | None
                ) -> tuple[Tensor | None, bool]:
    """The relation m_ij and the additive biases b_ij as one mask for :func:`o_attention`: bool
    (True = visible) without biases, else float ``b_ij`` where visible and -inf elsewhere; and
    whether causality goes to :func:`o_attention` as its ``causal`` flag instead of a lower
    triangle in the mask: a causal call without a mask over as many keys as queries (the flag's
    ``j ≤ i + Nk − Nq`` is then SDPA's ``j ≤ i``) and no sink key to append."""
    n_q, n_k = query.shape[2], key.shape[2]
    mask, causal = attention_mask, attention_mask is None and bool(is_causal) and n_q > 1
    if causal and (n_q != n_k or sinks is not None):
        mask, causal = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril(), False
    if mask is None and not causal and sliding_window is not None and n_k > sliding_window:
        raise RetrofitError(f"sliding_window={sliding_window} came without a mask to carry it; "
                            "build the model's masks with its own masking utilities")
    if not biases:
        return mask, causal
    bias = functools.reduce(torch.add, biases).to(query.dtype)                  # (B|1, H, Nq, Nk)
    if mask is None:
        return bias, causal
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, float("-inf")), causal
    return bias + mask, causal


def _with_sinks(sinks: Tensor, key: Tensor, value: Tensor, p_keys: Tensor, mask: Tensor | None,
                n_q: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention sinks (``s_aux``, GPT-OSS): softmax over ``[s_i1 … s_iN, s_h]`` with the sink
    column dropped is one extra key of logit s_h, value 0 and presence 1, always visible:
    w_ij = p_j e^{s_ij} / (ε + e^{s_h} + Σ_t p_t e^{s_it}). Returns k, v, p_k and the float mask
    (additive b_ij, −inf where hidden) with that key appended."""
    b, heads, n_k = key.shape[0], sinks.shape[0], key.shape[2]
    bias = key.new_zeros(1, 1, n_q, n_k) if mask is None else mask
    if bias.dtype == torch.bool:
        bias = key.new_zeros(bias.shape).masked_fill(~bias, float("-inf"))
    bias = bias.to(key.dtype).expand(bias.shape[0], heads, n_q, n_k)
    sink = sinks.to(key.dtype).reshape(1, heads, 1, 1).expand(bias.shape[0], heads, n_q, 1)
    zero = lambda t: torch.cat([t, t.new_zeros(*t.shape[:2], 1, t.shape[3])], dim=2)  # noqa: E731
    p_keys = torch.cat([p_keys, p_keys.new_ones(b, 1)], dim=1)
    return zero(key), zero(value), p_keys, torch.cat([bias, sink], dim=-1)


def _original_implementation(config: Any) -> str:
    """The attention implementation the user chose for ``config`` (before the switch or since;
    ``sdpa`` when no switch holds it). Read from the config alone (its class says whether a
    switch holds it, its own dict holds the choice), as the switch's :attr:`original` is, so
    ``torch.compile`` traces it without a graph break (a weak-value lookup breaks the graph)."""
    if isinstance(config, FollowsRetrofit):
        return config.__dict__.get("_attn_implementation_internal")
    return "sdpa"


def _run_original(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Tensor | None, **kwargs: Any) -> tuple[Tensor, Any]:
    """The attention function the module's config used before the switch. Eager (the modeling
    file's own ``eager_attention_forward``) adds its mask to the scores, so the boolean relation
    our mask function builds becomes additive (0 visible, dtype minimum hidden) for it."""
    from transformers import AttentionInterface
    name = _original_implementation(module.config)
    if name in AttentionInterface._global_mapping:
        function = AttentionInterface._global_mapping[name]
    else:
        function = sys.modules[type(module).__module__].eager_attention_forward
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = query.new_zeros(attention_mask.shape).masked_fill(
                ~attention_mask, torch.finfo(query.dtype).min)
    return function(module, query, key, value, attention_mask, **kwargs)


def o_attention_function(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                         attention_mask: Tensor | None, scaling: float | None = None,
                         dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers attention function: q ``(B, H, Nq, d)``, k/v ``(B, Hkv, Nk, d)`` ->
    ``(B, Nq, H, d)``; OAttention (eq. 7) with the carriers' presences captured for ``module``."""
    state: CarrierPresence | None = module.__dict__.get(_STATE)
    indices = kwargs.pop("indices", None)
    if indices is not None:
        attention_mask = selected_keys(attention_mask, indices, query.shape[2], key.shape[2],
                                       type(module).__name__)
    if state is None:
        return _run_original(module, query, key, value, attention_mask, scaling=scaling,
                             dropout=dropout, **kwargs)
    is_causal, sliding_window = kwargs.pop("is_causal", None), kwargs.pop("sliding_window", None)
    softcap, sinks = kwargs.pop("softcap", None), kwargs.pop("s_aux", None)
    biases = [kwargs.pop(name) for name in ADDITIVE_BIASES if kwargs.get(name) is not None]
    wanted = _weights_wanted(kwargs.pop("output_attentions", None)
                             or module.__dict__.get(_ASKED, False))
    unknown = [name for name, given in kwargs.items()
               if given is not None and name not in METADATA]
    if unknown:
        raise RetrofitError(
            f"{type(module).__name__} passes {', '.join(sorted(unknown))} to the attention "
            "function and OAttention has no rule for it; exclude this module with exclude=[...] "
            "or register a site for it (oretrofit.hosts.torch_nn.register_module_site)")
    untracked = _untracked_presences(module, state, query.shape[2], key.shape[2])
    if untracked:
        raise RetrofitError(untracked)
    if query.shape[2] > 1:               # one query attends to every key it is given either way
        is_causal = _sdpa_causality(module, attention_mask, is_causal)
    attention_mask = _mask_over_keys(attention_mask, key.shape[2])
    _check_keys(type(module).__name__, attention_mask, query.shape[2], key.shape[2], is_causal,
                state.first_write)
    mask, causal = _score_mask(attention_mask, query, key, is_causal, sliding_window, biases,
                               sinks)
    p_keys, n_k = state.keys, key.shape[2]
    if sinks is not None:
        key, value, p_keys, mask = _with_sinks(sinks, key, value, p_keys, mask, query.shape[2])
    # eager attention's `dropout(w, p=dropout, training=module.training)`
    out, weights = o_attention(query, key, value, state.query, p_keys, mask=mask,
                               eps=state.config.eps, scale=scaling, softcap=softcap,
                               dropout_p=dropout if module.training else 0.0,
                               need_weights=wanted, causal=causal)
    return out.transpose(1, 2).contiguous(), (                                 # (B, Nq, H, d)
        None if weights is None else _receiver_weights(weights, state.query, n_k))


def _weights_wanted(output_attentions: bool | None) -> bool:
    """Whether the caller asks for the attention weights: ``output_attentions=True`` passed
    down to the attention function (transformers 4.x), or the output collector of
    transformers 5's ``capture_outputs`` collecting attentions for this forward (it reads them
    from the attention module's returned weights, where no argument says so)."""
    if output_attentions:
        return True
    collector = _output_collector()
    collected = collector.get() if collector is not None else None
    return bool(collected) and any(key.endswith("attentions") for key in collected)


@functools.cache
def _output_collector() -> Any:
    """transformers' context variable of the outputs a forward collects (None where the
    release has none)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        try:
            from transformers.utils.generic import _active_collector
        except ImportError:
            return None
    return _active_collector


def _record_output_attentions(attention: nn.Module) -> Undo:
    """transformers 4.x: a pre-hook keeping the ``output_attentions`` the attention module is
    called with (GPT-2's does not pass it on to the attention function, whose weights its
    layer returns), for :func:`o_attention_function` to read."""
    def record(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        asked = {**by_name(module, args), **kwargs}.get("output_attentions")
        module.__dict__[_ASKED] = bool(asked)

    remove = attention.register_forward_pre_hook(record, with_kwargs=True).remove
    return patch_all(lambda: remove, lambda: PopAttribute(attention, _ASKED))


def _receiver_weights(weights: Tensor, p_q: Tensor, n_k: int) -> Tensor:
    """The O weights ``p_i w_ij`` (B, H, Nq, Nk) the output is ``Σ_j p_i w_ij v_j`` of: eq. 6's
    weights gated by the receiver's presence ((B, Nq) or per head (B, H, Nq)), an attention
    sink's column dropped (as eager attention drops it)."""
    p = p_q[:, None, :, None] if p_q.dim() == 2 else p_q[..., None]
    return p.to(weights.dtype) * weights[..., :n_k]


def _o_mask_function(*args: Any, **kwargs: Any) -> Tensor | None:
    """SDPA's boolean mask (B, 1, Nq, Nk). Where the model's own implementation was SDPA, the
    mask is skipped (None) exactly where SDPA's is, since SDPA then reads causality from the
    attention module (:func:`_sdpa_causality`), not from the mask the model asked for: PaliGemma's
    Gemma (``use_bidirectional_attention``) builds a causal mask but attends bidirectionally
    under SDPA. For any other implementation the relation is materialised."""
    from transformers.masking_utils import sdpa_mask
    if _original_implementation(kwargs.get("config")) != "sdpa":
        kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _sdpa_causality(module: nn.Module, attention_mask: Tensor | None,
                    is_causal: bool | None) -> bool | None:
    """Causality as the model's own implementation reads it: SDPA without a mask takes the
    ``is_causal`` argument, else the module's ``is_causal`` (default True), as
    ``sdpa_attention_forward`` does; otherwise the argument as given."""
    if (attention_mask is None and is_causal is None
            and _original_implementation(module.config) == "sdpa"):
        return getattr(module, "is_causal", True)
    return is_causal


@functools.cache
def register_implementation() -> str:
    """Register the ``oretrofit`` attention and mask functions with transformers (once)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    AttentionInterface.register(IMPLEMENTATION, o_attention_function)
    AttentionMaskInterface.register(IMPLEMENTATION, _o_mask_function)
    return IMPLEMENTATION


class FollowsRetrofit:
    """Mixin for a transformers config while a retrofit holds it: its attention implementation
    reads ``oretrofit``, and setting one (``model.set_attn_implementation``, or assigning
    ``config._attn_implementation``) records the user's choice underneath, in the instance's own
    ``_attn_implementation_internal``, without leaving the retrofit. That choice is what the
    switch calls the original implementation (excluded modules run it, masks follow it) and what
    ``revert`` restores."""

    @property
    def _attn_implementation_internal(self) -> str:
        return IMPLEMENTATION

    @_attn_implementation_internal.setter
    def _attn_implementation_internal(self, value: Any) -> None:
        self.__dict__["_attn_implementation_internal"] = value


class _ImplementationSwitch:
    """``config`` reads the ``oretrofit`` implementation while any attention site uses it
    (``users``; :class:`FollowsRetrofit`); the last :meth:`release` gives it back its class, and
    with it the implementation the user chose last. It pickles with the retrofit's undos: a
    loaded copy registers the implementation and itself again."""

    portable_undo = True

    def __init__(self, config: Any) -> None:
        self.config, self.config_class, self.users = config, type(config), 0
        config.__class__ = o_subclass(type(config), FollowsRetrofit)
        _SWITCHED[id(config)] = self

    @property
    def original(self) -> str | None:
        """The implementation the user chose last (before the retrofit, or since)."""
        return self.config.__dict__.get("_attn_implementation_internal")

    @classmethod
    def take(cls, config: Any) -> Undo:
        register_implementation()
        switch = _SWITCHED.get(id(config))
        if switch is None or switch.config is not config:
            switch = cls(config)
        switch.users += 1
        return switch.release

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            self.config.__class__ = self.config_class
            _SWITCHED.pop(id(self.config), None)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        register_implementation()
        if self.users > 0:
            _SWITCHED[id(self.config)] = self


def attach_o_attention(attention: nn.Module, carrier_module: nn.Module, config: SiteConfig,
                       cross: bool = False) -> tuple[Undo, CarrierPresence]:
    """OAttention on a transformers attention module (eq. 7 at the hidden-carrier boundary).

    A forward pre-hook on ``carrier_module`` captures ρτ of its hidden-state input (the residual
    stream entering the branch) and the KV cache it is given. Cross-attention (``cross``) takes
    its sources' presences from the ``key_value_states`` / ``encoder_hidden_states`` the
    attention module receives (the encoder output). Returns the undo and the captured state.
    """
    if _STATE in attention.__dict__:
        raise RetrofitError(f"{type(attention).__name__} already has an OAttention site")
    state = CarrierPresence(config, getattr(attention, "layer_idx", None), cross)

    def attach() -> Undo:
        attention.__dict__[_STATE] = state
        return PopAttribute(attention, _STATE)

    steps = [attach, lambda: carrier_module.register_forward_pre_hook(
        state.capture_hook, with_kwargs=True).remove]
    if _output_collector() is None:
        steps.append(lambda: _record_output_attentions(attention))
    if cross:
        steps.append(lambda: attention.register_forward_pre_hook(
            state.capture_sources_hook, with_kwargs=True).remove)
    undo = patch_all(*steps, lambda: _ImplementationSwitch.take(attention.config))
    return undo, state
