"""Shared transformers (5.x) plumbing for the BERT and Llama hosts.

* One attention function and one mask function, both registered under the name ``oretrofit``
  (``AttentionInterface`` / ``AttentionMaskInterface``). The mask function is required: for an
  implementation name it does not know, transformers builds no mask at all and passes
  ``attention_mask=None``, so padding and causality would silently be lost. Ours materialises
  the boolean relation (``True`` = visible), never the ``is_causal`` shortcut.
* transformers hands the attention function projected q/k/v, not the carrier. A forward
  pre-hook on the module that receives the carrier (the residual stream entering the layer)
  captures its presences; the attention function reads them from the attention module.
* With a KV cache the presences of cached keys are kept next to it, so generation after a
  prompt with null tokens still excludes them.
* :func:`zero_padded_inputs` builds a mask-free padded batch at the carrier boundary.
"""

from __future__ import annotations

import functools
import importlib
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from .._attention import o_attention
from .._components import o_gate
from .._patching import SiteConfig, Undo, set_site, site_config
from .._presence import presence
from .._registry import RetrofitError, Site
from .torch_nn import ATTENTION, gated_linear, patch_all, uncovered_attention

__all__ = ["IMPLEMENTATION", "CarrierPresence", "TransformersHost", "attach_o_attention",
           "gate_branch", "gate_output_bias", "zero_padded_inputs", "check_transformers"]

IMPLEMENTATION = "oretrofit"
_STATE = "_oretrofit_attention"          # attribute on a patched attention module


def transformers_version() -> str:
    import transformers
    return transformers.__version__


def check_transformers() -> None:
    """The hosts follow the transformers 5.x module layout; refuse any other major version."""
    version = transformers_version()
    if version.split(".")[0] != "5":
        raise RetrofitError(f"the transformers hosts need transformers 5.x, found {version}; "
                            "install 'oretrofit[hf]' (transformers>=5,<6)")


@dataclass
class CarrierPresence:
    """Presences ρτ of one attention module's carriers: ``query`` (B, Nq) for the current tokens,
    ``keys`` (B, Nk) for every key, cached ones included."""

    config: SiteConfig
    layer_idx: int | None = None
    query: Tensor | None = None
    keys: Tensor | None = None
    _cache: Any = field(default=None, repr=False)

    def capture(self, carrier: Tensor, cache: Any = None) -> None:
        p = presence(carrier, self.config.tau)                                   # (B, N)
        past = cache.get_seq_length(self.layer_idx or 0) if cache is not None else 0
        if past == 0:
            keys = p
        elif (self.keys is not None and self._cache is not None and self._cache() is cache
              and self.keys.shape[0] == p.shape[0] and self.keys.shape[1] >= past):
            keys = torch.cat([self.keys[:, :past], p], dim=1)
        else:
            raise RetrofitError(
                "the KV cache holds tokens whose presences this retrofit never saw (a cache filled "
                "before patching, or a reordered/reused cache); run the prompt through the "
                "retrofitted model with a fresh cache")
        self.query, self.keys = p, keys
        self._cache = weakref.ref(cache) if cache is not None else None


def _o_attention_function(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Tensor | None, scaling: float | None = None,
                          dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers attention function: q ``(B, H, Nq, d)``, k/v ``(B, Hkv, Nk, d)`` ->
    ``(B, Nq, H, d)``. A module without an O site (excluded by ``targets``) runs SDPA."""
    state: CarrierPresence | None = module.__dict__.get(_STATE)
    if state is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if dropout > 0.0:
        raise RetrofitError("OAttention has no attention-weight dropout: call model.eval() or set "
                            "the config's attention dropout to 0")
    if (state.query is None or state.query.shape[1] != query.shape[2]
            or state.keys.shape[1] != key.shape[2]):
        raise RetrofitError(f"{type(module).__name__} was called without its carrier presences "
                            "(q/k lengths differ from the captured layer input); call the model, "
                            "not the attention module alone")
    out, _ = o_attention(query, key, value, state.query, state.keys, mask=attention_mask,
                         eps=state.config.eps, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _o_mask_function(*args: Any, **kwargs: Any) -> Tensor | None:
    """SDPA's boolean mask (B, 1, Nq, Nk), always materialised for causal models."""
    from transformers.masking_utils import sdpa_mask
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


@functools.cache
def register_implementation() -> str:
    """Register the ``oretrofit`` attention and mask functions with transformers (once)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    AttentionInterface.register(IMPLEMENTATION, _o_attention_function)
    AttentionMaskInterface.register(IMPLEMENTATION, _o_mask_function)
    return IMPLEMENTATION


_SWITCHED: dict[int, list[Any]] = {}     # id(config) -> [weakref(config), original, users]


def _use_o_implementation(config: Any) -> Undo:
    """Point ``config`` at the ``oretrofit`` implementation while any attention site uses it."""
    register_implementation()
    entry = _SWITCHED.get(id(config))
    if entry is None or entry[0]() is not config:
        entry = _SWITCHED[id(config)] = [weakref.ref(config), config._attn_implementation, 0]
        config._attn_implementation_internal = IMPLEMENTATION
    entry[2] += 1

    def undo() -> None:
        entry[2] -= 1
        if entry[2] == 0:
            config._attn_implementation_internal = entry[1]
            _SWITCHED.pop(id(config), None)

    return undo


def attach_o_attention(attention: nn.Module, carrier_module: nn.Module, config: SiteConfig
                       ) -> tuple[Undo, CarrierPresence]:
    """OAttention on a transformers attention module (eq. 7 at the hidden-carrier boundary).

    A forward pre-hook on ``carrier_module`` captures ρτ of its first input (the residual stream
    entering the layer) and the KV cache it is given; ``attention`` reads them in
    ``_o_attention_function``. Returns the undo and the captured state.
    """
    if _STATE in attention.__dict__:
        raise RetrofitError(f"{type(attention).__name__} already has an OAttention site")
    state = CarrierPresence(config, getattr(attention, "layer_idx", None))

    def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
        carrier = args[0] if args else kwargs["hidden_states"]
        state.capture(carrier, kwargs.get("cache", kwargs.get("past_key_values")))

    def attach() -> Undo:
        attention.__dict__[_STATE] = state
        return lambda: attention.__dict__.pop(_STATE, None)

    def hook() -> Undo:
        return carrier_module.register_forward_pre_hook(capture, with_kwargs=True).remove

    undo = patch_all(attach, hook, lambda: _use_o_implementation(attention.config))
    return undo, state


class OGatedBias:
    """Mixin for an attention output projection with a bias: ``W x + p·b`` (:func:`gated_linear`),
    p = the receivers' presences captured for the attention module."""

    def forward(self, x: Tensor) -> Tensor:
        return gated_linear(self, x, site_config(self, ATTENTION).query)


def gate_output_bias(linear: nn.Linear, state: CarrierPresence) -> Undo:
    """Gate the bias of an attention output projection (no-op when it has none)."""
    if linear.bias is None:
        return lambda: None
    return set_site(linear, OGatedBias, ATTENTION, state)


def gate_branch(carrier_module: nn.Module, branch: nn.Module, config: SiteConfig,
                carrier_arg: int = 0) -> Undo:
    """OFFN gate (eq. 15) with hooks: ``branch`` outputs ρτ(h)·branch(·), h = positional input
    ``carrier_arg`` of ``carrier_module`` (the residual stream entering the branch)."""
    captured: dict[str, Tensor] = {}

    def capture(module: nn.Module, args: tuple) -> None:
        captured["p"] = presence(args[carrier_arg], config.tau)

    def gate(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return o_gate(captured.pop("p"), output)

    return patch_all(lambda: carrier_module.register_forward_pre_hook(capture).remove,
                     lambda: branch.register_forward_hook(gate).remove)


def zero_padded_inputs(model: nn.Module, sequences: Sequence[Sequence[int]],
                       side: str = "right") -> dict[str, Tensor]:
    """Mask-free batch: token embeddings zero-padded to one length at the carrier boundary.

    Returns ``inputs_embeds`` ``(B, N, d)`` (exact zeros at padding) and ``position_ids``
    ``(B, N)`` that give every real token the position it has alone (padding continues the count,
    so left padding gets negative positions: use ``side="right"`` for learned position tables).
    Under a ``full-o`` retrofit the zero rows are inert: pass no attention mask.
    """
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("sequences must be a non-empty list of non-empty token id lists")
    embed = model.get_input_embeddings()
    width = max(len(s) for s in sequences)
    inputs = embed.weight.new_zeros(len(sequences), width, embed.embedding_dim)
    positions = torch.empty(len(sequences), width, dtype=torch.long, device=inputs.device)
    for row, ids in enumerate(sequences):
        start = 0 if side == "right" else width - len(ids)
        ids_t = torch.as_tensor(list(ids), dtype=torch.long, device=inputs.device)
        inputs[row, start:start + len(ids)] = embed(ids_t)
        positions[row] = torch.arange(width, device=inputs.device) - start
    return {"inputs_embeds": inputs, "position_ids": positions}


def find_modules(model: nn.Module, cls: type) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of every ``cls`` instance in ``model``."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, cls)]


def join(*parts: str) -> str:
    """Dotted site name from path parts, skipping empty ones."""
    return ".".join(p for p in parts if p)


class TransformersHost:
    """A transformers host: every instance of one backbone class (``BertModel``, ``LlamaModel``)
    inside a model, wherever it sits (head models, wrappers), contributes its sites."""

    name: str
    supports: str
    specificity = 10
    backbone: tuple[str, str]            # (module, class name), imported only with transformers

    def backbone_sites(self, name: str, backbone: nn.Module) -> list[Site]:
        raise NotImplementedError

    def _backbones(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        if "transformers" not in sys.modules:
            return []                    # a transformers model cannot exist without it
        cls = getattr(importlib.import_module(self.backbone[0]), self.backbone[1])
        return find_modules(model, cls)

    def matches(self, model: nn.Module) -> bool:
        return bool(self._backbones(model))

    def check(self, model: nn.Module) -> None:
        check_transformers()

    def sites(self, model: nn.Module) -> list[Site]:
        return [s for name, backbone in self._backbones(model)
                for s in self.backbone_sites(name, backbone)]

    def owned(self, model: nn.Module) -> list[str]:
        """A transformers model whole (its heads are read-outs), else the backbones it wraps."""
        from transformers import PreTrainedModel
        return [""] if isinstance(model, PreTrainedModel) else [n for n, _ in self._backbones(model)]

    def uncovered(self, model: nn.Module) -> list[str]:
        """Attention modules no attention site reaches (site names are module paths)."""
        return uncovered_attention(model, [s.name for s in self.sites(model)
                                           if s.kind == ATTENTION], self.owned(model))

    def version(self) -> dict[str, str]:
        return {"transformers": transformers_version()}
