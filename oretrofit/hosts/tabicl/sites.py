"""TabICL: the named sites of a ``tabicl._model.tabicl.TabICL`` model (the host is
:mod:`oretrofit.hosts.tabicl.host`, the O-mixins :mod:`oretrofit.hosts.tabicl.blocks`).

Sites, in forward order (``i``/``k`` are block indices; the row transformer's last block is
``row.cls``):

=======================  =========  ==========================================================
site                     kind       carrier (presence read from it)
=======================  =========  ==========================================================
te.col                   inject     cell token ``in_linear(x)`` of a train row × column
                                    (absent when the model is not target-aware)
col.i.induce1            attention  receivers: inducing vectors; sources: the column's train
                                    rows (scalable softmax on the presence mass)
col.i.induce2            attention  receivers: every row's cell token; sources: inducing
                                    hidden states
col.i.induce{1,2}.norm   norm       the block's residual stream (``norm1``, ``norm2``)
col.i.induce{1,2}.ffn    ffn        the block's residual stream before the FFN
row.k.attn               attention  tokens of one row (CLS + features), self-attention, RoPE
row.cls                  attention  receivers: CLS tokens; sources: CLS + features (read-out)
row.k.norm / .ffn        norm / ffn the row block's residual stream (``row.cls.*`` last)
row.out_norm             norm       CLS outputs of the read-out (``out_ln``)
te.icl                   inject     row token (flattened CLS outputs) of a train row
icl.k.attn               attention  receivers: all rows; sources: train rows (scalable
                                    softmax on the presence mass; KV cache under O)
icl.k.norm / .ffn        norm / ffn the ICL block's residual stream
icl.out_norm             norm       row token after the last ICL block (``ln``)
=======================  =========  ==========================================================

The decoder (``icl_predictor.decoder``) is a per-row read-out, not a token boundary, and is
left as is, like TabPFN's.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ..._surgery.host import Site
from ..._surgery.patching import SiteConfig, Undo, UndoAll, set_site
from ..torch_nn import norm_site, patch, receiver_report

__all__ = ["sites"]


def sites(model: nn.Module) -> list[Site]:
    """The sites of a ``TabICL`` (see the module docstring)."""
    from .blocks import OColEmbedding, OICLearning
    col, row, icl = model.col_embedder, model.row_interactor, model.icl_predictor
    out: list[Site] = []
    if col.target_aware:
        out.append(Site("te.col", "inject", "cell token in_linear(x) of a train row and column",
                        _targets(col, OColEmbedding, "te.col"), modules=(col.y_encoder,)))
    out += _column_sites(col.tf_col.blocks)
    out += _row_sites(row)
    out.append(Site("te.icl", "inject", "row token (flattened CLS outputs) of a train row",
                    _targets(icl, OICLearning, "te.icl"), modules=(icl.y_encoder,)))
    for k, block in enumerate(icl.tf_icl.blocks):
        out += _block_sites(f"icl.{k}", f"icl.{k}.attn", block,
                            "receivers: all rows; sources: train rows")
    if isinstance(getattr(icl, "ln", None), nn.LayerNorm):
        out.append(norm_site("icl.out_norm", "row token after the last ICL block (ln)", icl.ln))
    return out


def _targets(stage: nn.Module, mixin: type, key: str) -> Callable[[SiteConfig], Undo]:
    """A ``te.*`` site: the stage's mixin, and the hook on its ``y_encoder`` through which the
    gate reaches the target embedding (put on with the site, taken off with it)."""
    from .blocks import target_hook

    def apply(config: SiteConfig) -> Undo:
        site = set_site(stage, mixin, key, config)
        return UndoAll([site, stage.y_encoder.register_forward_hook(target_hook).remove])
    return apply


def _block_sites(prefix: str, name: str, block: nn.Module, carrier: str,
                 receivers: Callable[[float], dict[str, float]] | None = None) -> list[Site]:
    """A ``MultiheadAttentionBlock``'s attention, its two LayerNorms and its FFN."""
    from .blocks import OAttentionBlock
    return [Site(name, "attention", carrier, patch(block, OAttentionBlock, "attn"), receivers,
                 modules=(block,)),
            norm_site(f"{prefix}.norm", "residual stream entering the attention and FFN "
                      "(norm1, norm2)", block.norm1, block.norm2),
            Site(f"{prefix}.ffn", "ffn", "residual stream before the FFN",
                 patch(block, OAttentionBlock, "ffn"), modules=(block,))]


def _column_sites(blocks: nn.ModuleList) -> list[Site]:
    out: list[Site] = []
    for i, block in enumerate(blocks):
        out += _block_sites(f"col.{i}.induce1", f"col.{i}.induce1", block.multihead_attn1,
                            "receivers: inducing vectors; sources: the column's train rows",
                            receiver_report("ind_vectors", block.ind_vectors))
        out += _block_sites(f"col.{i}.induce2", f"col.{i}.induce2", block.multihead_attn2,
                            "receivers: every row's cell token; sources: inducing hidden states")
    return out


def _row_sites(row: nn.Module) -> list[Site]:
    cls_receivers = receiver_report("cls_tokens", row.cls_tokens)
    blocks = row.tf_row.blocks
    last = len(blocks) - 1
    out: list[Site] = []
    for k, block in enumerate(blocks):
        if k == last:
            out += _block_sites("row.cls", "row.cls", block, "receivers: CLS tokens; sources: "
                                "CLS + feature tokens of the row (read-out)", cls_receivers)
        else:
            out += _block_sites(f"row.{k}", f"row.{k}.attn", block, "CLS + feature tokens of "
                                "one row (self-attention, RoPE)",
                                cls_receivers if k == 0 else None)
    if isinstance(row.out_ln, nn.LayerNorm):
        out.append(norm_site("row.out_norm", "CLS outputs of the read-out (out_ln)", row.out_ln))
    return out
