"""TabPFN v3.5: the named sites of a ``TabPFNV3p5`` model (tabpfn 9.0.0+; the ``v3.5`` and
``v3.5-fast`` checkpoints are the same class). One model serves both tasks: ``forward`` takes
``task_type`` ("regression" or "multiclass"), which picks the target encoders and the head.

The stages up to ``icl.out_norm`` have v3's layout and site names (:mod:`.v3`); what v3.5 adds
is per-head q/k RMSNorm inside every attention (applied after RoPE, inside the attention site:
it acts on q and k, not on the residual stream), a cell embedder reading in-context ECDF ranks
(preprocessing, before the first token boundary, like v3's scaler), LayerNorms on the target
embeddings (inside the injected term ``e``) and the multi-task heads:

=====================  =========  ===========================================================
site                   kind       carrier (presence read from it)
=====================  =========  ===========================================================
te.col                 inject     cell token ``x_embed(x)`` of a train row × column
fde.i.induce1          attention  receivers: inducing points (reported); sources: train rows
fde.i.induce2          attention  receivers: all rows' cell tokens; sources: inducing hiddens
fde.i.induce{1,2}.*    norm / ffn the cross-attention block's pre-norms and residual stream
col.k.attn             attention  aggregation (CLS) tokens + columns of one row (RoPE)
col.cls                attention  receivers: the aggregation tokens (reported); sources: all
col.k.* / col.cls.*    norm / ffn the column block's residual stream
col.out_norm           norm       aggregation-token outputs (``out_ln``)
te.icl                 inject     row token of a train row (``icl_y_encoder`` + LayerNorm)
icl.k.attn             attention  receivers: all rows; sources: train rows (GQA for test rows)
icl.k.norm / .ffn      norm / ffn the ICL block's residual stream
icl.out_norm           norm       row token after the last ICL block (``output_norm``)
head.reg.norm / .ffn   norm / ffn regression pre-head MLP ``x + MLP(Norm(x))`` (per row)
head.cls.norm / .ffn   norm / ffn classification pre-head MLP (per row; feeds the decoder's
                                  queries and its keys)
dec                    attention  multiclass: test rows read the train rows' targets (chunked
                                  class attention); sources gated by ``W_K e_j`` bias-free
=====================  =========  ===========================================================

The regression read-out ``output_projection`` is per row and left as is. The head sites belong
to one task each (:data:`TASK_SITES`): a model used as a regressor never runs ``head.cls.*`` or
``dec``, so calibration leaves the other task's sites out (they would see no carrier).
"""

from __future__ import annotations

from torch import nn

from ..._surgery.host import Site
from ..torch_nn import norm_site, patch
from .v3 import decoder_sites, stage_sites

__all__ = ["sites", "TASK_SITES"]

# the sites only one task runs (the rest serve both)
TASK_SITES: dict[str, tuple[str, ...]] = {"regressor": ("head.reg.norm", "head.reg.ffn"),
                                          "classifier": ("head.cls.norm", "head.cls.ffn", "dec")}


def sites(model: nn.Module) -> list[Site]:
    """The sites of a ``TabPFNV3p5`` (see the module docstring)."""
    from .v3_5_blocks import OPreHeadMLP, OTabPFNV3p5
    heads = model.heads
    head_sites = []
    for short, mlp in (("reg", heads.mlp_regression), ("cls", heads.mlp_classification)):
        head_sites += [norm_site(f"head.{short}.norm", "row embedding entering the pre-head MLP",
                                 mlp.norm),
                       Site(f"head.{short}.ffn", "ffn", "row embedding (pre-head MLP residual)",
                            patch(mlp, OPreHeadMLP, "ffn"), modules=(mlp,))]
    return [*stage_sites(model, OTabPFNV3p5), *head_sites,
            *decoder_sites(heads.many_class_decoder)]
