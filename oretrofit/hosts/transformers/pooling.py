"""Attention-pooling heads (SigLIP's, SigLIP2's, Idefics2's ``…MultiheadAttentionPoolingHead``):
a learned query, the ``probe``, attends over the tokens through an ``nn.MultiheadAttention``,
then a norm and an MLP act on the pooled vector.

The probe is a parameter, not a token: its presence is 1. The head's attention is then O
cross-attention over the tokens it is given (:class:`OProbeAttention`):

    pooled = W_O Σ_j m_j p_j e^{s_j} v_j / (ε + Σ_j m_j p_j e^{s_j}) + b_O

with p_j the presence of token j of the head's input (the keys; the post-layernorm last hidden
state). A null token (p_j = 0) carries no mass into the pooled vector, so inserting nulls leaves
``pooler_output`` unchanged, and τ → 0 (p_j → 1) gives the head's softmax. The norm and MLP after
the attention read the pooled vector alone, one row per probe, never a token: a read-out of the
gated pooling like BERT's pooler, left as it is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError, Site
from ..._surgery.patching import SiteConfig, Undo, set_site, site_config
from ..._operators.presence import presence
from ..torch_nn import ATTENTION, OMultiheadAttention
from .layouts import is_attention_named, token_mixers

__all__ = ["OProbeAttention", "ProbeConfig", "pooling_attention", "pooling_site"]


@dataclass(frozen=True, eq=False)
class ProbeConfig(SiteConfig):
    """τ and ε of a pooling head's attention, and the head's ``probe`` its queries must be."""

    probe: nn.Parameter | None = None


class OProbeAttention(OMultiheadAttention):
    """Mixin for the ``nn.MultiheadAttention`` of an attention-pooling head: OAttention with the
    receivers' presence 1 (the probe is a parameter) and the keys' ρτ (module docstring). A call
    whose queries are not the probe (repeated over the batch) is refused: presence 1 is defined
    for the probe alone, a token query would need its own."""

    def _o_presences(self, query_carrier: Tensor, key_carrier: Tensor, tau: float
                     ) -> tuple[Tensor, Tensor]:
        probe = site_config(self, ATTENTION).probe
        if (query_carrier.shape[1:] != probe.shape[1:]
                or not torch.equal(query_carrier, probe.expand_as(query_carrier))):
            raise RetrofitError(
                f"{type(self).__name__} (the attention of a pooling head) was called with "
                f"queries {tuple(query_carrier.shape)} that are not the head's probe "
                f"{tuple(probe.shape)}, so the host cannot give them presence 1; only a learned "
                "probe attending over the tokens is covered")
        return query_carrier.new_ones(query_carrier.shape[:-1]), presence(key_carrier, tau)


def pooling_attention(head: nn.Module) -> tuple[str, nn.MultiheadAttention] | None:
    """``(path in head, attention)`` when ``head`` is an attention-pooling head: its one own
    parameter is a learned query ``probe`` ``(1, n, d)``, it holds one ``nn.MultiheadAttention``
    of width d, and nothing else in it mixes tokens (no other attention module, convolution over
    positions or recurrent module). Else None."""
    own = dict(head.named_parameters(recurse=False))
    probe = own.get("probe")
    if list(own) != ["probe"] or probe.dim() != 3 or probe.shape[0] != 1:
        return None
    attentions = [(n, m) for n, m in head.named_modules() if isinstance(m, nn.MultiheadAttention)]
    if len(attentions) != 1 or attentions[0][1].embed_dim != probe.shape[-1] or token_mixers(head):
        return None
    name, attention = attentions[0]
    inside = lambda n: n == name or n.startswith(name + ".")               # noqa: E731
    others = [n for n, m in head.named_modules()
              if n and not inside(n) and is_attention_named(m)]
    return None if others else (name, attention)


def pooling_site(path: str, head: nn.Module) -> Site | str:
    """The site of the pooling head at ``path`` (:func:`pooling_attention` found its attention),
    or why its attention cannot take the O form."""
    name, attention = pooling_attention(head)
    full = f"{path}.{name}"
    if attention.bias_k is not None or attention.add_zero_attn:
        return (f"{full} (nn.MultiheadAttention with add_bias_kv / add_zero_attn) appends keys "
                "that have no carrier, so the pooled vector would not be O cross-attention "
                "over the tokens")
    return Site(full, ATTENTION, f"tokens entering {path} (keys; the probe's presence is 1)",
                functools.partial(_apply, attention, head.probe))


def _apply(attention: nn.MultiheadAttention, probe: nn.Parameter, config: SiteConfig) -> Undo:
    return set_site(attention, OProbeAttention, ATTENTION,
                    ProbeConfig(config.tau, config.eps, probe))
