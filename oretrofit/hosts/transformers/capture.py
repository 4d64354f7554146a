"""Presence capture: the presences ρτ of the carriers of an attention module, read by hooks.

transformers hands the attention function projected q/k/v, not the carrier. A forward pre-hook on
the module that receives the carrier (the residual stream entering the branch) captures its
presences (:class:`CarrierPresence`); the attention function (:mod:`.interface_route`) reads them from
the attention module. Cross-attention takes its sources' presences from the encoder output the
attention module is given. With a KV cache the presences of cached keys live in the cache, next
to the keys (:mod:`.cache`), so generation after a prompt with null tokens still excludes them.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError
from ..._surgery.patching import SiteConfig
from ..._surgery.per_call import PerCall, PerCallState
from ..._operators.presence import presence
from ..._operators.presence_memo import carrier_presence
from .cache import UNSEEN, cache_of, expect_keys

__all__ = ["CarrierPresence", "by_name", "carrier_of"]


def carrier_of(args: tuple, kwargs: dict) -> Tensor:
    """The hidden-state input of a module call: its first positional argument or
    ``hidden_states=``."""
    if args and torch.is_tensor(args[0]):
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    raise RetrofitError("a carrier module was called without hidden states (first positional "
                        "argument or hidden_states=); its layout names the wrong module")


def by_name(module: nn.Module, args: tuple) -> dict[str, Any]:
    """A module call's positional ``args`` by the parameter names of its forward
    (:func:`_positional_names`)."""
    return dict(zip(_positional_names(type(module)), args))


@functools.cache
def _positional_names(cls: type) -> tuple[str, ...]:
    """The names of the positional parameters after ``self`` of the first forward in ``cls``'s
    MRO that names any (a retrofitted module's own forward takes ``*args``). Read once per
    class: the capture hooks call :func:`by_name` in every layer at every call."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for klass in cls.__mro__:
        forward = vars(klass).get("forward")
        if forward is None:
            continue
        parameters = list(inspect.signature(forward).parameters.values())[1:]
        if any(p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters):
            return tuple(p.name for p in parameters if p.kind in positional)
    return ()


@dataclass
class CarrierPresence(PerCallState):
    """Presences ρτ of one attention module's carriers: ``query`` (B, Nq) for the current tokens,
    ``keys`` (B, Nk) for every key, cached ones included. For cross-attention (``cross``) the keys
    are the encoder output's presences, set by :meth:`capture_sources`. ``first_write``: the
    call's keys are the first its KV cache layer holds (:mod:`.cache`)."""

    config: SiteConfig
    layer_idx: int | None = None
    cross: bool = False
    query = PerCall()           # Tensor | None, per call (:mod:`oretrofit._surgery.per_call`)
    keys = PerCall()            # Tensor | None
    first_write = PerCall(False)

    def capture(self, carrier: Tensor, cache: Any = None) -> None:
        """ρτ of the carrier; with a KV cache the keys' presences come from the cache layer the
        call writes its keys to (:mod:`.cache`), set when it writes them."""
        p = carrier_presence(carrier, self.config.tau)                           # (B, N)
        self.query = p
        if self.cross:
            return
        self.keys, self.first_write = p, False
        if cache is not None and expect_keys(cache, self.layer_idx or 0, p, self):
            self.keys = None
        elif cache is not None and cache.get_seq_length(self.layer_idx or 0) > 0:
            raise RetrofitError(UNSEEN)

    def capture_sources(self, sources: Tensor) -> None:
        self.keys = presence(sources, self.config.tau)                           # (B, Nk)

    def without_batch_axis(self, owner: str) -> str | None:
        """Why the captured presences cannot sit on the attention's (batch, tokens) axes (None
        when they can): a carrier without a batch axis, as packed sequences run; both routes
        refuse with it."""
        if self.query is None or self.query.dim() == 2:
            return None
        return (f"{owner} runs on a residual stream without a batch axis ({self.query.dim()}-D "
                "presences: packed sequences, as vision towers with cu_seqlens run), so its "
                "presences cannot be placed on the attention's (batch, tokens) axes; this host "
                "has no O form for it")

    def capture_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook on the carrier module: the hidden states and the KV cache."""
        self.capture(carrier_of(args, kwargs), cache_of(args, kwargs))

    def capture_sources_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook on a cross-attention module: its sources (the encoder output), passed
        by name or by position (transformers 4.53's BERT passes them fourth)."""
        named = {**by_name(module, args), **kwargs}
        sources = named.get("key_value_states", named.get("encoder_hidden_states"))
        if sources is None:
            raise RetrofitError(f"{type(module).__name__} is a cross-attention site but was "
                                "called without key_value_states / encoder_hidden_states")
        self.capture_sources(sources)

