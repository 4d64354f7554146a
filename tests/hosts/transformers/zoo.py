"""The transformers architectures the generic host is tested on (tiny, built from configs), and
those it refuses. The test suite, ``docs/transformers.md``'s generated table and nothing else
read this list: an architecture is listed as supported only because a test covers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from oretrofit.hosts.transformers.contracts import example_inputs
from oretrofit.hosts.transformers.shrink import jitter  # the census and the self-check's too

__all__ = ["Architecture", "ARCHITECTURES", "SOFTMAX_ROUTE", "NEW_LAYOUTS", "REFUSED", "REFUSED_ON_CALL",
           "build", "example_inputs", "expectation", "assert_refused_in_this_release"]

_COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, vocab_size=99, max_position_embeddings=64, pad_token_id=0,
               bos_token_id=1, eos_token_id=2)
_SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                decoder_start_token_id=2)
_T5 = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, decoder_start_token_id=0)
_GPT2_NAMES = dict(n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64)
_DEEPSEEK = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
                 v_head_dim=8, first_k_dense_replace=1, n_group=1, topk_group=1)
_IMAGE = dict(image_size=8, patch_size=4, num_channels=3)
_AUDIO = dict(conv_dim=(16, 16), conv_kernel=(3, 3), conv_stride=(2, 2),
              num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2)


@dataclass(frozen=True)
class Architecture:
    """One tiny model: ``AutoConfig.for_model(model_type, **common, **config)``, ``AutoModel``."""

    name: str
    model_type: str
    family: str          # decoder-only | encoder-only | encoder-decoder | MoE | vision | audio
    config: dict[str, Any] = field(default_factory=dict)
    insertion: str = "middle"    # where null insertion keeps old tokens' relation (see describe)
    # (release, insertion): before that transformers release null insertion happens there instead
    # (a model that took no position_ids yet inserts at the end)
    insertion_before: tuple[str, str] | None = None

    def insertion_here(self) -> str:
        """:attr:`insertion` in the installed transformers release."""
        from packaging.version import Version
        from oretrofit.hosts.transformers.releases import transformers_version
        if self.insertion_before and Version(transformers_version()) < Version(
                self.insertion_before[0]):
            return self.insertion_before[1]
        return self.insertion


ARCHITECTURES = [
    Architecture("GPT-2", "gpt2", "decoder-only"),
    Architecture("GPT-NeoX (parallel residual)", "gpt_neox", "decoder-only"),
    Architecture("GPT-NeoX (sequential)", "gpt_neox", "decoder-only",
                 dict(use_parallel_residual=False)),
    Architecture("GPT-J", "gptj", "decoder-only", dict(rotary_dim=4)),
    Architecture("OPT", "opt", "decoder-only", dict(ffn_dim=64, word_embed_proj_dim=32)),
    Architecture("OPT (post-norm)", "opt", "decoder-only",
                 dict(ffn_dim=64, word_embed_proj_dim=32, do_layer_norm_before=False)),
    Architecture("Llama", "llama", "decoder-only", dict(attention_bias=True, mlp_bias=True)),
    Architecture("Qwen2", "qwen2", "decoder-only"),
    Architecture("Qwen3", "qwen3", "decoder-only", dict(head_dim=8)),
    Architecture("Mistral (sliding window 4)", "mistral", "decoder-only", dict(sliding_window=4),
                 "end"),
    Architecture("Gemma", "gemma", "decoder-only", dict(head_dim=8)),
    # eager as transformers >= 5.21 picks by itself (before, SDPA, which drops the softcap)
    Architecture("Gemma2 (softcap 0.5, sliding window 4)", "gemma2", "decoder-only",
                 dict(head_dim=8, attn_logit_softcapping=0.5, sliding_window=4,
                      attn_implementation="eager"), "end"),
    Architecture("Gemma3 (text)", "gemma3_text", "decoder-only", dict(head_dim=8, sliding_window=4),
                 "end"),
    Architecture("Phi", "phi", "decoder-only"),
    Architecture("Phi-3", "phi3", "decoder-only"),
    Architecture("StableLM", "stablelm", "decoder-only"),
    Architecture("OLMo", "olmo", "decoder-only"),
    Architecture("Starcoder2", "starcoder2", "decoder-only"),
    Architecture("Granite", "granite", "decoder-only"),
    Architecture("Cohere", "cohere", "decoder-only"),
    Architecture("Mixtral", "mixtral", "MoE", dict(num_local_experts=4, num_experts_per_tok=2)),
    Architecture("Qwen2-MoE", "qwen2_moe", "MoE",
                 dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32)),
    Architecture("BERT", "bert", "encoder-only"),
    Architecture("RoBERTa", "roberta", "encoder-only"),
    Architecture("XLM-RoBERTa", "xlm-roberta", "encoder-only"),
    Architecture("ELECTRA", "electra", "encoder-only", dict(embedding_size=32)),
    Architecture("DistilBERT", "distilbert", "encoder-only",
                 dict(dim=32, hidden_dim=64, n_layers=2, n_heads=4),
                 insertion_before=("5.0.0", "end")),          # position_ids from 5.0
    Architecture("ModernBERT (local window 4)", "modernbert", "encoder-only",
                 dict(global_attn_every_n_layers=2, local_attention=4), "end"),
    Architecture("T5", "t5", "encoder-decoder", _T5, "end"),
    Architecture("BART", "bart", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("mBART", "mbart", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("ViT", "vit", "vision", _IMAGE),
    # breadth: further families the host derives without a row of their own
    Architecture("GPT-BigCode (multi-query)", "gpt_bigcode", "decoder-only", _GPT2_NAMES),
    Architecture("CodeGen", "codegen", "decoder-only", dict(_GPT2_NAMES, rotary_dim=4)),
    Architecture("Persimmon", "persimmon", "decoder-only"),
    Architecture("Nemotron", "nemotron", "decoder-only"),
    Architecture("OLMo2", "olmo2", "decoder-only"),
    Architecture("OLMo3 (sliding window 4)", "olmo3", "decoder-only", dict(sliding_window=4),
                 "end"),
    Architecture("GLM", "glm", "decoder-only", dict(head_dim=8)),
    Architecture("GLM-4", "glm4", "decoder-only", dict(head_dim=8)),
    Architecture("SmolLM3", "smollm3", "decoder-only"),
    Architecture("EXAONE 4 (sliding window 4)", "exaone4", "decoder-only", dict(sliding_window=4),
                 "end"),
    Architecture("Helium", "helium", "decoder-only", dict(head_dim=8)),
    Architecture("Cohere2 (sliding window 4)", "cohere2", "decoder-only", dict(sliding_window=4),
                 "end"),
    Architecture("BioGPT", "biogpt", "decoder-only"),
    Architecture("Arcee", "arcee", "decoder-only"),
    Architecture("Apertus", "apertus", "decoder-only"),
    Architecture("BitNet", "bitnet", "decoder-only"),
    Architecture("DiffLlama", "diffllama", "decoder-only"),
    Architecture("Doge", "doge", "decoder-only"),
    Architecture("ERNIE 4.5", "ernie4_5", "decoder-only", dict(head_dim=8)),
    Architecture("HunYuan (dense)", "hunyuan_v1_dense", "decoder-only", dict(head_dim=8)),
    Architecture("Seed-OSS", "seed_oss", "decoder-only", dict(head_dim=8)),
    Architecture("VaultGemma (sliding window 4)", "vaultgemma", "decoder-only",
                 dict(head_dim=8, sliding_window=4), "end"),
    # local_attention too: 4.x derives the window from it alone (local_attention // 2)
    Architecture("ModernBERT decoder (sliding window 4)", "modernbert-decoder", "decoder-only",
                 dict(sliding_window=4, local_attention=8), "end"),
    Architecture("Qwen3.5 (text, full attention)", "qwen3_5_text", "decoder-only",
                 dict(head_dim=8, layer_types=["full_attention", "full_attention"])),
    Architecture("OLMoE", "olmoe", "MoE", dict(num_experts=4, num_experts_per_tok=2)),
    Architecture("Phi-MoE", "phimoe", "MoE", dict(num_local_experts=4, num_experts_per_tok=2)),
    Architecture("DeepSeek-V2 (MLA)", "deepseek_v2", "MoE", _DEEPSEEK),
    Architecture("DeepSeek-V3 (MLA)", "deepseek_v3", "MoE", _DEEPSEEK),
    Architecture("GLM-4-MoE", "glm4_moe", "MoE",
                 dict(head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1)),
    Architecture("Qwen3-MoE", "qwen3_moe", "MoE",
                 dict(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    Architecture("GraniteMoE", "granitemoe", "MoE", dict(num_local_experts=4, num_experts_per_tok=2)),
    Architecture("GraniteMoE (shared experts)", "granitemoeshared", "MoE",
                 dict(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32)),
    Architecture("ERNIE 4.5 MoE", "ernie4_5_moe", "MoE",
                 dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, head_dim=8)),
    Architecture("HunYuan MoE", "hunyuan_v1_moe", "MoE", dict(head_dim=8, num_experts=4, moe_topk=2)),
    Architecture("FlexOlmo", "flex_olmo", "MoE", dict(num_experts=4, num_experts_per_tok=2)),
    Architecture("MiniMax-M2", "minimax_m2", "MoE",
                 dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2)),
    Architecture("Llama4 (text, MoE tokens flattened)", "llama4_text", "MoE",
                 dict(head_dim=8, num_local_experts=4, num_experts_per_tok=1,
                      intermediate_size_mlp=64, interleave_moe_layer_step=1, no_rope_layers=[1, 0],
                      attention_chunk_size=16)),
    Architecture("GPT-OSS (attention sinks, sliding window 4)", "gpt_oss", "MoE",
                 dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=4),
                 "end"),
    Architecture("Switch Transformers", "switch_transformers", "MoE",
                 dict(_T5, num_decoder_layers=2, num_experts=4, encoder_sparse_step=2,
                      decoder_sparse_step=2), "end"),
    Architecture("CamemBERT", "camembert", "encoder-only"),
    Architecture("Data2Vec (text)", "data2vec-text", "encoder-only"),
    Architecture("ERNIE", "ernie", "encoder-only"),
    Architecture("RoBERTa-PreLayerNorm", "roberta-prelayernorm", "encoder-only"),
    Architecture("ESM (rotary)", "esm", "encoder-only", dict(position_embedding_type="rotary")),
    Architecture("XLM-RoBERTa-XL", "xlm-roberta-xl", "encoder-only"),
    Architecture("BERT-generation", "bert-generation", "encoder-only"),
    Architecture("LayoutLM", "layoutlm", "encoder-only"),
    Architecture("Splinter", "splinter", "encoder-only"),
    Architecture("EuroBERT", "eurobert", "encoder-only"),
    Architecture("Nomic BERT", "nomic_bert", "encoder-only"),
    Architecture("GTE", "gte", "encoder-only"),
    Architecture("Jina embeddings v3", "jina_embeddings_v3", "encoder-only"),
    Architecture("Pegasus", "pegasus", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("Marian", "marian", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("M2M100 (sinusoidal positions)", "m2m_100", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("Blenderbot", "blenderbot", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("Blenderbot-small", "blenderbot-small", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("PLBart", "plbart", "encoder-decoder", _SEQ2SEQ, "end"),
    Architecture("mT5", "mt5", "encoder-decoder", _T5, "end"),
    Architecture("UMT5", "umt5", "encoder-decoder", _T5, "end"),
    Architecture("DeiT", "deit", "vision", _IMAGE),
    Architecture("BEiT", "beit", "vision", _IMAGE),
    Architecture("DINOv2", "dinov2", "vision", _IMAGE),
    Architecture("DINOv2 with registers", "dinov2_with_registers", "vision", _IMAGE),
    Architecture("ViT-MSN", "vit_msn", "vision", _IMAGE),
    # a biased projection between the embedding and the first layer, W x + ρτ(x)·b
    Architecture("ELECTRA (embedding projection)", "electra", "encoder-only",
                 dict(embedding_size=16)),
    # a position table added to patch embeddings, gated by the patch's presence
    Architecture("CLIP (vision)", "clip_vision_model", "vision", _IMAGE),
    # the same, patches being 3-D tubelets (Conv3d, kernel = stride): frames × patch
    Architecture("ViViT (tubelets)", "vivit", "vision",
                 dict(image_size=8, num_frames=4, tubelet_size=[2, 4, 4], num_channels=3)),
    # tubelets, and rotary positions its attention takes by token index (nulls at the end)
    Architecture("V-JEPA 2 (tubelets, rotary by index)", "vjepa2", "vision",
                 dict(mlp_ratio=2.0, crop_size=16, frames_per_clip=4, tubelet_size=2,
                      patch_size=8, pred_hidden_size=32, pred_num_hidden_layers=1,
                      pred_num_attention_heads=4, pred_num_mask_tokens=2), "end"),
    # the feature projection gated, and one convolution over positions h + ρτ(h)·conv(h)
    Architecture("HuBERT", "hubert", "audio", _AUDIO, "end"),
    Architecture("Wav2Vec2", "wav2vec2", "audio", _AUDIO, "end"),
    Architecture("UniSpeech-SAT", "unispeech-sat", "audio", _AUDIO, "end"),
]

# Covered by the softmax route: their attention modules compute attention themselves
# (oretrofit/hosts/transformers/softmax_route.py); part of ARCHITECTURES.
SOFTMAX_ROUTE = [
    Architecture("XGLM", "xglm", "decoder-only",
                 dict(d_model=32, num_layers=2, attention_heads=4, ffn_dim=64)),
    Architecture("OpenAI-GPT", "openai-gpt", "decoder-only", _GPT2_NAMES),
    Architecture("MPT (ALiBi)", "mpt", "decoder-only",
                 dict(d_model=32, n_layers=2, n_heads=4, max_seq_len=64), "end"),
    Architecture("BLOOM (ALiBi)", "bloom", "decoder-only", {}, "end"),
    Architecture("Falcon (eager)", "falcon", "decoder-only", dict(attn_implementation="eager")),
    # picks its kernel from the config at each call: switched to eager while retrofitted
    Architecture("Falcon (SDPA)", "falcon", "decoder-only", dict(attn_implementation="sdpa")),
    Architecture("GPT-Neo (local window 4)", "gpt_neo", "decoder-only",
                 dict(num_layers=2, attention_types=[[["global", "local"], 1]], window_size=4),
                 "end"),
    Architecture("BigBird (full attention)", "big_bird", "encoder-only",
                 dict(attention_type="original_full")),
    Architecture("RoFormer (rotary)", "roformer", "encoder-only", {}, "end"),
    Architecture("Megatron-BERT", "megatron-bert", "encoder-only"),
    Architecture("DeBERTa (disentangled)", "deberta", "encoder-only"),
    Architecture("DeBERTa-v2 (disentangled)", "deberta-v2", "encoder-only"),
    Architecture("MPNet (relative buckets)", "mpnet", "encoder-only", {}, "end"),
    Architecture("TAPAS", "tapas", "encoder-only"),
    Architecture("LUKE", "luke", "encoder-only"),
    Architecture("BigBird-Pegasus (full attention)", "bigbird_pegasus", "encoder-decoder",
                 dict(_SEQ2SEQ, attention_type="original_full"), "end"),
    # the attention returns its output bias for the layer to add: gated by p_i
    Architecture("GPT-NeoX-Japanese (returned attention bias)", "gpt_neox_japanese",
                 "decoder-only"),
    Architecture("ImageGPT", "imagegpt", "decoder-only", _GPT2_NAMES),
    Architecture("MVP", "mvp", "encoder-decoder", _SEQ2SEQ, "end"),
    # an SDPA subclass chosen at construction: its eager base class's forward runs
    Architecture("Data2Vec (vision, SDPA module)", "data2vec-vision", "vision", _IMAGE),
]
# Covered by layouts added on the newest tested release (measured there only so far).
NEW_LAYOUTS = [
    Architecture("AIMv2 (vision, no pooling head)", "aimv2_vision_model", "vision",
                 dict(_IMAGE, use_head=False)),
    Architecture("NLLB-MoE", "nllb-moe", "MoE", dict(_SEQ2SEQ, num_experts=4), "end"),
    # the decoder looks up its own word embedding; cross-attention carrier pre_cross_attn_layernorm
    Architecture("T5Gemma", "t5gemma", "encoder-decoder",
                 dict(encoder=dict(_COMMON, head_dim=8), decoder=dict(_COMMON, head_dim=8))),
    # its output projection is named projection_layer: found as the one the forward calls last
    Architecture("InternVL (vision)", "internvl_vision", "vision", _IMAGE),
    # a per-language adapter on the stream after the FFN, gated by the presence of its input
    Architecture("X-MOD (language adapters)", "xmod", "encoder-only",
                 dict(languages=["en_XX", "de_DE"], default_language="de_DE")),
    # layers inside layer groups (the groups' lists hold the layers), one group shared by both
    Architecture("ALBERT (one shared layer group)", "albert", "encoder-only",
                 dict(embedding_size=16)),
    Architecture("ALBERT (2 groups of 2 layers)", "albert", "encoder-only",
                 dict(embedding_size=16, num_hidden_groups=2, inner_group_num=2)),
    # a learned probe attending over the tokens: O cross-attention, the probe's presence 1
    Architecture("SigLIP (vision, attention-pooling head)", "siglip_vision_model", "vision",
                 _IMAGE),
    # the same head; a position table resized per image in the embeddings' own method, gated
    Architecture("SigLIP2 (vision, NaFlex rows)", "siglip2_vision_model", "vision",
                 dict(patch_size=4, num_patches=64), "end"),
    # a position lookup by pixel positions, gated; nulls as one whole cell of its pooler
    Architecture("Gemma4 (vision)", "gemma4_vision", "vision", dict(head_dim=8, patch_size=4),
                 "start"),
]
ARCHITECTURES += SOFTMAX_ROUTE + NEW_LAYOUTS

REFUSED = [
    Architecture("Mamba", "mamba", "decoder-only", dict(state_size=4, expand=2, time_step_rank=4)),
    Architecture("Jamba (Mamba layers)", "jamba", "MoE",
                 dict(num_experts=4, num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1,
                      expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4,
                      mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False)),
    Architecture("Qwen3-Next (linear attention)", "qwen3_next", "MoE",
                 dict(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32, linear_num_value_heads=4,
                      linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                      layer_types=["linear_attention", "full_attention"])),
    Architecture("LFM2 (short convolutions)", "lfm2", "decoder-only",
                 dict(layer_types=["conv", "full_attention"])),
    Architecture("Falcon-H1 (parallel Mamba)", "falcon_h1", "decoder-only",
                 dict(head_dim=8, mamba_d_state=4, mamba_n_heads=4, mamba_d_head=16,
                      mamba_d_ssm=64)),
    Architecture("Gemma3n (text)", "gemma3n_text", "decoder-only",
                 dict(head_dim=8, hidden_size_per_layer_input=8, vocab_size_per_layer_input=99,
                      laurel_rank=4, num_kv_shared_layers=0, intermediate_size=[64, 64],
                      activation_sparsity_pattern=[0.0, 0.0],
                      layer_types=["sliding_attention", "full_attention"])),
    Architecture("X-MOD (adapter added before its norm)", "xmod", "encoder-only",
                 dict(languages=["en_XX", "de_DE"], default_language="en_XX",
                      ln_before_adapter=False)),
    Architecture("MobileBERT", "mobilebert", "encoder-only",
                 dict(embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                      num_feedforward_networks=1)),
    Architecture("MiniMax (lightning attention)", "minimax", "MoE",
                 dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                      layer_types=["linear_attention", "full_attention"])),
    Architecture("I-BERT (integer quantization)", "ibert", "encoder-only"),
    Architecture("JetMoE (mixture of attention heads)", "jetmoe", "MoE",
                 dict(num_local_experts=4, num_experts_per_tok=2, kv_channels=8)),
    Architecture("XLM (layers inline)", "xlm", "encoder-only",
                 dict(emb_dim=32, n_layers=2, n_heads=4)),
    Architecture("FSMT (time-first)", "fsmt", "encoder-decoder",
                 dict(_SEQ2SEQ, src_vocab_size=99, tgt_vocab_size=99, langs=["en", "de"])),
    Architecture("YOSO (hashed attention)", "yoso", "encoder-only"),
    Architecture("MRA (multi-resolution attention)", "mra", "encoder-only"),
    Architecture("CTRL (inline position table)", "ctrl", "decoder-only",
                 dict(n_embd=32, n_layer=2, n_head=4, dff=64, n_positions=64)),
    Architecture("Data2Vec (audio, stacked positional convolutions)", "data2vec-audio", "audio",
                 _AUDIO),
    Architecture("AIMv2 (vision, attention-pooling head)", "aimv2_vision_model", "vision",
                 _IMAGE),
    Architecture("Swin (windows, patch merging)", "swin", "vision",
                 dict(_IMAGE, embed_dim=16, depths=[1, 1], num_attention_heads=[2, 2],
                      num_heads=[2, 2], window_size=2)),     # num_heads: the name before 5.x

    Architecture("ViTDet (2-D token grid)", "vitdet", "vision", _IMAGE),
    Architecture("LeViT (subsampling attention)", "levit", "vision",
                 dict(num_attention_heads=[4, 8, 12])),
    Architecture("SqueezeBERT (channels-first)", "squeezebert", "encoder-only",
                 dict(embedding_size=32)),
    Architecture("HY-V4 (hyper-connections)", "hy_v4", "MoE", dict(head_dim=8)),
]

# Retrofitted (their modules compute attention themselves), then refused by the softmax route at
# the first call, naming the module: what the call shows is not one softmax over all the keys.
REFUSED_ON_CALL = [
    Architecture("Longformer (sliding chunks)", "longformer", "encoder-only",
                 dict(attention_window=4)),
    Architecture("LED (sliding chunks)", "led", "encoder-decoder",
                 dict(_SEQ2SEQ, attention_window=4)),
    Architecture("LongT5 (local blocks)", "longt5", "encoder-decoder", _T5),
]


def build(arch: Architecture, seed: int = 0, auto: Any = None) -> nn.Module:
    """The tiny fp32 model in eval mode, every parameter jittered by N(0, 0.05²) so that biases
    and norm affines are non-zero; ``auto``: the Auto class that builds it (``AutoModel``, or
    e.g. ``AutoModelForCausalLM`` for the model with its LM head)."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        config = AutoConfig.for_model(arch.model_type, **{**_COMMON, **arch.config})
        torch.manual_seed(seed)
        model = (auto or AutoModel).from_config(config)
    finally:
        logging.set_verbosity(verbosity)
    return jitter(model, seed)


def expectation(arch: Architecture) -> str:
    """What the installed transformers release does with a supported architecture: ``covered``
    (every contract must hold), ``refused`` (the host covers it only from a later release,
    :data:`~oretrofit.hosts.transformers.releases.COVERED_FROM`) or ``absent`` (the release
    predates the model type; the table names the release it is covered from)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from oretrofit.hosts.transformers.releases import before_covered
    if before_covered(arch.model_type) is None:
        return "covered"
    return "refused" if arch.model_type in CONFIG_MAPPING else "absent"


def assert_refused_in_this_release(arch: Architecture) -> None:
    """An architecture the host covers only from a later release: refused naming the
    architecture, the reason, this release and the first release where it is covered (or, when
    this release has no such model type, absent)."""
    import pytest
    from oretrofit import RetrofitError, retrofit
    from oretrofit.hosts.transformers.releases import (COVERED_FROM, before_covered,
                                                       not_covered_yet, transformers_version)
    first, version = before_covered(arch.model_type), transformers_version()
    assert first is not None, f"{arch.name} is covered in transformers {version}"
    if expectation(arch) == "absent":
        with pytest.raises(ValueError, match=arch.model_type):
            build(arch)
        return
    model = build(arch)
    with pytest.raises(RetrofitError) as error:
        retrofit(model, "oa")
    message = str(error.value)
    assert type(model).__name__ in message and repr(arch.model_type) in message, message
    assert not_covered_yet(type(model).__name__, arch.model_type) in message, message
    assert f"transformers {version}" in message and f"from {first}" in message
    assert COVERED_FROM[arch.model_type][1] in message
    assert not hasattr(model, "_oretrofit_retrofit")


def describe(arch: Architecture) -> dict[str, Any]:
    """What the host derives for ``arch``: model class, layouts, sites per kind (``full-o``) and
    where null insertion happens (the row's ``insertion``, which test_architectures checks
    :func:`oretrofit.hosts.transformers.contracts.null_insertion` measures)."""
    from oretrofit._surgery.registry import plan_retrofit
    from oretrofit.hosts.transformers.backbones import layers
    from oretrofit.hosts.transformers.layouts import layout_of
    model = build(arch)
    plan = plan_retrofit(model, "full-o")
    kinds: dict[str, int] = {}
    for site, _ in plan.entries:
        kinds[site.kind] = kinds.get(site.kind, 0) + 1
    return {"name": arch.name, "family": arch.family, "class": type(model).__name__,
            "layouts": sorted({layout_of(layer).name for _, layer in layers(model)}),
            "sites": kinds,
            "insertion": arch.insertion}


def refusal(arch: Architecture) -> str:
    """The :class:`RetrofitError` message the host gives for a refused architecture."""
    from oretrofit._surgery.registry import RetrofitError, plan_retrofit
    try:
        plan_retrofit(build(arch), "full-o")
    except RetrofitError as error:
        return str(error)
    raise AssertionError(f"{arch.name} is listed as refused but retrofits")


def refusal_on_call(arch: Architecture) -> str:
    """The :class:`RetrofitError` a retrofitted ``REFUSED_ON_CALL`` model raises at its first
    call (``full-o``, τ = 1e-6), without the advice that follows the reason."""
    from oretrofit import RetrofitError, retrofitted
    model = build(arch)
    try:
        with retrofitted(model, "full-o", 1e-6), torch.no_grad():
            model(**example_inputs(model))
    except RetrofitError as error:
        return str(error).partition(", so the softmax route")[0]
    raise AssertionError(f"{arch.name} is listed as refused at the first call but runs")


def architectures_table() -> str:
    """The supported / refused architecture tables of ``docs/transformers.md``."""
    from oretrofit._files.markdown import pipe_table
    rows = []
    from oretrofit.hosts.transformers.releases import TESTED_RELEASES, covered_from
    for arch in ARCHITECTURES:
        d = describe(arch)
        sites = ", ".join(f"{n} {k}" for k, n in sorted(d["sites"].items()))
        rows.append([d["name"], d["family"], f"`{d['class']}`",
                     ", ".join(d["layouts"]), sites, d["insertion"],
                     covered_from(arch.model_type) or TESTED_RELEASES[0]])
    supported = pipe_table(["architecture", "family", "class", "layout", "full-o sites",
                            "null insertion", "covered from transformers"], rows)
    refused = pipe_table(["architecture", "why (the RetrofitError it raises)"],
                         [[a.name, refusal(a).replace("|", "\\|")] for a in REFUSED])
    on_call = pipe_table(["architecture", "why (the RetrofitError its first call raises)"],
                         [[a.name, refusal_on_call(a).replace("|", "\\|")]
                          for a in REFUSED_ON_CALL])
    return (f"{supported}\n\nThe last column is the first admitted release in which the host "
            "covers the architecture (`COVERED_FROM` in "
            "`oretrofit/hosts/transformers/releases.py`; before it the host refuses it naming that "
            "release).\n\nRefused in every admitted release, with the reason the host gives in "
            f"the newest:\n\n{refused}\n\n"
            "Retrofitted (their attention modules compute attention themselves), then refused "
            "by the softmax route at the first call, naming the module (the rest of each "
            "message says what to do):\n\n"
            f"{on_call}\n\n"
            "Generated from `tests/hosts/transformers/zoo.py` by `make docs` "
            "(`scripts/transformers_docs.py`); `tests/hosts/transformers/test_architectures.py` "
            "runs the contracts on every row, `tests/hosts/transformers/test_calls.py` calls every "
            "row as users do (with and without a mask, `inputs_embeds`, `generate`, a training "
            "step), `tests/test_docs_transformers.py` checks this table is current.\n")


_TRACED = ("read from the layer's call: the input of the norm the MLP reads (pre-norm), the "
           "layer (parallel residual), or the MLP itself (post-norm, or no norm in front of it)")


def layouts_table() -> str:
    """The built-in rows of :data:`LAYOUTS`, in the order they are tried."""
    from oretrofit._files.markdown import pipe_table
    from oretrofit.hosts.transformers.layouts import LAYOUTS
    code = lambda paths: " / ".join(f"`{p}`" if p else "the layer" for p in paths) or "–"  # noqa: E731
    return pipe_table(["layout", "examples", "FFN branch", "its carrier enters", "cross-attention "
                       "carrier enters"],
                      [[row.name, row.examples, f"refused: {row.refused}" if row.refused
                        else code(row.ffn), _TRACED if row.traced else code(row.ffn_carrier),
                        code(row.cross_carrier)]
                       for row in LAYOUTS]) + "\n"
