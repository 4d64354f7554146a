"""A transformers config shrunk to a tiny model of the same architecture: the census
(``scripts/transformers_census_build.py``) builds every model type from its default config this
way, and the self-check (:mod:`.selfcheck`) the user's own model from its config.

A config is shrunk generically: the size fields it has (hidden width 32, 4 heads, 2 key-value
heads, head width 8, FFN width 64, 2 layers, 4 experts of which 2 per token, images 32 px in
patches of 8, audio feature channels 32) are set (and in each sub-config), so the config derives
the rest as it does for a user; per-layer lists are cut to 2 layers keeping a layer of each of
the first two kinds (:func:`_two_layers`), and fields tied to the shrunk ones keep the default's
relation (:func:`_related`: multi-latent heads, multimodal rotary sections). :data:`GROUPS` are
the shrinks tried in turn (every field, every field but the image ones, every field at a width of
192, the layer counts only), each under a cap of :data:`MAX_PARAMETERS` (counted on the meta
device first); :func:`jitter` makes biases and norm affines non-zero, so a contract that an
ungated bias would break can fail.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["GROUPS", "MAX_PARAMETERS", "shrunk_fields", "shrunk_config", "tiny_model", "jitter"]

_WIDTH = dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "word_embed_proj_dim",
                        "projection_dim", "text_embed_dim", "vision_embed_dim"), 32)
_HEADS = dict.fromkeys(("num_attention_heads", "n_head", "encoder_attention_heads",
                        "decoder_attention_heads", "num_heads", "n_heads"), 4)
_OTHER = {"num_key_value_heads": 2, "multi_query_group_num": 2, "head_dim": 8, "kv_channels": 8,
          "embedding_size": 16, "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64,
          "decoder_ffn_dim": 64, "d_ff": 64, "d_kv": 8, "moe_intermediate_size": 32,
          "shared_expert_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4,
          "n_routed_experts": 4, "num_experts_per_tok": 2,
          # multi-latent attention: the rotary part is the head width, as head_dim says
          "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "kv_lora_rank": 16,
          "q_lora_rank": 16}
_LAYERS = dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "encoder_layers",
                         "decoder_layers", "num_decoder_layers", "n_layers"), 2)
_IMAGE = {"image_size": 32, "crop_size": 32, "patch_size": 8, "num_frames": 4,
          "frames_per_clip": 4}
GROUPS: dict[str, tuple[dict[str, int], ...]] = {
    "tiny": (_WIDTH, _HEADS, _OTHER, _LAYERS, _IMAGE),
    "tiny, default image size": (_WIDTH, _HEADS, _OTHER, _LAYERS),
    # 768 / 4: the default width's factors kept, for layout embeddings that split the width by
    # 6 (LiLT's six box tables) or by 4 · dim_bbox into sinusoid pairs (BROS), which 32 breaks
    "tiny, width 192": (dict.fromkeys(_WIDTH, 192), _HEADS, _OTHER, _LAYERS, _IMAGE),
    "layer counts only": (_LAYERS,),
}
MAX_PARAMETERS = 30_000_000


def shrunk_fields(config: Any, groups: tuple[dict[str, int], ...],
                  widths: dict[int, int] | None = None) -> dict[str, Any]:
    """The shrinking keyword arguments for ``config`` (its own fields, then its sub-configs);
    ``widths`` maps the default widths shrunk anywhere in the config to their shrunk values
    (:func:`_shrunk_widths`)."""
    widths = _shrunk_widths(config, groups) if widths is None else widths
    found = _shrunk(config, groups)
    if "conv_dim" in found or isinstance(getattr(config, "conv_dim", None), (list, tuple)):
        found["conv_dim"] = [32] * len(config.conv_dim)
    layers = next((getattr(config, n) for n in _LAYERS if isinstance(getattr(config, n, None),
                                                                      int)), None)
    if any(n in found for n in _LAYERS) and layers:
        for name, default in vars(config).items():
            if isinstance(default, (list, tuple)) and len(default) == layers and layers > 2:
                found[name] = _two_layers(default)
    found.update(_related(config, found, widths))
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            shrunk = shrunk_fields(sub, groups, widths)
            if shrunk:
                found[name] = {**sub.to_dict(), **shrunk}
    return found


def _shrunk(config: Any, groups: tuple[dict[str, int], ...]) -> dict[str, Any]:
    """The fields of ``groups`` that ``config`` sets above their shrunk value, shrunk."""
    found: dict[str, Any] = {}
    for group in groups:
        for name, value in group.items():
            if isinstance(getattr(type(config), name, None), property):
                continue                    # derived from other fields (Falcon's head_dim)
            default = getattr(config, name, None)
            if isinstance(default, int) and not isinstance(default, bool) and default > value:
                found[name] = value
            elif name == "image_size" and isinstance(default, (list, tuple)):
                found[name] = [value] * len(default)
    return found


def _shrunk_widths(config: Any, groups: tuple[dict[str, int], ...]) -> dict[int, int]:
    """``{default width: shrunk width}`` over ``config`` and its sub-configs: the values the
    width fields (:data:`_WIDTH`) had before the shrink."""
    found = {getattr(config, name): value for name, value in _shrunk(config, groups).items()
             if name in _WIDTH}
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            found.update(_shrunk_widths(sub, groups))
    return found


def _two_layers(per_layer: list | tuple) -> list:
    """A per-layer list cut to 2 layers: the first, and the first of another kind where there
    is one (a hybrid model keeps an attention layer beside a recurrent one)."""
    return [per_layer[0], next((x for x in per_layer[1:] if x != per_layer[0]), per_layer[1])]


_TIED_WIDTH = ("hidden_size", "output_size", "embed_dim")   # suffixes of fields sized like a width


def _related(config: Any, found: dict[str, Any], widths: dict[int, int]) -> dict[str, Any]:
    """Fields whose relation to the shrunk ones the default config holds: as many key-value
    heads as heads where the default has (multi-latent attention expands its keys to every
    head; per layer too: Sapiens2's ``num_key_value_heads_per_layer``), a width field outside
    the shrink groups that the default sizes like a shrunk width (ViT's derived
    ``pooler_output_size``, SAM3's ``fpn_hidden_size`` feeding its DETR's ``hidden_size``), and
    multimodal rotary sections (``mrope_section``, a default of the modeling code where the
    config lacks it) summing to half the shrunk rotary width."""
    related: dict[str, Any] = {}
    heads = getattr(config, "num_attention_heads", None)
    if "num_key_value_heads" in found and heads == getattr(config, "num_key_value_heads", None):
        related["num_key_value_heads"] = found.get("num_attention_heads", heads)
    per_layer = found.get("num_key_value_heads_per_layer")
    if "num_attention_heads" in found and isinstance(per_layer, list):
        related["num_key_value_heads_per_layer"] = [
            found["num_attention_heads"] if n == heads else _OTHER["num_key_value_heads"]
            for n in per_layer]
    related.update({name: widths[default] for name, default in vars(config).items()
                    if name.endswith(_TIED_WIDTH) and name not in found
                    and isinstance(default, int) and default in widths})
    related.update(_expert_groups(config, found))
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and "mrope_section" in getattr(
            config, "ignore_keys_at_rope_validation", ()) and "hidden_size" in found:
        width = found.get("head_dim") or found["hidden_size"] // found.get("num_attention_heads",
                                                                            heads)
        half = int(width * rope.get("partial_rotary_factor", 1.0)) // 2
        related["rope_parameters"] = {**rope, "mrope_section": _proportional(
            half, rope.get("mrope_section", _MROPE_SECTION))}
    return related


def _expert_groups(config: Any, found: dict[str, Any]) -> dict[str, int]:
    """Group-limited routing (``n_group`` groups of experts, ``topk_group`` of them chosen) kept
    meaningful over the shrunk experts: groups of 2, chosen in the default's share (at least
    one); nothing where the config has no groups or the experts are not shrunk."""
    groups = getattr(config, "n_group", None)
    experts = next((found[n] for n in ("n_routed_experts", "num_experts", "num_local_experts")
                    if n in found), None)
    if not isinstance(groups, int) or experts is None or groups <= experts // 2:
        return {}
    shrunk = max(experts // 2, 1)
    chosen = getattr(config, "topk_group", groups) or groups
    return {"n_group": shrunk, "topk_group": max(shrunk * chosen // groups, 1)}


_MROPE_SECTION = (16, 24, 24)         # Qwen2-VL's default, the ratio GLM-4V's (8, 12, 12) share


def _proportional(total: int, parts: Any) -> list[int]:
    """``total`` split in the ratio of ``parts`` (largest remainders round up)."""
    exact = [total * p / sum(parts) for p in parts]
    split = [int(x) for x in exact]
    for i in sorted(range(len(parts)), key=lambda i: split[i] - exact[i])[:total - sum(split)]:
        split[i] += 1
    return split


def shrunk_config(config: Any, groups: tuple[dict[str, int], ...]) -> Any:
    """A new config of ``config``'s class with its fields and :func:`shrunk_fields` (the given
    config is left as it is)."""
    return type(config).from_dict({**config.to_dict(), **shrunk_fields(config, groups)})


def tiny_model(model_class: type, config: Any, seed: int = 0, **kwargs: Any) -> nn.Module:
    """``model_class`` built from ``config`` (``_from_config``, with ``kwargs`` such as the
    attention implementation), fp32 and :func:`jitter` ed; refused with a ``ValueError`` above
    :data:`MAX_PARAMETERS` (counted on the meta device before anything is allocated)."""
    with torch.device("meta"):
        count = sum(p.numel() for p in model_class._from_config(config, **kwargs).parameters())
    if count > MAX_PARAMETERS:
        raise ValueError(f"{count / 1e6:.0f} M parameters (more than the cap of "
                         f"{MAX_PARAMETERS / 1e6:.0f} M for a tiny model)")
    torch.manual_seed(seed)
    return jitter(model_class._from_config(config, **kwargs).float(), seed)


def jitter(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter + N(0, 0.05²) (non-zero biases and norm affines), in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()
