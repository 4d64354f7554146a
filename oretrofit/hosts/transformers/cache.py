"""Presences that live in transformers' KV cache, next to the keys they belong to.

A cached key keeps the presence ρτ of the token it came from: the retrofitted attention needs it
at every later call. Each cache layer the retrofitted model writes (any ``CacheLayerMixin``:
dynamic, static, sliding-window, offloaded, hybrid) carries a *presence layer*: a fresh layer of
its own kind whose "keys" are the presences ``(B, 1, N, 1)`` (a quantized layer's is a dynamic
one: its keys are quantized, the presences are not, so a null token's stays exactly 0).
Whatever the cache layer does to its keys it does to the presences with the same code (a
dynamic layer's append, a concatenation, made once for the presences' keys and values alike:
:func:`_append`), so they sit in the same slots: written by
``update`` (a static cache's slot positions, a sliding window's roll), moved by ``crop``,
``reorder_cache`` (beam search), ``batch_select_indices``, ``batch_repeat_interleave``,
``reset``, ``offload`` / ``prefetch``, and copied with the layer by ``copy.deepcopy`` and pickle.
A static cache's unfilled slots hold presence 0, and the model's mask hides them as well.

The carrier hook arms the layer with the presences of the tokens about to be written
(:func:`expect_keys`); the layer's ``update`` writes them and hands the presences of every key it
returns to the attention site's :class:`~.capture.CarrierPresence`. Keys written without
presences (by the model before it was retrofitted, or after the retrofit was taken off) mark the
layer untracked, and the retrofit refuses it.

A layer gets its presence layer (its class swapped for the carrying one) before the model's
forward, by :func:`carry_presences` on the cache the model is called with; a lazily grown cache
appends carrying layers itself, and a cache the forward creates is given them at its first
write. ``torch.compile`` guards on each layer's class: swapped in the same place at every call,
it compiles a shape once, and the swap itself traces (no graph break).

transformers 4.54-4.55 append a lazily grown cache's layers from ``Cache.layer_classes`` and
allocate a static layer's keys up front; 4.53 has no cache layers: its cache keeps every layer's
keys itself, and there the cache's class is swapped, its presences kept in a presence cache of
its kind (:class:`_LegacyCarryingMethods`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..._surgery.host import RetrofitError
from ..._surgery.patching import _import, _path

__all__ = ["carrying_class", "carrying_classes", "carry_presences", "carry_presences_hook",
           "cache_of", "expect_keys", "UNSEEN", "UNCROPPABLE"]

_CARRIED = "_oretrofit_presences"        # attribute on a carrying cache layer
UNSEEN = ("the KV cache holds tokens whose presences this retrofit never saw (a cache filled by "
          "the model before it was retrofitted or after the retrofit was taken off); run the "
          "prompt through the retrofitted model with a fresh cache")
UNCROPPABLE = ("{kind} cannot crop its keys (transformers' quantized cache layers are not "
               "croppable: their quantized keys stay as they were, so the presences, kept "
               "unquantized beside them, would no longer match them); crop a dynamic or static "
               "cache (cache_implementation='dynamic' or 'static'), or run the prompt again with "
               "a fresh cache")


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


def _write(carried: _Carried, key_states: Tensor, update: Any) -> None:
    """Write the presences armed for ``key_states`` (B, H, N, D) as the column (B, 1, N, 1)
    through ``update`` (which returns the presences of every key, (B, 1, Nk, 1)), and hand them
    to the site's state; keys written without presences mark ``carried`` untracked."""
    incoming, carried.incoming = carried.incoming, None
    first_write, carried.written = not carried.written, True
    if incoming is None or incoming[0].shape != key_states.shape[:1] + key_states.shape[2:3]:
        carried.untracked = True
        return
    p, state = incoming
    # one view op each way (indexing with None and 0 would dispatch two): a decode step pays
    # them in every layer
    state.keys = update(p.reshape(p.shape[0], 1, p.shape[1], 1)).flatten(1)   # (B, Nk)
    state.first_write = first_write


def _append(layer: Any, column: Tensor, args: tuple, kwargs: dict) -> Tensor:
    """The presences of every key after the presence ``layer`` writes ``column`` as its keys and
    values: its ``update``, except for a dynamic layer holding keys (every decode step's write),
    where that is one ``torch.cat`` along the token axis (transformers 4.54-5.x), made once and
    kept as both (a decode step pays every op in every layer)."""
    from transformers.cache_utils import DynamicLayer
    keys = layer.keys
    if type(layer) is DynamicLayer and isinstance(keys, Tensor) and keys.dim() == 4:
        layer.keys = layer.values = torch.cat([keys, column], dim=-2)
        return layer.keys
    return layer.update(column, column, *args, **kwargs)[0]


class _MirroredMoves:
    """The moves of the keys that both carrying kinds (:class:`_CarryingMethods`,
    :class:`_LegacyCarryingMethods`) do to their presences through their ``_mirror``."""

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self._mirror("reorder_cache", beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._mirror("batch_repeat_interleave", repeats)

    def batch_select_indices(self, indices: Tensor) -> None:
        self._mirror("batch_select_indices", indices)


def _methods(holder: type) -> dict[str, Any]:
    """The methods a carrying class gets: the mirrored moves and ``holder``'s own."""
    return {name: value for cls in (_MirroredMoves, holder) for name, value in vars(cls).items()
            if callable(value) and (name == "__init__" or not name.startswith("__"))}


class _CarryingMethods:
    """The methods of a presence-carrying layer class (:func:`carrying_class`): every method that
    writes or moves the keys does the same to the presence layer (module docstring). They call
    the original class's method through ``_original``: a layer's class can only be swapped for a
    subclass of it alone (a second base changes the instance layout Python allows to swap)."""

    _original: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """A new carrying layer (a lazily grown cache appends them, as its
        ``layer_class_to_replicate``), its presence layer a new layer of the original kind."""
        self._original.__init__(self, *args, **kwargs)
        setattr(self, _CARRIED, _Carried(self._original(*args, **kwargs)))

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        keys, values = self._original.update(self, key_states, value_states, *args, **kwargs)
        carried: _Carried = getattr(self, _CARRIED)
        if hasattr(self, "record_past"):                 # a sliding window kept for a rollback
            carried.layer.record_past = self.record_past
        _write(carried, key_states, lambda column: _append(carried.layer, column, args, kwargs))
        return keys, values

    def _mirror(self, name: str, *args: Any) -> None:
        getattr(self._original, name)(self, *args)
        getattr(getattr(self, _CARRIED).layer, name)(*args)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove and not self.is_croppable and _quantized(self):
            raise RetrofitError(UNCROPPABLE.format(kind=self._original.__name__))
        self._mirror("crop", tokens_to_remove)

    def reset(self) -> None:
        self._mirror("reset")
        carried: _Carried = getattr(self, _CARRIED)
        carried.untracked = carried.written = False

    def offload(self) -> None:
        self._mirror("offload")

    def prefetch(self) -> None:
        self._mirror("prefetch")


_METHODS = _methods(_CarryingMethods)


@dataclass
class _LegacyCarried:
    """transformers 4.53 (no cache layers): a carrying cache's presence cache (a cache of its
    kind whose keys are the presences (B, 1, N, 1)) and each layer's :class:`_Carried`."""

    cache: Any
    layers: dict[int, _Carried]


class _LegacyCarryingMethods:
    """transformers 4.53 keeps every layer's keys in the cache object itself (``key_cache``
    lists; cache layers came in 4.54): there the cache's class is swapped for a carrying one
    whose methods do to its presence cache what they do to its keys, as a carrying layer's do
    (:class:`_CarryingMethods`)."""

    _original: type

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int,
               cache_kwargs: Any = None) -> tuple[Tensor, Tensor]:
        keys, values = self._original.update(self, key_states, value_states, layer_idx,
                                             cache_kwargs)
        legacy: _LegacyCarried = getattr(self, _CARRIED)
        carried = legacy.layers.setdefault(layer_idx, _Carried(None))
        _write(carried, key_states, lambda column: legacy.cache.update(
            column, column, layer_idx, cache_kwargs)[0])
        return keys, values

    def _mirror(self, name: str, *args: Any) -> None:
        getattr(self._original, name)(self, *args)
        getattr(getattr(self, _CARRIED).cache, name)(*args)

    def crop(self, max_length: int) -> None:
        self._mirror("crop", max_length)

    def reset(self) -> None:
        self._mirror("reset")
        getattr(self, _CARRIED).layers.clear()


_LEGACY_METHODS = _methods(_LegacyCarryingMethods)


def _layer_mixin() -> type | None:
    """transformers' base class of cache layers, where it keeps the keys in cache layers (4.54
    on); None where it keeps them in the cache (4.53). One import: every layer's capture asks
    at every call."""
    from transformers import cache_utils
    return getattr(cache_utils, "CacheLayerMixin", None)


def _presence_cache(cache: Any) -> Any:
    """transformers 4.53: a fresh cache of ``cache``'s kind for the presences, every list of key
    or value tensors the cache allocated up front (a static or sliding-window cache) allocated
    as columns (B, 1, L, 1); a quantized cache's presences are kept unquantized, in a dynamic
    cache."""
    from transformers import cache_utils
    if isinstance(cache, cache_utils.QuantizedCache):
        return cache_utils.DynamicCache()
    fresh = object.__new__(type(cache))
    for name, value in vars(cache).items():
        if isinstance(value, list) and all(isinstance(t, Tensor) for t in value):
            value = [t.new_zeros(t.shape[0], 1, t.shape[2], 1) if t.dim() == 4 else t.clone()
                     for t in value]
        setattr(fresh, name, value)
    return fresh


def _carry_legacy(cache: Any, index: int = 0) -> None:
    """transformers 4.53: ``cache`` carrying presences (its class swapped for the carrying one),
    unless it does already or its layer ``index`` holds keys written without them (refused by
    :func:`expect_keys`; layers a partial retrofit leaves alone may hold keys already)."""
    if getattr(cache, _CARRIED, None) is not None or cache.get_seq_length(index) > 0:
        return
    presences = _LegacyCarried(_presence_cache(cache), {})
    cache.__class__ = carrying_class(type(cache))
    setattr(cache, _CARRIED, presences)


def _expect_legacy(cache: Any, index: int, p: Tensor, state: Any) -> bool:
    """:func:`expect_keys` in transformers 4.53."""
    _carry_legacy(cache, index)
    legacy: _LegacyCarried | None = getattr(cache, _CARRIED, None)
    if legacy is not None and index not in legacy.layers and cache.get_seq_length(index) > 0:
        legacy = None                   # keys written to the layer before the cache carried any
    carried = legacy.layers.setdefault(index, _Carried(None)) if legacy is not None else None
    if carried is None or carried.untracked:
        raise RetrofitError(UNSEEN)
    carried.incoming = (p, state)
    return True


_CLASSES: dict[type, type] = {}          # original layer class -> its carrying class


def carrying_class(original: type) -> type:
    """``original``'s presence-carrying subclass, created once and published in this module
    under a name that encodes ``original`` (so a carrying cache pickles, and loads in a fresh
    process through :func:`__getattr__`)."""
    if original not in _CLASSES:
        name = f"Carrying_{_path(original).encode().hex()}"
        if name not in globals():
            methods = _METHODS if _layer_mixin() is not None else _LEGACY_METHODS
            globals()[name] = type(f"Carrying{original.__name__}", (original,),
                                   {**methods, "_original": original, "__module__": __name__,
                                    "__qualname__": name})
        _CLASSES[original] = globals()[name]
    return _CLASSES[original]


def carrying_classes() -> None:
    """Create the carrying class of every cache layer class transformers defines, before any
    compiled call needs one (naming a new class is not traceable); in transformers 4.53 (no
    cache layers) a cache's class is made when it is first carried."""
    mixin = _layer_mixin()
    if mixin is None:
        return
    pending = [mixin]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if cls.__module__ != __name__:
            carrying_class(cls)


def __getattr__(name: str) -> type:
    """Rebuild a pickled carrying class from its encoded name (:func:`carrying_class`)."""
    head, _, code = name.partition("_")
    try:
        if head != "Carrying":
            raise ValueError(name)
        return carrying_class(_import(bytes.fromhex(code).decode()))
    except (ValueError, ImportError, AttributeError):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _quantized(layer: Any) -> bool:
    """Whether ``layer`` is one of transformers' quantized cache layers."""
    from transformers import cache_utils
    # the quantized layers' base: BaseQuantizedLayer from transformers 5.x's later releases,
    # QuantizedLayer before
    return isinstance(layer, tuple(getattr(cache_utils, name) for name in
                                   ("BaseQuantizedLayer", "QuantizedLayer")
                                   if hasattr(cache_utils, name)))


def _presence_layer(layer: Any) -> Any:
    """A fresh, empty layer of ``layer``'s kind (its settings: window, maximum length; none of
    its key or value tensors), built attribute by attribute so that a compiled call traces it.
    A quantized layer's presences are kept unquantized, in a dynamic layer: it returns its keys
    in the order they were written."""
    from transformers import cache_utils
    if _quantized(layer):
        return cache_utils.DynamicLayer()
    fresh = object.__new__(type(layer))
    for name, value in vars(layer).items():
        if isinstance(value, Tensor):       # counters (0-D) copied; stored keys/values not
            value = value.clone() if value.dim() == 0 else None
        setattr(fresh, name, value)
    fresh.keys = fresh.values = None
    fresh.is_initialized = False
    keys = getattr(layer, "keys", None)
    if isinstance(keys, Tensor) and keys.dim() == 4:
        # transformers 4.54-4.55: an empty layer holding keys allocated them up front (a static
        # or sliding-window layer), and writes into them in place; the presences get theirs
        fresh.keys = keys.new_zeros(keys.shape[0], 1, keys.shape[2], 1)
        fresh.values = fresh.keys.clone()
    return fresh


def _layer(cache: Any, index: int) -> Any:
    """The layer of ``cache`` (the self-attention part of an encoder-decoder cache) that keys at
    ``index`` are written to, appended as the cache's own ``update`` would append it."""
    cache = getattr(cache, "self_attention_cache", cache)
    replicate = getattr(cache, "layer_class_to_replicate", None)
    while replicate is not None and len(cache.layers) <= index:
        cache.layers.append(replicate())
    if hasattr(cache, "layer_classes"):              # transformers 4.54-4.55
        cache.append_new_layers(index)
    layers = getattr(cache, "layers", None)
    return layers[index] if layers is not None and index < len(layers) else None


def _carry(layer: Any) -> Any:
    """``layer`` carrying presences: itself with its class swapped for the carrying one, or in a
    compiled call a carrying layer with its attributes (Dynamo cannot trace a ``__class__``
    assignment); ``layer`` as it is where it carries them already or holds keys written without
    them (refused by :func:`expect_keys`)."""
    if getattr(layer, _CARRIED, None) is not None or layer.get_seq_length() > 0:
        return layer
    presences, carrying = _Carried(_presence_layer(layer)), carrying_class(type(layer))
    if torch.compiler.is_compiling():
        carried = object.__new__(carrying)
        for name, value in vars(layer).items():
            setattr(carried, name, value)
    else:
        carried, layer.__class__ = layer, carrying
    setattr(carried, _CARRIED, presences)
    return carried


def _carrying_4x(classes: Any) -> Any:
    """transformers 4.54-4.55's lazily appended layer classes (``Cache.layer_classes``: one class
    or one per layer) as carrying classes."""
    if isinstance(classes, list):
        return [_carrying_4x(cls) for cls in classes]
    return carrying_class(classes) if not issubclass(classes, _CarryingMethods) else classes


def carry_presences(cache: Any) -> None:
    """Give every layer of ``cache`` (the self-attention part of an encoder-decoder cache) its
    presence layer before the model's forward, and a lazily grown cache carrying layers to append
    (module docstring). Traceable by ``torch.compile`` once :func:`carrying_classes` ran."""
    cache = getattr(cache, "self_attention_cache", cache)
    mixin = _layer_mixin()
    if mixin is None:
        return _carry_legacy(cache)
    replicate = getattr(cache, "layer_class_to_replicate", None)
    if (isinstance(replicate, type) and issubclass(replicate, mixin)
            and not issubclass(replicate, _CarryingMethods)):
        cache.layer_class_to_replicate = carrying_class(replicate)
    if hasattr(cache, "layer_classes"):
        cache.layer_classes = _carrying_4x(cache.layer_classes)
    layers = getattr(cache, "layers", ())
    for index, layer in enumerate(layers):
        carried = _carry(layer) if isinstance(layer, mixin) else layer
        if carried is not layer:
            layers[index] = carried


def cache_of(args: tuple, kwargs: dict) -> Any:
    """The KV cache a layer is called with: ``cache=`` / ``past_key_values=``, else the
    transformers ``Cache`` among its other arguments (GPT-2's block takes it second,
    GPT-NeoX's as ``layer_past=``); None without one."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is None and "transformers" in sys.modules:
        from transformers import Cache
        cache = next((a for a in (*args, *kwargs.values()) if isinstance(a, Cache)), None)
    return cache


def carry_presences_hook(module: Any, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook on a retrofitted transformers model: :func:`carry_presences` on the
    cache it is called with; a cache given as legacy tuples is refused (:data:`LEGACY`)."""
    cache = cache_of(args, kwargs)
    if isinstance(cache, (tuple, list)):
        raise RetrofitError(LEGACY.format(model=type(module).__name__))
    if cache is not None:
        carry_presences(cache)


LEGACY = ("{model} is called with its KV cache as legacy tuples (what transformers 4.x's "
          "generate passes a model that takes no Cache object): the model builds a new Cache "
          "from them at every call, so the presences of the cached keys are not carried from "
          "one call to the next and the retrofit cannot follow them; call it with "
          "use_cache=False (generate(..., use_cache=False)), or on a transformers release where "
          "{model} takes a Cache")


def expect_keys(cache: Any, index: int, p: Tensor, state: Any) -> bool:
    """Arm layer ``index`` of ``cache`` with the presences ``p`` (B, N) of the tokens the next
    ``update`` writes, which then sets ``state.keys`` to the presences of every key it returns.
    False where the layer keeps no keys (a layer without attention, a shared-KV layer): the
    caller keeps ``p`` as the keys' presences when the layer is empty. Refuses a layer that holds
    keys written without presences (:data:`UNSEEN`). A cache :func:`carry_presences` did not
    reach (one the model's forward creates) gets its presence layers here."""
    mixin = _layer_mixin()
    if mixin is None:
        return _expect_legacy(getattr(cache, "self_attention_cache", cache), index, p, state)
    layer = _layer(cache, index)
    if not isinstance(layer, mixin):
        return False
    carried = getattr(layer, _CARRIED, None)
    if carried is None:
        carry_presences(cache)
        carried = getattr(_layer(cache, index), _CARRIED, None)
    if carried is None or carried.untracked:
        raise RetrofitError(UNSEEN)
    carried.incoming = (p, state)
    return True
