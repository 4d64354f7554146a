"""The TabPFN model versions, in one table: what each is, where tabpfn ships it, and whether the
host retrofits it (and with which sites) or refuses it, with the reason.

=========  ==============================  ==========  =========  ==================================
version    class (``tabpfn.architectures``)  first       sites      status
                                           release
=========  ==============================  ==========  =========  ==================================
v2         ``tabpfn_v2.TabPFNV2``          8.1.0       ``v2_5``   retrofitted (v2.5's layout, no
                                                                  thinking rows)
v2.5       ``tabpfn_v2_5.TabPFNV2p5``      8.0.1       ``v2_5``   retrofitted
v2.6       ``tabpfn_v2_6.TabPFNV2p6``      8.0.1       ``v2_5``   retrofitted (v2.5 with RMSNorm)
v3         ``tabpfn_v3.TabPFNV3``          8.0.1       ``v3``     retrofitted
v3.5       ``tabpfn_v3_5.TabPFNV3p5``      9.0.0       ``v3_5``   retrofitted (also v3.5-fast, the
                                                                  same class)
v2 PFT     ``base.transformer.             2.0.0       none       refused: tabpfn 2.x–7.x's
           PerFeatureTransformer``                                architecture of v2, v2.5; tabpfn
                                                                  8.1.0+ loads their checkpoints as
                                                                  ``TabPFNV2`` / ``TabPFNV2p5``
=========  ==============================  ==========  =========  ==================================

The ``v2 PFT`` row (``PerFeatureTransformer``, which tabpfn 2.0 defines in
``tabpfn.model.transformer``) is there to refuse tabpfn 2.x–7.x's models by name, with the fix.
A model of any other class under ``tabpfn.architectures`` (a version a later tabpfn adds) is
refused with the versions that are supported. Inside a retrofitted version every module must be
of a type the version's row lists (``modules``): the types its sites gate, the token-local ones
(projections, MLP layers, norms inside a gated branch) and the containers; any other module (a
type a later release adds to the architecture) is refused by its path and class, never left
ungated.

Some keys of an architecture config set only how a release chunks inference in memory, not what
the model computes, and releases differ in which they have (:data:`CHUNKING_KEYS`: tabpfn 9.1.0
replaced ``inference_row_chunk_size`` by ``inference_chunk_cells`` and the batch budgets). Such a
key at its default value is dropped where the installed release does not know it (the release
chunks its own way, and the function is the same), so a checkpoint written by one release loads
on the others; at any other value it is refused like every key a release does not know.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..._surgery.host import RetrofitError, Site
from .releases import PER_FEATURE_REFUSAL, installed_version

__all__ = ["ModelVersion", "VERSIONS", "version_of", "is_vendor_class", "supported",
           "check_modules", "architecture", "CHUNKING_KEYS", "droppable_keys",
           "version_of_checkpoint", "version_from_name", "other_task_sites"]

# torch.nn types that are token-local or containers (never a token boundary)
_TORCH_LOCAL = frozenset({"Linear", "GELU", "Sequential", "ModuleList", "ModuleDict", "LayerNorm",
                          "RMSNorm", "Embedding", "Identity", "Dropout"})
_V3_MODULES = frozenset({
    "TabPFNV3", "Attention", "ColumnAggregator", "CrossAttention", "CrossAttentionBlock",
    "FeatureDistributionEmbedder", "ICLAttention", "ICLTransformerBlock",
    "InducedSelfAttentionBlock", "MLP", "ManyClassDecoder", "RotaryEmbedding",
    "SoftmaxScalingMLP", "TrainableOrthogonalEmbedding", "TransformerBlock",
    "_DtypeMatchingRMSNorm"})
# Architecture-config keys that set only inference's memory chunking, with their default value
# (module docstring): ``inference_row_chunk_size`` in tabpfn 8.0.1-9.0.0, the others from 9.1.0.
CHUNKING_KEYS: dict[str, Any] = {"inference_row_chunk_size": 2048,
                                 "inference_chunk_cells": 2048 * 768,
                                 "max_batched_estimator_rows": 32_768,
                                 "max_batched_estimator_cells": 768 * 1_000_000}
# where tabpfn's releases define their model classes (tabpfn.model: 2.0's PerFeatureTransformer)
_VENDOR_PACKAGES = ("tabpfn.architectures.", "tabpfn.model.")
_V2_5_MODULES = frozenset({"AddThinkingRows", "AlongColumnAttention", "AlongRowAttention",
                           "TabPFNBlock"})


@dataclass(frozen=True)
class ModelVersion:
    """One row: ``label`` (tabpfn's ``ModelVersion`` value), the architecture ``module`` and
    model ``cls`` (``architecture_name`` in a checkpoint is the module's last part;
    ``older_modules``: where older releases define it),
    ``first_release`` (the oldest tabpfn that ships it), ``sites`` (the module under
    ``oretrofit.hosts.tabpfn`` whose ``sites(model)`` lists them; None = refused),
    ``refusal`` (why not, for a refused row) and ``modules`` (the tabpfn module types the
    sites account for)."""

    label: str
    module: str
    # (in the table's field order; ``names``: the file-name identifiers tabpfn reads)
    cls: str
    first_release: str
    sites: str | None = None
    refusal: str = ""
    modules: frozenset[str] = frozenset()
    names: tuple[str, ...] = ()
    older_modules: tuple[str, ...] = ()

    @property
    def defining_modules(self) -> tuple[str, ...]:
        """Where a release may define ``cls``: ``module``, or in older releases
        ``older_modules`` (tabpfn 2.0 defines PerFeatureTransformer in ``tabpfn.model``)."""
        return (self.module, *self.older_modules)

    @property
    def architecture_name(self) -> str:
        return self.module.rsplit(".", 1)[1]


VERSIONS: tuple[ModelVersion, ...] = (
    ModelVersion("v2", "tabpfn.architectures.tabpfn_v2", "TabPFNV2", "8.1.0", sites="v2_5",
                 modules=(_V2_5_MODULES - {"AddThinkingRows"}) | {"TabPFNV2",
                                                                  "LowerPrecisionLayerNorm"}),
    ModelVersion("v2.5", "tabpfn.architectures.tabpfn_v2_5", "TabPFNV2p5", "8.0.1",
                 sites="v2_5", modules=_V2_5_MODULES | {"TabPFNV2p5", "LowerPrecisionLayerNorm"},
                 names=("v2.5",)),
    ModelVersion("v2.6", "tabpfn.architectures.tabpfn_v2_6", "TabPFNV2p6", "8.0.1",
                 sites="v2_5", modules=_V2_5_MODULES | {"TabPFNV2p6", "LowerPrecisionRMSNorm"},
                 names=("v2.6",)),
    ModelVersion("v3", "tabpfn.architectures.tabpfn_v3", "TabPFNV3", "8.0.1", sites="v3",
                 modules=_V3_MODULES, names=("v3",)),
    ModelVersion("v3.5", "tabpfn.architectures.tabpfn_v3_5", "TabPFNV3p5", "9.0.0",
                 sites="v3_5", modules=(_V3_MODULES - {"TabPFNV3"}) | {
                     "TabPFNV3p5", "FourierFeatureGroupEmbedder",
                     "FourierPlusMetadataFeatureGroupEmbedder", "MultiTaskHeads",
                     "_PreHeadMLP"}, names=("v3.5-fast", "v3.5")),
    ModelVersion("v2 PFT", "tabpfn.architectures.base.transformer", "PerFeatureTransformer",
                 "2.0.0", refusal=PER_FEATURE_REFUSAL,
                 older_modules=("tabpfn.model.transformer",)),
)


def is_vendor_class(cls: type) -> bool:
    """Whether ``cls`` is one of tabpfn's model architecture classes (any release's)."""
    return cls.__module__.startswith(_VENDOR_PACKAGES)


def supported() -> str:
    """The supported versions, for messages: ``v2 (TabPFNV2, tabpfn 8.1.0+), …``."""
    return ", ".join(f"{v.label} ({v.cls}, tabpfn {v.first_release}+)"
                     for v in VERSIONS if v.sites)


def version_of(model: nn.Module) -> ModelVersion:
    """The row of ``model``'s class (its vendor class, also under an O-subclass); refused when
    the class is not one of the table or the row is refused."""
    vendor = next((c for c in type(model).__mro__ if is_vendor_class(c)), type(model))
    name = f"{vendor.__module__}.{vendor.__name__}"
    row = next((v for v in VERSIONS
                if vendor.__module__ in v.defining_modules and vendor.__name__ == v.cls), None)
    if row is None:
        raise RetrofitError(f"{name} is not supported: it is no TabPFN model version oretrofit "
                            f"knows (a later tabpfn?); supported: {supported()}")
    if row.sites is None:
        raise RetrofitError(f"{name} (TabPFN {row.label}) is not supported: {row.refusal}; "
                            f"supported: {supported()}")
    return row


def check_modules(model: nn.Module, row: ModelVersion) -> None:
    """Refuse a module of a type the version's sites do not account for, by path and class."""
    for path, module in model.named_modules():
        cls = next((c for c in type(module).__mro__ if c.__module__.startswith(("tabpfn.",
                                                                               "torch."))),
                   type(module))
        known = row.modules if cls.__module__.startswith("tabpfn.") else _TORCH_LOCAL
        if cls.__name__ not in known:
            raise RetrofitError(
                f"TabPFN {row.label}: module {path or '(model)'} of type {cls.__module__}."
                f"{cls.__name__} is not one the host can gate (a newer tabpfn's addition?); "
                "it would be left ungated, so the model is refused")


def architecture(row: ModelVersion) -> Any:
    """The tabpfn module of ``row`` (``parse_config``, ``get_architecture``); refused naming the
    release that first ships it when the installed tabpfn is older."""
    try:
        return importlib.import_module(row.module)
    except ModuleNotFoundError:
        raise RetrofitError(f"TabPFN {row.label} ships from tabpfn {row.first_release}; tabpfn "
                            f"{installed_version()} is installed: pip install "
                            f"'tabpfn>={row.first_release}'") from None


def droppable_keys(unknown: dict[str, Any]) -> set[str]:
    """The keys of ``unknown`` (config keys the installed release does not know, with their
    values) that are :data:`CHUNKING_KEYS` at their default value: dropping them changes only
    how inference is chunked (module docstring)."""
    return {key for key, value in unknown.items()
            if key in CHUNKING_KEYS and not isinstance(value, bool)
            and value == CHUNKING_KEYS[key]}


def sites(model: nn.Module, row: ModelVersion) -> list[Site]:
    """The named sites of ``model`` (a supported row)."""
    return importlib.import_module(f"{__package__}.{row.sites}").sites(model)


def other_task_sites(model: nn.Module, task: str) -> list[str]:
    """The sites of ``model`` that only a task other than ``task`` runs (the sites module's
    ``TASK_SITES``; v3.5's heads serve one task each, so a v3.5 regressor never runs
    ``head.cls.*`` or ``dec``); empty for a version whose sites all serve its one task."""
    row = version_of(model)
    table = getattr(importlib.import_module(f"{__package__}.{row.sites}"), "TASK_SITES", {})
    return [name for other, names in table.items() if other != task for name in names]


def version_of_checkpoint(architecture_name: str) -> ModelVersion:
    """The row of a checkpoint's ``architecture_name`` (how tabpfn picks the architecture),
    refused like :func:`version_of`."""
    row = next((v for v in VERSIONS if v.architecture_name == architecture_name), None)
    if row is None:
        raise RetrofitError(f"checkpoint architecture {architecture_name!r} is no TabPFN model "
                            f"version oretrofit knows; supported: {supported()}")
    if row.sites is None:
        raise RetrofitError(f"checkpoint architecture {architecture_name!r} (TabPFN "
                            f"{row.label}) is not supported: {row.refusal}; supported: "
                            f"{supported()}")
    return row


def version_from_name(file_name: str, refuse: bool = True) -> ModelVersion:
    """The version tabpfn reads from a checkpoint's file name (``model_loading.
    _resolve_model_version``): the most specific identifier it contains ("v3.5-fast" and
    "v3.5" before "v2.6", "v2.5" and "v3"), else v2; refused like :func:`version_of`."""
    order = sorted(((name, v) for v in VERSIONS for name in v.names),
                   key=lambda item: (-len(item[0]), item[0]))
    row = next((v for name, v in order if name in file_name), VERSIONS[0])
    if refuse and row.sites is None:
        raise RetrofitError(f"{file_name}: tabpfn reads it as a TabPFN {row.label} checkpoint "
                            f"(from the file name), which is not supported: {row.refusal}; "
                            f"supported: {supported()}")
    return row
