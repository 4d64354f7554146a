"""The TabPFN v3 host: the named sites of a ``TabPFNV3`` model (tabpfn 8.0.1–9.2.x).

Sites, in forward order (``i``/``k`` are block indices; the last column block is ``col.cls``):

=====================  =========  ===========================================================
site                   kind       carrier (presence read from it)
=====================  =========  ===========================================================
te.col                 inject     cell token ``x_embed(x)`` of a train row × column
fde.i.induce1          attention  receivers: inducing vectors; sources: train-row cell tokens
fde.i.induce2          attention  receivers: all rows' cell tokens; sources: inducing hiddens
fde.i.induce{1,2}.norm norm       the block's pre-norm inputs (q, kv and MLP norms)
fde.i.induce{1,2}.ffn  ffn        the block's residual stream before the MLP
col.k.attn             attention  tokens of one row (CLS + columns), self-attention
col.cls                attention  receivers: CLS tokens; sources: CLS + columns (read-out)
col.k.norm / .ffn      norm / ffn the column block's residual stream (``col.cls.*`` last)
col.out_norm           norm       CLS output of the read-out (``out_ln``)
te.icl                 inject     row token (flattened CLS outputs) of a train row
icl.k.attn             attention  receivers: all rows; sources: train rows
icl.k.norm / .ffn      norm / ffn the ICL block's residual stream
icl.out_norm           norm       row token after the last ICL block (``output_norm``)
=====================  =========  ===========================================================

The stage norms ``out_ln`` and ``output_norm`` are gated under ``full-o`` (ONorm, like every
other norm: an RMSNorm would lift a near-null carrier to unit scale). The regression decoder
(``output_projection``) is a per-row read-out, not a token boundary, and is left as is; so is
the classifier's many-class retrieval decoder.
"""

from __future__ import annotations

import functools
import importlib.metadata as _md
import re
import sys
from typing import Callable

from torch import nn

from .._patching import SiteConfig, Undo, set_site
from .._presence import presence
from .._registry import RetrofitError, Site, register_host
from .torch_nn import ONormSite, patch_all

__all__ = ["TabPFNV3Host", "SUPPORTED_TABPFN"]

SUPPORTED_TABPFN = (">=8.0.1", "<9.3")
_ARCH_MODULE = "tabpfn.architectures.tabpfn_v3"


def _tabpfn_version() -> str | None:
    try:
        return _md.version("tabpfn")
    except _md.PackageNotFoundError:
        return None


def _version_supported(version: str) -> bool:
    """8.0.1 <= version < 9.3 (release numbers only; pre-release tags are ignored)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return False
    release = tuple(int(part or 0) for part in match.groups())
    return (8, 0, 1) <= release < (9, 3, 0)


def _patch(module: nn.Module, mixin: type, key: str) -> Callable[[SiteConfig], Undo]:
    return lambda config: set_site(module, mixin, key, config)


def _receivers(name: str, vectors: nn.Parameter) -> Callable[[float], dict[str, float]]:
    """Min and mean presence of a set of learned receiver vectors ``(n, E)`` at τ."""

    def report(tau: float) -> dict[str, float]:
        p = presence(vectors.detach().float(), tau)
        return {f"{name}.min": float(p.min()), f"{name}.mean": float(p.mean())}

    return report


class TabPFNV3Host:
    """Sites of ``tabpfn.architectures.tabpfn_v3.TabPFNV3`` (see the module docstring)."""

    name = "tabpfn-v3"

    def matches(self, model: nn.Module) -> bool:
        arch = sys.modules.get(_ARCH_MODULE)       # a v3 model implies the module is imported
        return arch is not None and isinstance(model, arch.TabPFNV3)

    def check(self, model: nn.Module) -> None:
        version = _tabpfn_version()
        if version is None or not _version_supported(version):
            raise RetrofitError(
                f"tabpfn {version} is not supported by the TabPFN v3 host; supported: tabpfn "
                f"{','.join(SUPPORTED_TABPFN)} (install 'oretrofit[tabpfn]' or "
                "pip install 'tabpfn>=8.0.1,<9.3')")

    def version(self) -> dict[str, str]:
        return {"tabpfn": _tabpfn_version() or "missing", "architecture": "tabpfn_v3"}

    def sites(self, model: nn.Module) -> list[Site]:
        from . import tabpfn_v3_blocks as o

        def norm(*modules: nn.Module) -> Callable[[SiteConfig], Undo]:
            """One ONorm site over several RMSNorm modules (all-or-nothing)."""
            return lambda config: patch_all(*(functools.partial(set_site, m, ONormSite, "norm",
                                                                config) for m in modules))

        sites = [Site("te.col", "inject", "cell token x_embed(x) of a train row and column",
                      _patch(model, o.OTabPFNV3, "te.col"))]
        for i, layer in enumerate(model.feature_distribution_embedder.layers):
            stages = (
                ("induce1", layer.cross_attn_block1,
                 "receivers: inducing vectors; sources: the column's train-row cell tokens",
                 _receivers("inducing_vectors", layer.inducing_vectors)),
                ("induce2", layer.cross_attn_block2,
                 "receivers: every row's cell token; sources: inducing hidden states", None),
            )
            for stage, block, carrier, receivers in stages:
                name = f"fde.{i}.{stage}"
                sites += [
                    Site(name, "attention", carrier, _patch(block, o.OCrossAttentionBlock, "attn"),
                         receivers),
                    Site(f"{name}.norm", "norm", "pre-norm query, context and MLP inputs",
                         norm(block.layernorm_q, block.layernorm_kv, block.layernorm2)),
                    Site(f"{name}.ffn", "ffn", "residual stream before the MLP",
                         _patch(block, o.OCrossAttentionBlock, "ffn")),
                ]
        col = model.column_aggregator
        cls_receivers = _receivers("cls_tokens", col.cls_tokens)
        last = len(col.blocks) - 1
        for k, block in enumerate(col.blocks):
            prefix = "col.cls" if k == last else f"col.{k}"
            attn = Site(prefix if k == last else f"{prefix}.attn", "attention",
                        "receivers: CLS tokens; sources: CLS + column tokens of the row"
                        if k == last else "CLS + column tokens of one row (self-attention, RoPE)",
                        _patch(block, o.OColumnBlock, "attn"),
                        cls_receivers if k in (0, last) else None)
            sites += [attn,
                      Site(f"{prefix}.norm", "norm", "pre-norm attention and MLP inputs",
                           norm(block.layernorm, block.layernorm_mlp)),
                      Site(f"{prefix}.ffn", "ffn", "residual stream before the MLP",
                           _patch(block, o.OColumnBlock, "ffn"))]
        sites += [Site("col.out_norm", "norm", "CLS outputs of the read-out (out_ln)",
                       norm(col.out_ln)),
                  Site("te.icl", "inject", "row token (flattened CLS outputs) of a train row",
                       _patch(model, o.OTabPFNV3, "te.icl"))]
        for k, block in enumerate(model.icl_blocks):
            sites += [
                Site(f"icl.{k}.attn", "attention", "receivers: all rows; sources: train rows",
                     _patch(block, o.OICLBlock, "attn")),
                Site(f"icl.{k}.norm", "norm", "pre-norm attention and MLP inputs",
                     norm(block.layernorm, block.layernorm_mlp)),
                Site(f"icl.{k}.ffn", "ffn", "residual stream before the MLP",
                     _patch(block, o.OICLBlock, "ffn")),
            ]
        sites.append(Site("icl.out_norm", "norm", "row token after the last ICL block "
                          "(output_norm)", norm(model.output_norm)))
        return sites


HOST = register_host(TabPFNV3Host())
