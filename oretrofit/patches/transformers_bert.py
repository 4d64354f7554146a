"""BERT-style encoders in transformers 5.x (``BertModel`` and every head model built on it),
e.g. all-MiniLM-L6-v2. Post-norm layers: ``LN(h + Attn(h))`` then ``LN(a + FFN(a))``.

Sites (``<bert>`` = path of the BertModel, ``<layer>`` = ``<bert>.encoder.layer.i``):

    <bert>.embeddings.inject     inject     OInject (eq. 17): h + ρτ(h)·(e_type + e_pos), h = the
                                            word embedding (or ``inputs_embeds``)
    <bert>.embeddings.LayerNorm  norm       ONorm (eq. 16)
    <layer>.attention            attention  OAttention (eq. 7) via AttentionInterface; presences of
                                            the layer input; output bias gated by p_i
    <layer>.attention.output.LayerNorm  norm  ONorm of h + attention
    <layer>.ffn                  ffn        ρτ(a)·FFN(a), a = state entering the FFN (eq. 15)
    <layer>.output.LayerNorm     norm       ONorm of a + FFN

A zero carrier stays exactly zero through every ``full-o`` layer: attention gives it no mass and
emits nothing at it, and every bias (output projection, FFN, LayerNorm β, position and
token-type tables) is gated by its presence. The pooler (dense + tanh of token 0) is untouched.
"""

from __future__ import annotations

import functools
from typing import Callable

from torch import Tensor, nn

from .._components import o_gate
from .._patching import SiteConfig, Undo, set_site
from .._presence import presence
from .._registry import Site, register_host
from .torch_nn import ATTENTION, FFN, NORM, ONormSite, patch_all
from .transformers_common import (TransformersHost, attach_o_attention, gate_branch,
                                  gate_output_bias, join)

__all__ = ["BertHost"]

INJECT = "inject"


def _inject(embeddings: nn.Module, config: SiteConfig) -> Undo:
    """OInject with hooks: the position and token-type lookups are gated by ρτ(word embedding)."""
    state: dict[str, Tensor] = {}

    def from_inputs_embeds(module: nn.Module, args: tuple, kwargs: dict) -> None:
        given = kwargs.get("inputs_embeds", args[3] if len(args) > 3 else None)
        state.pop("p", None)
        if given is not None:
            state["p"] = presence(given, config.tau)

    def from_word_embedding(module: nn.Module, args: tuple, output: Tensor) -> None:
        state["p"] = presence(output, config.tau)

    def gate(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return o_gate(state["p"], output)                  # (B, N) x (B|1, N, d) -> (B, N, d)

    return patch_all(
        lambda: embeddings.register_forward_pre_hook(from_inputs_embeds, with_kwargs=True).remove,
        lambda: embeddings.word_embeddings.register_forward_hook(from_word_embedding).remove,
        lambda: embeddings.token_type_embeddings.register_forward_hook(gate).remove,
        lambda: embeddings.position_embeddings.register_forward_hook(gate).remove)


def _attention(layer: nn.Module, config: SiteConfig) -> Undo:
    attention = layer.attention
    undo_attention, state = attach_o_attention(attention.self, attention.self, config)
    return patch_all(lambda: undo_attention,
                     lambda: gate_output_bias(attention.output.dense, state))


def _norm(norm: nn.Module) -> Callable[[SiteConfig], Undo]:
    return functools.partial(set_site, norm, ONormSite, NORM)


def _layer_sites(name: str, layer: nn.Module) -> list[Site]:
    return [
        Site(f"{name}.attention", ATTENTION, f"layer input of {name}",
             functools.partial(_attention, layer)),
        Site(f"{name}.attention.output.LayerNorm", NORM, "h + attention",
             _norm(layer.attention.output.LayerNorm)),
        Site(f"{name}.ffn", FFN, "state entering the FFN",
             functools.partial(gate_branch, layer.output, layer.output.dense, carrier_arg=1)),
        Site(f"{name}.output.LayerNorm", NORM, "a + FFN", _norm(layer.output.LayerNorm)),
    ]


class BertHost(TransformersHost):
    """transformers BERT encoders (see module docstring)."""

    name = "transformers.bert"
    supports = "transformers 5.x BertModel and its head models (model_type 'bert')"
    backbone = ("transformers.models.bert.modeling_bert", "BertModel")

    def backbone_sites(self, name: str, bert: nn.Module) -> list[Site]:
        emb = join(name, "embeddings")
        sites = [Site(f"{emb}.inject", INJECT, "word embedding (inputs_embeds)",
                      functools.partial(_inject, bert.embeddings)),
                 Site(f"{emb}.LayerNorm", NORM, "word + position + token-type embedding",
                      _norm(bert.embeddings.LayerNorm))]
        for i, layer in enumerate(bert.encoder.layer):
            sites += _layer_sites(join(name, f"encoder.layer.{i}"), layer)
        return sites


HOST = register_host(BertHost())
