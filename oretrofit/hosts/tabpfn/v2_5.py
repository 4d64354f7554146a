"""TabPFN v2, v2.5 and v2.6: the named sites of a ``TabPFNV2`` (tabpfn 8.1.0+), ``TabPFNV2p5``
or ``TabPFNV2p6`` model (8.0.1+; v2.6 is v2.5 with RMSNorm in place of LayerNorm; v2 has
v2.5's blocks with a 4× MLP, no thinking rows and a multi-class target encoding in its target
embedder). A per-feature transformer of post-norm blocks over a ``(rows × columns)`` grid of
cell tokens; the target is a column of its own (the last), not an addition; v2.5 and v2.6
prepend learned thinking rows to every column.

Token boundary: the cell tokens entering the first block. Their encoders do not map a zero
input to a zero carrier: a feature group's cell is ``W_f [x̃, ι] + c_g`` with ``x̃`` the
train-standardised, group-normalised values, ``ι`` the NaN/±inf indicators and ``c_g`` the
column's positional embedding (a Linear with bias), the target cell ``W_y [ỹ, ι] + b_y`` (a test
row's target is NaN, imputed with the train mean, indicator −2). So a null row or column is a
zero cell token at the boundary (what the tests insert), never a zero raw input. The encoder
additions are not gated: gating ``c_g`` or ``b_y`` by the presence of the bias-free part would
erase a genuine cell whose encoded values are exactly zero (a class-0 target ``y = 0``, a value
at the train mean), which τ→0 would not recover. The thinking rows are learned receivers (and
sources) of the along-column attention; their presence is reported at ``blk.0.col`` (v2 has
none).

=====================  =========  ===========================================================
site                   kind       carrier (presence read from it)
=====================  =========  ===========================================================
blk.k.row              attention  cells of one row (feature groups + target), self-attention
blk.k.col              attention  receivers: every row of a column (thinking, train, test);
                                  sources: (thinking +) train rows (test rows: KV head 0)
blk.k.norm             norm       post-norm inputs ``x + attn(x)`` and ``x + MLP(x)``
                                  (``layernorm_mha1``, ``layernorm_mha2``, ``layernorm_mlp``)
blk.k.ffn              ffn        the residual stream entering the MLP (``x + ρτ(x)·MLP(x)``)
=====================  =========  ===========================================================

Every block sublayer is bias-free and maps a zero token to zero (LayerNorm/RMSNorm of 0 is 0,
the MLP is bias-free with GELU(0) = 0), so once the attentions are gated a null cell token stays
null through the stack, under ``oa`` and ``full-o`` alike. The decoder ``output_projection``
reads the test rows' target cells per row (a read-out, not a token boundary) and is left as is;
classifier and regressor differ only in its width.
"""

from __future__ import annotations

from torch import nn

from ..._surgery.host import Site
from ..torch_nn import OMLPSite, norm_site, patch, receiver_report

__all__ = ["sites"]


def sites(model: nn.Module) -> list[Site]:
    """The sites of a ``TabPFNV2``, ``TabPFNV2p5`` or ``TabPFNV2p6`` (see the module
    docstring)."""
    from .v2_5_blocks import OAlongColumnAttention, OAlongRowAttention
    rows = getattr(model, "add_thinking_rows", None)                    # v2: none
    thinking = None if rows is None else receiver_report("thinking_rows",
                                                         rows.row_token_values_TE)
    out: list[Site] = []
    for k, block in enumerate(model.blocks):
        out += [Site(f"blk.{k}.row", "attention", "cells of one row (feature groups + target)",
                     patch(block.per_sample_attention_between_features, OAlongRowAttention,
                           "attn"), modules=(block.per_sample_attention_between_features,)),
                Site(f"blk.{k}.col", "attention", "receivers: every row of a column; sources: "
                     "thinking + train rows (test rows read KV head 0)",
                     patch(block.per_column_attention_between_cells, OAlongColumnAttention,
                           "attn"), thinking if k == 0 else None,
                     modules=(block.per_column_attention_between_cells,)),
                norm_site(f"blk.{k}.norm", "post-norm inputs x + attn(x), x + MLP(x)",
                          block.layernorm_mha1, block.layernorm_mha2, block.layernorm_mlp),
                Site(f"blk.{k}.ffn", "ffn", "residual stream entering the MLP",
                     patch(block.mlp, OMLPSite, "ffn"), modules=(block.mlp,))]
    return out
