"""The TabPFN v3 host: the named sites of a ``TabPFNV3`` model (tabpfn 8.0.1–9.2.0; what
differs between those releases is in :mod:`oretrofit.hosts.tabpfn.releases`).

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
dec                    attention  classifiers only: test rows read the train rows' targets;
                                  sources gated by the bias-free decoder key ``W_K e_j``
=====================  =========  ===========================================================

The stage norms ``out_ln`` and ``output_norm`` are gated under ``full-o`` (ONorm, like every
other norm: an RMSNorm would lift a near-null carrier to unit scale). The regression decoder
(``output_projection``) is a per-row read-out, not a token boundary, and is left as is. The
classifier's many-class decoder is attention over the train rows, so its sources are gated
(``dec``); its receivers, the test rows being read out, are not.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

from torch import nn

from ..._patching import SiteConfig, Undo, set_site
from ..._presence import presence
from ..._host import RetrofitError, Site, register_host
from . import releases
from ..torch_nn import ONormSite, patch_all

__all__ = ["TabPFNV3Host"]

_ARCH_MODULE = "tabpfn.architectures.tabpfn_v3"


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
    specificity = 20

    def matches(self, model: nn.Module) -> bool:
        """Any tabpfn architecture, so that the other versions get a clear refusal in check."""
        return any(c.__module__.startswith("tabpfn.architectures.") for c in type(model).__mro__)

    def check(self, model: nn.Module) -> None:
        arch = sys.modules.get(_ARCH_MODULE)       # a v3 model implies the module is imported
        if arch is None or not isinstance(model, arch.TabPFNV3):
            raise RetrofitError(
                f"{type(model).__module__}.{type(model).__name__} is not supported: oretrofit "
                "retrofits TabPFN v3 (tabpfn.architectures.tabpfn_v3.TabPFNV3, checkpoints "
                f"named *v3*, not v2.x or v3.5) with tabpfn {releases.TESTED_RELEASES[0]} to "
                f"{releases.TESTED_RELEASES[-1]}")
        releases.check_release(releases.installed_version())

    def version(self) -> dict[str, str]:
        return {"tabpfn": releases.installed_version() or "missing", "architecture": "tabpfn_v3"}

    def sites(self, model: nn.Module) -> list[Site]:
        from . import v3_blocks as o
        return [Site("te.col", "inject", "cell token x_embed(x) of a train row and column",
                     _patch(model, o.OTabPFNV3, "te.col")),
                *_fde_sites(model.feature_distribution_embedder),
                *_column_sites(model.column_aggregator),
                Site("te.icl", "inject", "row token (flattened CLS outputs) of a train row",
                     _patch(model, o.OTabPFNV3, "te.icl")),
                *_icl_sites(model.icl_blocks),
                Site("icl.out_norm", "norm", "row token after the last ICL block (output_norm)",
                     _norms(model.output_norm)),
                *_decoder_sites(getattr(model, "many_class_decoder", None))]


def _norms(*modules: nn.Module) -> Callable[[SiteConfig], Undo]:
    """One ONorm site over several RMSNorm modules (all-or-nothing)."""
    return lambda config: patch_all(*(functools.partial(set_site, m, ONormSite, "norm", config)
                                      for m in modules))


def _block_sites(prefix: str, block: nn.Module, mixin: type, norms: tuple[nn.Module, ...]
                 ) -> list[Site]:
    return [Site(f"{prefix}.norm", "norm", "pre-norm inputs of the block's attention and MLP",
                 _norms(*norms)),
            Site(f"{prefix}.ffn", "ffn", "residual stream before the MLP",
                 _patch(block, mixin, "ffn"))]


def _fde_sites(embedder: nn.Module) -> list[Site]:
    from .v3_blocks import OCrossAttentionBlock
    sites: list[Site] = []
    for i, layer in enumerate(embedder.layers):
        stages = (("induce1", layer.cross_attn_block1,
                   "receivers: inducing vectors; sources: the column's train-row cell tokens",
                   _receivers("inducing_vectors", layer.inducing_vectors)),
                  ("induce2", layer.cross_attn_block2,
                   "receivers: every row's cell token; sources: inducing hidden states", None))
        for stage, block, carrier, receivers in stages:
            name = f"fde.{i}.{stage}"
            sites += [Site(name, "attention", carrier, _patch(block, OCrossAttentionBlock, "attn"),
                           receivers),
                      *_block_sites(name, block, OCrossAttentionBlock,
                                    (block.layernorm_q, block.layernorm_kv, block.layernorm2))]
    return sites


def _column_sites(aggregator: nn.Module) -> list[Site]:
    from .v3_blocks import OColumnBlock
    cls_receivers = _receivers("cls_tokens", aggregator.cls_tokens)
    last = len(aggregator.blocks) - 1
    sites: list[Site] = []
    for k, block in enumerate(aggregator.blocks):
        if k == last:
            prefix, name = "col.cls", "col.cls"
            carrier = "receivers: CLS tokens; sources: CLS + column tokens of the row (read-out)"
        else:
            prefix, name = f"col.{k}", f"col.{k}.attn"
            carrier = "CLS + column tokens of one row (self-attention, RoPE)"
        sites += [Site(name, "attention", carrier, _patch(block, OColumnBlock, "attn"),
                       cls_receivers if k in (0, last) else None),
                  *_block_sites(prefix, block, OColumnBlock,
                                (block.layernorm, block.layernorm_mlp))]
    sites.append(Site("col.out_norm", "norm", "CLS outputs of the read-out (out_ln)",
                      _norms(aggregator.out_ln)))
    return sites


def _icl_sites(blocks: nn.ModuleList) -> list[Site]:
    from .v3_blocks import OICLBlock
    sites: list[Site] = []
    for k, block in enumerate(blocks):
        sites += [Site(f"icl.{k}.attn", "attention", "receivers: all rows; sources: train rows",
                       _patch(block, OICLBlock, "attn")),
                  *_block_sites(f"icl.{k}", block, OICLBlock,
                                (block.layernorm, block.layernorm_mlp))]
    return sites


def _decoder_sites(decoder: nn.Module | None) -> list[Site]:
    """The classifier's many-class decoder (a regressor has none)."""
    if decoder is None:
        return []
    from .v3_blocks import OManyClassDecoder
    return [Site("dec", "attention", "receivers: test rows (not gated); sources: train rows' "
                 "bias-free decoder keys W_K e_j", _patch(decoder, OManyClassDecoder, "attn"))]


HOST = register_host(TabPFNV3Host())
