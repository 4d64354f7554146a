"""Presences that live in transformers' KV cache, next to the keys they belong to.

A cached key keeps the presence ρτ of the token it came from: the retrofitted attention needs it
at every later call. Each cache layer the retrofitted model writes (any ``CacheLayerMixin``:
dynamic, static, sliding-window, offloaded, hybrid) carries a *presence layer*: a fresh layer of
its own kind whose "keys" are the presences ``(B, 1, N, 1)``. Whatever the cache layer does to its
keys it does to the presences with the same code, so they sit in the same slots: written by
``update`` (a static cache's slot positions, a sliding window's roll), moved by ``crop``,
``reorder_cache`` (beam search), ``batch_select_indices``, ``batch_repeat_interleave``,
``reset``, ``offload`` / ``prefetch``, and copied with the layer by ``copy.deepcopy`` and pickle.
A static cache's unfilled slots hold presence 0, and the model's mask hides them as well.

The carrier hook arms the layer with the presences of the tokens about to be written
(:func:`expect_keys`); the layer's ``update`` writes them and hands the presences of every key it
returns to the attention site's :class:`~.capture.CarrierPresence`. Keys written without
presences (by the model before it was retrofitted, or after the retrofit was taken off) mark the
layer untracked, and the retrofit refuses it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ..._host import RetrofitError
from ..._patching import _import, _path

__all__ = ["carrying_class", "expect_keys", "UNSEEN"]

_CARRIED = "_oretrofit_presences"        # attribute on a carrying cache layer
UNSEEN = ("the KV cache holds tokens whose presences this retrofit never saw (a cache filled by "
          "the model before it was retrofitted or after the retrofit was taken off); run the "
          "prompt through the retrofitted model with a fresh cache")


@dataclass
class _Carried:
    """A carrying layer's presence layer; ``incoming`` = (presences (B, N), the site's state)
    armed for the next ``update``; ``untracked`` once keys were written without presences;
    ``written`` once any were written (until ``reset``)."""

    layer: Any
    incoming: tuple[Tensor, Any] | None = None
    untracked: bool = False
    written: bool = False

    def __getstate__(self) -> dict[str, Any]:
        """The presences pickle with the cache; what was armed for one call does not."""
        return {**self.__dict__, "incoming": None}


class _CarryingMethods:
    """The methods of a presence-carrying layer class (:func:`carrying_class`): every method that
    writes or moves the keys does the same to the presence layer (module docstring). They call
    the original class's method by name: a layer's class can only be swapped for a subclass of
    it alone (a second base changes the instance layout Python allows to swap)."""

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        keys, values = type(self).__base__.update(self, key_states, value_states, *args, **kwargs)
        carried: _Carried = self.__dict__[_CARRIED]
        incoming, carried.incoming = carried.incoming, None
        first_write, carried.written = not carried.written, True
        if incoming is None or incoming[0].shape != key_states.shape[:1] + key_states.shape[2:3]:
            carried.untracked = True
            return keys, values
        p, state = incoming
        if hasattr(self, "record_past"):                 # a sliding window kept for a rollback
            carried.layer.record_past = self.record_past
        column = p[:, None, :, None]                                           # (B, 1, N, 1)
        p_keys, _ = carried.layer.update(column, column, *args, **kwargs)
        state.keys = p_keys[:, 0, :, 0]                                        # (B, Nk)
        state.first_write = first_write
        return keys, values

    def _mirror(self, name: str, *args: Any) -> None:
        getattr(type(self).__base__, name)(self, *args)
        getattr(self.__dict__[_CARRIED].layer, name)(*args)

    def crop(self, tokens_to_remove: int) -> None:
        self._mirror("crop", tokens_to_remove)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self._mirror("reorder_cache", beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._mirror("batch_repeat_interleave", repeats)

    def batch_select_indices(self, indices: Tensor) -> None:
        self._mirror("batch_select_indices", indices)

    def reset(self) -> None:
        self._mirror("reset")
        self.__dict__[_CARRIED].untracked = self.__dict__[_CARRIED].written = False

    def offload(self) -> None:
        self._mirror("offload")

    def prefetch(self) -> None:
        self._mirror("prefetch")


_METHODS = {name: value for name, value in vars(_CarryingMethods).items()
            if callable(value) and not name.startswith("__")}


def carrying_class(original: type) -> type:
    """``original``'s presence-carrying subclass, created once and published in this module
    under a name that encodes ``original`` (so a carrying cache pickles, and loads in a fresh
    process through :func:`__getattr__`)."""
    name = f"Carrying_{_path(original).encode().hex()}"
    if name not in globals():
        globals()[name] = type(f"Carrying{original.__name__}", (original,),
                               {**_METHODS, "__module__": __name__, "__qualname__": name})
    return globals()[name]


def __getattr__(name: str) -> type:
    """Rebuild a pickled carrying class from its encoded name (:func:`carrying_class`)."""
    head, _, code = name.partition("_")
    try:
        if head != "Carrying":
            raise ValueError(name)
        return carrying_class(_import(bytes.fromhex(code).decode()))
    except (ValueError, ImportError, AttributeError):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _presence_layer(layer: Any) -> Any:
    """A fresh, empty layer of ``layer``'s kind (its settings: window, maximum length; none of
    its tensors). A quantized layer's presences are kept unquantized, in a dynamic layer: it
    returns its keys in the order they were written."""
    from transformers import cache_utils
    # the quantized layers' base: BaseQuantizedLayer from transformers 5.x's later releases,
    # QuantizedLayer before
    quantized = tuple(getattr(cache_utils, name) for name in
                      ("BaseQuantizedLayer", "QuantizedLayer") if hasattr(cache_utils, name))
    if isinstance(layer, quantized):
        return cache_utils.DynamicLayer()
    tensors = {id(t): None for t in vars(layer).values() if isinstance(t, Tensor) and t.dim()}
    fresh = copy.deepcopy(layer, tensors)
    fresh.keys = fresh.values = None
    fresh.is_initialized = False
    return fresh


def _layer(cache: Any, index: int) -> Any:
    """The layer of ``cache`` (the self-attention part of an encoder-decoder cache) that keys at
    ``index`` are written to, appended as the cache's own ``update`` would append it."""
    cache = getattr(cache, "self_attention_cache", cache)
    replicate = getattr(cache, "layer_class_to_replicate", None)
    while replicate is not None and len(cache.layers) <= index:
        cache.layers.append(replicate())
    layers = getattr(cache, "layers", None)
    return layers[index] if layers is not None and index < len(layers) else None


def expect_keys(cache: Any, index: int, p: Tensor, state: Any) -> bool:
    """Arm layer ``index`` of ``cache`` with the presences ``p`` (B, N) of the tokens the next
    ``update`` writes, which then sets ``state.keys`` to the presences of every key it returns.
    False where the layer keeps no keys (a layer without attention, a shared-KV layer): the
    caller keeps ``p`` as the keys' presences when the layer is empty. Refuses a layer that holds
    keys written without presences (:data:`UNSEEN`)."""
    from transformers.cache_utils import CacheLayerMixin
    layer = _layer(cache, index)
    if not isinstance(layer, CacheLayerMixin):
        return False
    carried = layer.__dict__.get(_CARRIED)
    if carried is None:
        if layer.get_seq_length() > 0:
            raise RetrofitError(UNSEEN)
        carried = _Carried(_presence_layer(layer))
        layer.__class__ = carrying_class(type(layer))
        layer.__dict__[_CARRIED] = carried
    elif carried.untracked:
        raise RetrofitError(UNSEEN)
    carried.incoming = (p, state)
    return True
