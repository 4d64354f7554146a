"""TabPFN v3: the named sites of a ``TabPFNV3`` model (tabpfn 8.0.1–9.2.0; what differs
between those releases is in :mod:`oretrofit.hosts.tabpfn.releases`, between model versions in
:mod:`oretrofit.hosts.tabpfn.versions`; the host is :mod:`oretrofit.hosts.tabpfn.host`).

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

from typing import Callable

from torch import nn

from ..._surgery.host import Site
from ..._surgery.patching import SiteConfig, Undo, UndoAll, set_site
from ..torch_nn import norm_site, patch, receiver_report

__all__ = ["sites", "stage_sites", "decoder_sites"]


def sites(model: nn.Module) -> list[Site]:
    """The sites of a ``TabPFNV3`` (see the module docstring)."""
    from .v3_blocks import OTabPFNV3
    return [*stage_sites(model, OTabPFNV3),
            *decoder_sites(getattr(model, "many_class_decoder", None))]


def stage_sites(model: nn.Module, model_mixin: type) -> list[Site]:
    """The sites v3 and v3.5 share, ``te.col`` to ``icl.out_norm`` (``model_mixin``: the
    version's O-mixin of the model, for the target encodings)."""
    return [Site("te.col", "inject", "cell token x_embed(x) of a train row and column",
                 _te_col(model, model_mixin), modules=(model.x_embed,)),
            *_fde_sites(model.feature_distribution_embedder),
            *_column_sites(model.column_aggregator),
            Site("te.icl", "inject", "row token (flattened CLS outputs) of a train row",
                 patch(model, model_mixin, "te.icl"), modules=(model.icl_y_encoder,)),
            *_icl_sites(model.icl_blocks),
            norm_site("icl.out_norm", "row token after the last ICL block (output_norm)",
                      model.output_norm)]


def _te_col(model: nn.Module, model_mixin: type) -> Callable[[SiteConfig], Undo]:
    """The ``te.col`` site: the model's mixin, and the hook on ``x_embed`` through which each
    forward's injection reaches the cell tokens (put on with the site, so no forward hooks or
    unhooks the shared module)."""
    from .v3_blocks import te_col_hook

    def apply(config: SiteConfig) -> Undo:
        site = set_site(model, model_mixin, "te.col", config)
        return UndoAll([site, model.x_embed.register_forward_hook(te_col_hook).remove])
    return apply


def _block_sites(prefix: str, block: nn.Module, mixin: type, pre_norms: tuple[nn.Module, ...]
                 ) -> list[Site]:
    return [norm_site(f"{prefix}.norm", "pre-norm inputs of the block's attention and MLP",
                      *pre_norms),
            Site(f"{prefix}.ffn", "ffn", "residual stream before the MLP",
                 patch(block, mixin, "ffn"), modules=(block,))]


def _fde_sites(embedder: nn.Module) -> list[Site]:
    from .v3_blocks import OCrossAttentionBlock
    sites: list[Site] = []
    for i, layer in enumerate(embedder.layers):
        stages = (("induce1", layer.cross_attn_block1,
                   "receivers: inducing vectors; sources: the column's train-row cell tokens",
                   receiver_report("inducing_vectors", layer.inducing_vectors)),
                  ("induce2", layer.cross_attn_block2,
                   "receivers: every row's cell token; sources: inducing hidden states", None))
        for stage, block, carrier, receivers in stages:
            name = f"fde.{i}.{stage}"
            sites += [Site(name, "attention", carrier, patch(block, OCrossAttentionBlock, "attn"),
                           receivers, modules=(block,)),
                      *_block_sites(name, block, OCrossAttentionBlock,
                                    (block.layernorm_q, block.layernorm_kv, block.layernorm2))]
    return sites


def _column_sites(aggregator: nn.Module) -> list[Site]:
    from .v3_blocks import OColumnBlock
    cls_receivers = receiver_report("cls_tokens", aggregator.cls_tokens)
    last = len(aggregator.blocks) - 1
    sites: list[Site] = []
    for k, block in enumerate(aggregator.blocks):
        if k == last:
            prefix, name = "col.cls", "col.cls"
            carrier = "receivers: CLS tokens; sources: CLS + column tokens of the row (read-out)"
        else:
            prefix, name = f"col.{k}", f"col.{k}.attn"
            carrier = "CLS + column tokens of one row (self-attention, RoPE)"
        sites += [Site(name, "attention", carrier, patch(block, OColumnBlock, "attn"),
                       cls_receivers if k in (0, last) else None, modules=(block,)),
                  *_block_sites(prefix, block, OColumnBlock,
                                (block.layernorm, block.layernorm_mlp))]
    sites.append(norm_site("col.out_norm", "CLS outputs of the read-out (out_ln)",
                           aggregator.out_ln))
    return sites


def _icl_sites(blocks: nn.ModuleList) -> list[Site]:
    from .v3_blocks import OICLBlock
    sites: list[Site] = []
    for k, block in enumerate(blocks):
        sites += [Site(f"icl.{k}.attn", "attention", "receivers: all rows; sources: train rows",
                       patch(block, OICLBlock, "attn"), modules=(block,)),
                  *_block_sites(f"icl.{k}", block, OICLBlock,
                                (block.layernorm, block.layernorm_mlp))]
    return sites


def decoder_sites(decoder: nn.Module | None) -> list[Site]:
    """The classifier's many-class decoder (a regressor has none)."""
    if decoder is None:
        return []
    from .v3_blocks import OManyClassDecoder
    return [Site("dec", "attention", "receivers: test rows (not gated); sources: train rows' "
                 "bias-free decoder keys W_K e_j", patch(decoder, OManyClassDecoder, "attn"),
                 modules=(decoder,))]

