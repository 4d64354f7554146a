"""The second attention route: OAttention inside attention modules that compute their weights
themselves (eager code that never calls transformers' attention interface: XGLM, MPT, RoFormer,
DeBERTa, BLOOM, …).

Such a module's weights come from one softmax over the key axis of the scores
``s_ij = scale·q_i·k_j + b_ij + mask_ij`` (relative-position / ALiBi / disentangled biases and
the mask are already inside), followed by code linear in the weights (dropout, head mask,
``@ v``, the output projection). While the module runs, a
:class:`~torch.overrides.TorchFunctionMode` replaces that one softmax by

    w_ij = p_i · p_j e^{s_ij} / (ε + Σ_t p_t e^{s_it})

(eq. 6's weights :func:`oretrofit._operators.attention.o_weights`, the reference path's, times p_i), so that
``w @ v`` is ``p_i Σ_j p_j e^{s_ij} v_j / (ε + Σ_j p_j e^{s_ij})``: OAttention (eq. 7) whatever
the surrounding code, the receiver gate p_i folded into the weights' rows. Dropout on the weights
in ``train()`` mode is the host's own code after the softmax and stays as it is. The output
projection's bias is gated by p_i as on the interface route.

Presences are captured as on the interface route (:class:`CarrierPresence`): receivers from the
residual stream entering the layer, sources the same tokens (KV-cached ones included) or, for
cross-attention, the encoder output.

Refused, naming the module, when a call shows anything the formula cannot honour:

* no softmax, or more than one (block-sparse / chunked attention), or a fused kernel
  (``scaled_dot_product_attention``), or another normalisation (``log_softmax``, ``softmin``,
  ``normalize``);
* a softmax over another axis than the last, or scores whose last two axes are not
  (receivers, sources) or whose leading axis is neither the batch nor batch·heads (batch-major);
* the weights reaching anything but casts, reshapes, dropout, a scale (head mask), a
  ``masked_fill`` with 0 and a matmul with the values as the left operand (e.g. a second
  normalisation, a projection across heads, slicing the key axis).

With ``output_attentions`` the weights a module returns are the O weights ``p_i w_ij`` above.
"""

from __future__ import annotations

import functools
import re
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..._operators.attention import o_weights
from ..._surgery.host import RetrofitError
from ..._surgery.patching import SiteConfig, Undo, noop, o_subclass, set_site, site_config
from ..._kernels.dtypes import compute_dtype
from ..torch_nn import ATTENTION, patch_all
from .layouts import eager_class, forward_source as _source
from .capture import CarrierPresence, by_name

__all__ = ["SoftmaxCarrier", "presence_softmax", "attach_softmax_attention", "attach_carrier",
           "OSoftmaxAttention"]

_SOFTMAX = {torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax,
            torch.special.softmax}
_REFUSED = {torch.log_softmax: "a log-softmax", torch.nn.functional.log_softmax: "a log-softmax",
            torch.Tensor.log_softmax: "a log-softmax", torch.nn.functional.softmin: "a softmin",
            torch.nn.functional.normalize: "a normalisation",
            torch.nn.functional.scaled_dot_product_attention: "a fused attention kernel",
            torch.nn.functional.multi_head_attention_forward: "a fused attention kernel"}
# What the code after the softmax may do with the weights and stay linear in them, by name.
_KEEPS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as", "view",
                    "view_as", "reshape", "reshape_as", "permute", "transpose", "contiguous",
                    "clone", "detach", "unsqueeze", "squeeze", "flatten", "unflatten", "dropout",
                    "__get__"})
_SCALES = frozenset({"mul", "__mul__", "__rmul__", "masked_fill", "masked_fill_"})
_CONSUMES = frozenset({"matmul", "bmm"})
_INSPECTS = frozenset({"size", "dim", "numel", "__len__", "is_floating_point", "is_contiguous",
                       "stride", "__format__", "__repr__"})
_CACHE_NAMES = ("cache", "past_key_values", "past_key_value", "layer_past")
_SOURCE_NAMES = ("key_value_states", "encoder_hidden_states", "key")


def _broadcast(p: Tensor, shape: torch.Size, axis: int, where: str) -> Tensor:
    """Presences ``p`` (B, N) viewed to broadcast along ``axis`` (-2 receivers, -1 sources) of
    scores of ``shape`` (B, …, Nq, Nk) or, batch-major flattened, (B·H, Nq, Nk)."""
    b, n = p.shape
    lead = shape[0]
    if lead != b and (len(shape) != 3 or lead % b != 0):
        raise RetrofitError(f"{where}: its softmax sees scores {tuple(shape)} whose leading axis "
                            f"is neither the batch ({b}) nor batch·heads; the presence-weighted "
                            "softmax cannot place the tokens' presences")
    p = p.repeat_interleave(lead // b, dim=0)                                   # (lead, N)
    view = [lead] + [1] * (len(shape) - 1)
    view[axis] = n
    return p.reshape(view)


def presence_softmax(scores: Tensor, p_q: Tensor, p_k: Tensor, eps: float,
                     dtype: torch.dtype | None = None, where: str = "attention") -> Tensor:
    """``w_ij = p_i p_j e^{s_ij} / (ε + Σ_t p_t e^{s_it})`` over the last axis of ``scores``
    ``(B, …, Nq, Nk)`` (or ``(B·H, Nq, Nk)``); ``p_q`` (B, Nq), ``p_k`` (B, Nk): :func:`o_weights`
    times p_i. A row with no visible live source (all −inf) gives 0. Computed in fp32 at least,
    returned in ``dtype`` (default: the scores' dtype)."""
    ct = compute_dtype(scores.dtype)
    pk = _broadcast(p_k.to(ct), scores.shape, -1, where)
    w = o_weights(scores.to(ct), pk, pk != 0, eps) * _broadcast(p_q.to(ct), scores.shape, -2,
                                                                   where)
    return w.to(dtype or scores.dtype)


def _tensors(args: tuple, kwargs: dict) -> list[Tensor]:
    flat = [*args, *kwargs.values()]
    flat += [t for a in flat if isinstance(a, (list, tuple)) for t in a]
    return [t for t in flat if isinstance(t, Tensor)]


class _SoftmaxSwap(TorchFunctionMode):
    """Active during one call of an attention module: swaps its one softmax for
    :func:`presence_softmax` and follows the weights until they meet the values."""

    def __init__(self, where: str, state: CarrierPresence) -> None:
        super().__init__()
        self.where, self.state, self.softmaxes = where, state, 0
        self._weights: dict[int, weakref.ref] = {}

    def refuse(self, why: str) -> RetrofitError:
        return RetrofitError(
            f"{self.where} {why}, so the softmax route cannot make it OAttention (it needs one "
            "softmax over the keys whose weights only meet dropout, a head mask and the "
            "values); exclude this module with exclude=[...]")

    def _is_weights(self, t: Tensor) -> bool:
        ref = self._weights.get(id(t))
        return ref is not None and ref() is t

    def _track(self, out: Any) -> Any:
        if isinstance(out, Tensor):
            self._weights[id(out)] = weakref.ref(out)
        return out

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _SOFTMAX:
            return self._track(self._softmax(*args, **kwargs))
        if func in _REFUSED:
            raise self.refuse(f"calls {_REFUSED[func]} ({func.__name__})")
        weights = [t for t in _tensors(args, kwargs) if self._is_weights(t)]
        out = func(*args, **kwargs)
        if weights:
            self._follow(getattr(func, "__name__", repr(func)), args, kwargs, weights, out)
        return out

    def _softmax(self, scores: Tensor, dim: int | None = None, dtype: torch.dtype | None = None,
                 **_: Any) -> Tensor:
        self.softmaxes += 1
        if self.softmaxes > 1:
            raise self.refuse("calls softmax more than once per call (block-sparse or chunked "
                              "attention, or a second normalisation)")
        if dim is None or dim % scores.dim() != scores.dim() - 1:
            raise self.refuse(f"takes its softmax over axis {dim} of {tuple(scores.shape)}, not "
                              "the last (key) axis")
        p_q, p_k = self.state.query, self.state.keys
        if p_q is None or p_k is None:
            raise self.refuse("was called without its carrier presences (call the model, not the "
                              "attention module alone)")
        unbatched = self.state.without_batch_axis(self.where)
        if unbatched:
            raise RetrofitError(unbatched)
        n_q, n_k = scores.shape[-2:]
        if (n_q, n_k) != (p_q.shape[1], p_k.shape[1]):
            raise self.refuse(
                f"takes its softmax over scores {tuple(scores.shape)} whose last two axes are not "
                f"its {p_q.shape[1]} receivers and {p_k.shape[1]} sources (sliding chunks, "
                "blocks, or a KV cache whose presences this retrofit never saw: run the prompt "
                "through the retrofitted model with a fresh cache)")
        return presence_softmax(scores, p_q, p_k, self.state.config.eps, dtype, self.where)

    def _follow(self, name: str, args: tuple, kwargs: dict, weights: list[Tensor],
                out: Any) -> None:
        """Keep following what stays the weights; refuse what is not linear in them."""
        if name in _INSPECTS:
            return
        if name in _KEEPS:
            self._track(out)
            return
        others = [t for t in _tensors(args, kwargs) if not self._is_weights(t)]
        if name in _SCALES and len(weights) == 1 and not (
                name.startswith("masked_fill") and _fill_value(args, kwargs) != 0):
            self._track(out)
            return
        if name in _CONSUMES and len(weights) == 1 and args[0] is weights[0] and others:
            return
        raise self.refuse(f"passes its attention weights to {name}")


def _fill_value(args: tuple, kwargs: dict) -> Any:
    return kwargs.get("value", args[2] if len(args) > 2 else None)


class OSoftmaxAttention:
    """Mixin for an attention module that computes its own weights: its eager forward
    (:func:`~.layouts.eager_class`: an SDPA subclass runs its base class's) runs with its one
    softmax replaced by :func:`presence_softmax` (module docstring)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state: SoftmaxCarrier = site_config(self, ATTENTION)
        original = self._oretrofit["original_class"]
        swap, eager = _SoftmaxSwap(f"{state.site} ({original.__name__})", state), (
            eager_class(original) or original)
        args, kwargs = _additive_masks(self, eager, args, kwargs)
        with swap:
            out = eager.forward(self, *args, **kwargs)
        if swap.softmaxes != 1:
            raise swap.refuse("showed no softmax in its forward (a fused kernel, or another "
                              "attention implementation: set attn_implementation='eager')")
        return _gate_returned_biases(self, out, state.query)


_MASK_NAMES = ("attention_mask", "encoder_attention_mask")
_ADDS_MASK = re.compile(r"\+\s*attention_mask\b")


@functools.cache
def _adds_masks(cls: type) -> bool:
    """Whether ``cls``'s forward adds its ``attention_mask`` to the scores (read once per
    class)."""
    return bool(_ADDS_MASK.search(_source(cls)))


def _additive_masks(module: nn.Module, cls: type, args: tuple, kwargs: dict[str, Any]
                    ) -> tuple[tuple, dict[str, Any]]:
    """The call's boolean masks (True = visible) as the additive masks eager code adds to its
    scores (0 where visible, the dtype's minimum elsewhere), where ``cls``'s forward adds its
    mask: a model whose layers take both routes (BigBird-Pegasus: its encoder computes
    attention itself, its decoder calls the interface) builds its masks once for both, by the
    interface route's mask function (the boolean relation), and adding True and False would
    shift the scores by 1 and 0. Code that fills by a boolean mask (MPT) gets it as it is."""
    if not _adds_masks(cls):
        return args, kwargs

    def additive(name: str, mask: Any) -> Any:
        if name not in _MASK_NAMES or not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            return mask
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()),
                     torch.float32)
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min)

    named = by_name(module, args)
    return ((*(additive(n, a) for n, a in named.items()), *args[len(named):]),
            {k: additive(k, v) for k, v in kwargs.items()})


def _gate_returned_biases(module: nn.Module, out: Any, p: Tensor) -> Any:
    """A parameter of ``module`` returned as such (GPT-NeoX-Japanese's ``dense_bias``, which its
    layer adds to the attention output) is a bias b applied after the module: returned as
    ``p_i·b`` (B, N, d), as the output projection's bias is gated."""
    own = {id(w) for w in module.parameters(recurse=False)}
    if not isinstance(out, tuple) or not any(id(o) in own for o in out):
        return out
    return tuple(p[..., None].to(o.dtype) * o if id(o) in own else o for o in out)


class ReadsEager:
    """Mixin for the config of a module that picks its kernel from it at every call (Falcon)
    while the softmax route holds it: its attention implementation reads ``"eager"`` (the branch
    that shows the softmax), and setting one (``model.set_attn_implementation``, or assigning
    ``config._attn_implementation``) records the user's choice underneath, in the instance's own
    ``_attn_implementation_internal``, without leaving the retrofit; taking the mixin off shows
    that choice again."""

    @property
    def _attn_implementation_internal(self) -> str:
        return "eager"

    @_attn_implementation_internal.setter
    def _attn_implementation_internal(self, value: Any) -> None:
        self.__dict__["_attn_implementation_internal"] = value


class _EagerSwitch:
    """``config`` reads ``"eager"`` (:class:`ReadsEager`) until called (the undo), which gives it
    back the class it had. Undone in reverse order, each restores the class it found; pickles
    with the retrofit's undos."""

    portable_undo = True

    def __init__(self, config: Any) -> None:
        self.config, self.found = config, type(config)
        if not isinstance(config, ReadsEager):
            config.__class__ = o_subclass(type(config), ReadsEager)

    def release(self) -> None:
        self.config.__class__ = self.found


def _switch_to_eager(attention: nn.Module) -> Undo:
    """:class:`_EagerSwitch` on the module's config when its eager forward reads the
    implementation from it (also where it reads ``"eager"`` now: an implementation set later
    is followed); else nothing to undo."""
    config = getattr(attention, "config", None)
    source = _source(eager_class(type(attention)) or type(attention))
    if config is None or "_attn_implementation" not in source:
        return noop
    return _EagerSwitch(config).release


@dataclass
class SoftmaxCarrier(CarrierPresence):
    """:class:`CarrierPresence` for modules of older calling conventions: the KV cache may come
    as ``past_key_value`` / ``layer_past`` and cross-attention sources as ``key``; ``site`` names
    the module in refusals."""

    site: str = ""

    def capture_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        named = {**by_name(module, args), **kwargs}       # 4.x passes the cache by position
        cache = next((named[k] for k in _CACHE_NAMES if named.get(k) is not None), None)
        hidden = args[0] if args and isinstance(args[0], Tensor) else next(
            (kwargs[k] for k in ("hidden_states", "query", "x") if k in kwargs), None)
        if hidden is None:
            raise RetrofitError(f"{type(module).__name__} (a carrier) was called without hidden "
                                "states (first positional argument, hidden_states= or query=)")
        self.capture(hidden, cache if hasattr(cache, "get_seq_length") else None)

    def capture_sources_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        named = {**by_name(module, args), **kwargs}       # 4.53's BERT passes them fourth
        sources = next((named[k] for k in _SOURCE_NAMES if named.get(k) is not None), None)
        if sources is None:
            raise RetrofitError(f"{type(module).__name__} is a cross-attention site but was "
                                f"called without {' / '.join(_SOURCE_NAMES)}")
        self.capture_sources(sources)


def attach_softmax_attention(site: str, attention: nn.Module, carrier_module: nn.Module,
                             config: SiteConfig, cross: bool = False, layer_index: int = 0
                             ) -> tuple[Undo, CarrierPresence]:
    """OAttention on the attention module ``attention`` at path ``site`` that computes its own
    softmax (module docstring).

    A forward pre-hook on ``carrier_module`` captures ρτ of the residual stream entering the
    branch (and the KV cache it is given); cross-attention (``cross``) takes its sources'
    presences from the module's ``key_value_states`` / ``encoder_hidden_states`` / ``key``.
    The KV cache is read at the module's ``layer_idx``, else at ``layer_index`` (its layer's
    place in the layer list). Returns the undo and the captured state.
    """
    return attach_carrier(site, attention, OSoftmaxAttention, carrier_module, config, cross,
                          layer_index, first=lambda: _switch_to_eager(attention))


def attach_carrier(site: str, attention: nn.Module, mixin: type, carrier_module: nn.Module,
                   config: SiteConfig, cross: bool, layer_index: int,
                   first: Callable[[], Undo] | None = None) -> tuple[Undo, "SoftmaxCarrier"]:
    """``attention`` gets ``mixin`` with a :class:`SoftmaxCarrier` whose presences a pre-hook on
    ``carrier_module`` captures (and, for ``cross``, a pre-hook on ``attention`` its sources');
    ``first`` is applied before the rest. The KV cache is read at the module's ``layer_idx``,
    else at ``layer_index``. Returns the undo of all of it and the state."""
    index = getattr(attention, "layer_idx", None)
    state = SoftmaxCarrier(config, layer_index if index is None else index, cross, site=site)
    steps = [*([first] if first else []),
             lambda: set_site(attention, mixin, ATTENTION, state),
             lambda: carrier_module.register_forward_pre_hook(state.capture_hook,
                                                              with_kwargs=True).remove]
    if cross:
        steps.append(lambda: attention.register_forward_pre_hook(
            state.capture_sources_hook, with_kwargs=True).remove)
    return patch_all(*steps), state
