"""What differs between the tabpfn releases the TabPFN host supports, in one place (what
differs between model versions is in :mod:`oretrofit.hosts.tabpfn.versions`).

The installed version is read once. The architecture the O-mixins patch is the same in every
supported release except for what is supplied here or passed through unchanged:

=====================  =====================================  ==================================
what                   8.0.1 (and the releases named)         later
=====================  =====================================  ==================================
ICL block call         ``attention_backend=`` kwarg (8.0.1)   none (the mixin passes any extra
                                                              kwarg through to the unpatched
                                                              attention: the caller's backend)
in-memory model spec   ``tabpfn.base.RegressorModelSpecs``    ``tabpfn.ModelSpecs`` (9.1.0+)
                       with its required criterion
checkpoint writing     no ``tabpfn.checkpoint``: .ckpt only   ``save_as_safetensors``
``TabPFNV3.config``    absent (8.0.x): set from the           set by tabpfn
                       checkpoint's config
``load_model``         no ``estimator_type`` (< 8.5.0)        ``estimator_type=``
``SoftmaxScalingMLP``  (B, H, S, D) (8.0.1)                   (B, S, H, D); the O path computes
                                                              the scale itself, on (B, S, H, D)
classifier decoder     takes the train embeddings (< 8.5.0)   takes their projected keys
KV cache quantization  none (8.0.1); always int8              the estimator's
                       (8.0.2–8.1.x)                          ``kv_cache_precision``
                                                              (8.2.0+; "auto" keeps the dtype)
inference-config       fewer fields (8.x lacks 6 to 9 of      :data:`INFERENCE_FIELDS`
fields                 tabpfn 9's)                            translates them
=====================  =====================================  ==================================

A checkpoint written by a later tabpfn carries inference-config fields an older release's
``InferenceConfig`` lacks (tabpfn builds ``InferenceConfig(**stored)`` and would fail).
:data:`INFERENCE_FIELDS` says how the older release reaches each such setting: by an estimator
argument of its own (the stored value becomes that argument's default, but a value that
leaves the count to the estimator, N_ESTIMATORS "auto", leaves its own default), by behaving so
with the field absent (dropped only at that value), or not at all when another field makes it
unread (dropped only then). Any other field, or value, is refused by name.

The gate admits exactly :data:`TESTED_RELEASES`, the rows of ``results/tabpfn-compat.md`` that
pass (``scripts/tabpfn_compat.py`` runs the checks on each release in its own environment); the
rows of older releases (2.x to 7.x) show each refused by name.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Literal

from torch import Tensor, nn

from ..._files.provenance import package_version
from ..._surgery.host import RetrofitError

__all__ = ["TESTED_RELEASES", "installed_version", "check_release", "require_tested_release",
           "model_specs", "load_model_kwargs", "save_safetensors", "ensure_config",
           "decoder_keys", "kv_cache_entry", "bar_distribution", "always_quantizes_cache",
           "cache_options", "INFERENCE_FIELDS", "translate_inference_config", "same_setting",
           "QUANTIZED_CACHE_REFUSAL", "PER_FEATURE_REFUSAL"]

TESTED_RELEASES: tuple[str, ...] = (
    "8.0.1", "8.0.2", "8.0.3", "8.0.4", "8.0.5", "8.0.6", "8.0.7", "8.0.8", "8.1.0", "8.2.0",
    "8.3.0", "8.4.0", "8.5.0", "9.0.0", "9.1.0", "9.2.0")
Task = Literal["regressor", "classifier"]
PER_FEATURE_REFUSAL = (
    "tabpfn 2.x to 7.x build TabPFN v2 and v2.5 as PerFeatureTransformer, which the host does "
    "not retrofit; tabpfn 8.1.0 and later load the same checkpoints as TabPFNV2 and TabPFNV2p5, "
    f"which it does: pip install 'tabpfn>=8.1.0,<={TESTED_RELEASES[-1]}'")
QUANTIZED_CACHE_REFUSAL = (
    "this TabPFN v3 KV cache is quantized; the train rows' presences travel in it and must "
    "keep their precision under 'oa'/'full-o': pass kv_cache_precision='auto' (tabpfn 8.2.0+), "
    "or use fit_mode='fit_preprocessors' (tabpfn 8.0.2 to 8.1.x always quantize the cache)")


# An inference-config field a release may lack -> how that release reaches its setting:
# ("argument", (name, own)): the estimator's argument ``name`` means the same (tabpfn 9 documents
#     both as one setting), but at ``own`` the field leaves the estimator's own default (tabpfn
#     9's N_ESTIMATORS "auto": the count as before the field existed);
# ("builtin", value): without the field the release behaves as the field at ``value``;
# ("unread_when", (field, value)): tabpfn reads the field only when ``field`` is not ``value``.
INFERENCE_FIELDS: dict[str, tuple[str, Any]] = {
    "N_ESTIMATORS": ("argument", ("n_estimators", "auto")),
    "SOFTMAX_TEMPERATURE": ("argument", ("softmax_temperature", None)),
    "MAX_CPU_SAMPLES": ("builtin", 1000),       # 8.0.x-8.1.0 refuse over 1000 rows on the CPU
    "PASSTHROUGH_INF": ("builtin", False),     # 8.0.x reject infinities at input validation
    "TRANSFORM_DATES": ("builtin", False),     # no 8.x expands datetime columns
    "TRANSFORM_TEXT": ("builtin", False),      # nor text columns
    "MIN_CARDINALITY_FOR_TEXT": ("unread_when", ("TRANSFORM_TEXT", False)),
    "TEXT_N_COMPONENTS": ("unread_when", ("TRANSFORM_TEXT", False)),
    "SAMPLE_SUBSAMPLING_METHOD": ("unread_when", ("SUBSAMPLE_SAMPLES", None)),
}


@functools.cache
def installed_version() -> str | None:
    """The installed tabpfn version (read once), or None when tabpfn is not installed."""
    return package_version("tabpfn")


def check_release(version: str | None) -> None:
    """Refuse a tabpfn release the host has not been shown to work with, naming the fix: an
    older one (2.x to 7.x build TabPFN v2 and v2.5 as ``PerFeatureTransformer``, which the host
    does not retrofit), a newer one, or none installed."""
    if version in TESTED_RELEASES:
        return
    oldest, newest = TESTED_RELEASES[0], TESTED_RELEASES[-1]
    fix = f"pip install 'tabpfn>={oldest},<={newest}' (or pip install 'oretrofit[tabpfn]')"
    if version is None:
        raise RetrofitError(f"the TabPFN host needs tabpfn {oldest} to {newest}, and tabpfn is "
                            f"not installed: {fix}")
    if _major(version) < _major(oldest):
        raise RetrofitError(f"tabpfn {version} is older than the TabPFN host supports ({oldest} "
                            f"to {newest}): {PER_FEATURE_REFUSAL}")
    raise RetrofitError(f"tabpfn {version} is not supported by the TabPFN host: it is tested on "
                        f"tabpfn {oldest} to {newest} only, and {version} is not one of those "
                        f"releases: {fix}")


def _major(version: str) -> int:
    """The major release number of ``version`` (``7`` for ``7.1.1``; ``-1`` when it has none)."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else -1


def require_tested_release() -> None:
    """Refuse the installed tabpfn before any of tabpfn's modules is imported (an older release
    lacks some: ``tabpfn.inference_config`` before 6.0), unless it is a tested release."""
    check_release(installed_version())


def _has_model_specs() -> bool:
    import tabpfn
    return hasattr(tabpfn, "ModelSpecs")


def model_specs(model: nn.Module, config: Any, inference_config: Any, task: Task,
                borders: Tensor | None = None) -> Any:
    """The in-memory model spec a ``TabPFNRegressor``/``TabPFNClassifier`` takes as model_path.

    ``borders``: the regression bucket borders a v2.x checkpoint stores as criterion state
    (``criterion.borders``); v3 and later carry them as the model's ``regression_borders``.
    9.1.0+: ``tabpfn.ModelSpecs`` (the criterion from ``borders`` when given, else tabpfn
    builds it from ``regression_borders``). Before: ``tabpfn.base.{Regressor,Classifier}
    ModelSpecs``, with the criterion tabpfn's own loader builds,
    ``FullSupportBarDistribution(borders)``.
    """
    if _has_model_specs():
        from tabpfn import ModelSpecs
        criterion = ({"norm_criterion": bar_distribution()(borders)}
                     if borders is not None and task == "regressor" else {})
        return ModelSpecs(model=model, architecture_config=config,
                          inference_config=inference_config, **criterion)
    from tabpfn import base
    if task == "classifier":
        return base.ClassifierModelSpecs(model, config, inference_config)
    return base.RegressorModelSpecs(model, config, inference_config, bar_distribution()(
        model.regression_borders if borders is None else borders))


def bar_distribution() -> type:
    """tabpfn's ``FullSupportBarDistribution`` (the regression criterion), where it lives."""
    for module in ("tabpfn.architectures.shared.bar_distribution",
                   "tabpfn.architectures.base.bar_distribution"):
        if importlib.util.find_spec(module) is not None:
            return importlib.import_module(module).FullSupportBarDistribution
    raise RetrofitError(f"tabpfn {installed_version()} has no FullSupportBarDistribution")


def load_model_kwargs(task: Task) -> dict[str, str]:
    """Extra keyword arguments of ``tabpfn.model_loading.load_model`` for ``task``."""
    from tabpfn.model_loading import load_model
    return ({"estimator_type": task} if "estimator_type" in inspect.signature(load_model).parameters
            else {})


def save_safetensors(checkpoint: dict[str, Any], path: str | Path) -> None:
    """tabpfn's ``save_as_safetensors``; refused where the release has none (and reads none)."""
    if importlib.util.find_spec("tabpfn.checkpoint") is None:
        raise RetrofitError(f"tabpfn {installed_version()} neither reads nor writes .safetensors "
                            "checkpoints; write a .ckpt instead, or pip install "
                            f"'tabpfn=={TESTED_RELEASES[-1]}'")
    from tabpfn.checkpoint import save_as_safetensors
    save_as_safetensors(checkpoint, path)


def translate_inference_config(stored: dict[str, Any], known: frozenset[str] | None = None
                               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(fields, arguments)``: the stored inference config cut to the fields ``known`` (default:
    the installed ``InferenceConfig``'s), and the estimator arguments that carry the settings of
    the fields it lacks (:data:`INFERENCE_FIELDS`). A field the release lacks that the table
    does not translate at its stored value is refused by name: dropping it would run the
    release's own setting instead of the checkpoint's."""
    if known is None:
        from dataclasses import fields

        from tabpfn.inference_config import InferenceConfig
        known = frozenset(f.name for f in fields(InferenceConfig))
    arguments, refused = {}, []
    for name in sorted(set(stored) - known):
        kind, how = INFERENCE_FIELDS.get(name, ("", None))
        if kind == "argument":
            if not same_setting(stored[name], how[1]):
                arguments[how[0]] = stored[name]
        elif not ((kind == "builtin" and same_setting(stored[name], how)) or
                  (kind == "unread_when" and how[0] in stored
                   and same_setting(stored[how[0]], how[1]))):
            refused.append(f"{name}={stored[name]!r}")
    if refused:
        raise RetrofitError(f"the checkpoint's inference config has fields tabpfn "
                            f"{installed_version()} does not know and cannot express another "
                            f"way ({', '.join(refused)}); it was written by a newer tabpfn: "
                            f"pip install -U 'tabpfn>=9,<={TESTED_RELEASES[-1]}'")
    return {k: v for k, v in stored.items() if k in known}, arguments


def same_setting(value: Any, expected: Any) -> bool:
    """``value`` is ``expected`` with its type (``False`` is not ``0``, ``1000.0`` not ``1000``)."""
    return type(value) is type(expected) and value == expected


def ensure_config(model: nn.Module, config: Any) -> nn.Module:
    """Give ``model`` its architecture config as ``model.config`` where tabpfn does not."""
    if getattr(model, "config", None) is None:
        model.config = config
    return model


def decoder_keys(decoder: nn.Module, train: Tensor) -> Tensor:
    """The many-class decoder's train keys ``(B, N, H, D)`` from what the release hands it:
    the train embeddings ``(B, N, E)`` before 8.5.0, their projected keys from 8.5.0 on."""
    if train.dim() == 4:
        return train
    keys = decoder.k_projection(train)                                       # (B, N, H·D)
    return keys.view(*keys.shape[:2], decoder.num_heads, decoder.head_dim)


def kv_cache_entry(key: Tensor, value: Tensor) -> Any:
    """The release's ``KVCacheEntry(key, value)``."""
    from tabpfn.architectures.kv_cache import KVCacheEntry
    return KVCacheEntry(key=key, value=value)


def always_quantizes_cache(estimator: type) -> bool:
    """Whether this release quantizes every v3 KV cache with no option to keep its dtype
    (tabpfn 8.0.2–8.1.x: quantized entries exist, ``kv_cache_precision`` does not)."""
    from tabpfn.architectures import kv_cache
    return (hasattr(kv_cache, "QuantizedKVCacheEntry")
            and "kv_cache_precision" not in inspect.signature(estimator.__init__).parameters)


def cache_options(estimator: type, options: dict[str, Any]) -> dict[str, Any]:
    """Estimator options for ``fit_mode='fit_with_cache'`` under O: the cache must keep its
    dtype (the train rows' presences travel in it). ``kv_cache_precision`` defaults to "auto"
    where the estimator has it (8.2.0+); a quantized choice, or a release that always
    quantizes (8.0.2–8.1.x), is refused."""
    if always_quantizes_cache(estimator):
        raise RetrofitError(f"tabpfn {installed_version()}: {QUANTIZED_CACHE_REFUSAL}")
    if "kv_cache_precision" not in inspect.signature(estimator.__init__).parameters:
        return options                                    # 8.0.1: no quantization at all
    if options.get("kv_cache_precision", "auto") not in ("auto", None):
        raise RetrofitError(QUANTIZED_CACHE_REFUSAL)
    return {**options, "kv_cache_precision": "auto"}
