"""Llama-style decoders in transformers 5.x (``LlamaModel`` and ``LlamaForCausalLM``), e.g.
SmolLM2: pre-norm RMSNorm, grouped-query attention with RoPE, gated (SwiGLU) MLP.

Sites (``<llama>`` = path of the LlamaModel, ``<layer>`` = ``<llama>.layers.i``):

    <layer>.self_attn                 attention  OAttention (eq. 7) via AttentionInterface on the
                                                 rotated q/k, Hkv < H key heads used as they are;
                                                 presences of the residual stream entering the
                                                 layer, cached keys' presences kept for generation
    <layer>.input_layernorm           norm       ONorm (eq. 16)
    <layer>.post_attention_layernorm  norm       ONorm
    <layer>.mlp                       ffn        ρτ(h)·MLP(RMSNorm(h)), h = residual stream entering
                                                 the branch (eq. 15)
    <llama>.norm                      norm       ONorm of the final state

The causal relation comes from the registered mask function (materialised, never ``is_causal``).
"""

from __future__ import annotations

import functools

from torch import nn

from .._patching import SiteConfig, Undo, set_site
from .._registry import Site, register_host
from .torch_nn import ATTENTION, FFN, NORM, ONormSite, patch_all
from .transformers_common import (TransformersHost, attach_o_attention, gate_branch,
                                  gate_output_bias, join)

__all__ = ["LlamaHost"]


def _attention(layer: nn.Module, config: SiteConfig) -> Undo:
    undo_attention, state = attach_o_attention(layer.self_attn, layer, config)
    return patch_all(lambda: undo_attention,
                     lambda: gate_output_bias(layer.self_attn.o_proj, state))


def _norm_site(name: str, norm: nn.Module, carrier: str) -> Site:
    return Site(name, NORM, carrier, functools.partial(set_site, norm, ONormSite, NORM))


def _llama_sites(name: str, llama: nn.Module) -> list[Site]:
    sites: list[Site] = []
    for i, layer in enumerate(llama.layers):
        prefix = join(name, f"layers.{i}")
        sites += [
            Site(f"{prefix}.self_attn", ATTENTION, f"residual stream entering {prefix}",
                 functools.partial(_attention, layer)),
            _norm_site(f"{prefix}.input_layernorm", layer.input_layernorm,
                       f"residual stream entering {prefix}"),
            _norm_site(f"{prefix}.post_attention_layernorm", layer.post_attention_layernorm,
                       "residual stream after attention"),
            Site(f"{prefix}.mlp", FFN, "residual stream after attention",
                 functools.partial(gate_branch, layer.post_attention_layernorm, layer.mlp)),
        ]
    return sites + [_norm_site(join(name, "norm"), llama.norm, "final residual stream")]


class LlamaHost(TransformersHost):
    """transformers Llama decoders (see module docstring)."""

    name = "transformers.llama"
    supports = "transformers 5.x LlamaModel / LlamaForCausalLM (model_type 'llama')"
    backbone = ("transformers.models.llama.modeling_llama", "LlamaModel")

    def backbone_sites(self, name: str, llama: nn.Module) -> list[Site]:
        return _llama_sites(name, llama)


HOST = register_host(LlamaHost())
