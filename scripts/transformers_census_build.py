"""Tiny models from default configs, and the category of a model type, for
``scripts/transformers_census.py``.

A default config is shrunk generically: the size fields it has (hidden width 32, 4 heads, 2
key-value heads, head width 8, FFN width 64, 2 layers, 4 experts of which 2 per token, images
32 px in patches of 8, audio feature channels 32) are passed to ``AutoConfig.for_model`` (and to
each sub-config), so the config derives the rest as it does for a user; per-layer lists are cut
to 2 layers keeping a layer of each of the first two kinds (:func:`_two_layers`), and fields
tied to the shrunk ones keep the default's relation (:func:`_related`: multi-latent heads,
multimodal rotary sections). The example inputs are
:func:`oretrofit.hosts.transformers.contracts.example_inputs` (by the model's main input and
forward signature). Attempts, first that builds and runs its example inputs wins: the tiny config
``tests/hosts/transformers/zoo.py`` gives the model type (its first row) where it has one, every
field, every field but the image ones, every field at a width of 192, then the layer counts
only; each under a cap of 30 M parameters (counted on the meta device first).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["build", "category", "attention_classes", "ATTEMPTS", "Unbuilt"]

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
ATTEMPTS: dict[str, tuple[dict[str, int], ...] | None] = {
    "zoo": None,
    "tiny": (_WIDTH, _HEADS, _OTHER, _LAYERS, _IMAGE),
    "tiny, default image size": (_WIDTH, _HEADS, _OTHER, _LAYERS),
    # 768 / 4: the default width's factors kept, for layout embeddings that split the width by
    # 6 (LiLT's six box tables) or by 4 · dim_bbox into sinusoid pairs (BROS), which 32 breaks
    "tiny, width 192": (dict.fromkeys(_WIDTH, 192), _HEADS, _OTHER, _LAYERS, _IMAGE),
    "layer counts only": (_LAYERS,),
}
MAX_PARAMETERS = 30_000_000
_ZOO = Path(__file__).resolve().parents[1] / "tests" / "hosts" / "transformers" / "zoo.py"


class _InputsFail(Exception):
    """The tiny model built (its :func:`attention_classes` kept), but the census' example inputs
    do not run it."""

    def __init__(self, message: str, attention: list[str]) -> None:
        super().__init__(message)
        self.attention = attention


class _NotInZoo(Exception):
    """The zoo has no row for the model type (the next attempt is tried)."""


class Unbuilt(str):
    """Why no tiny model ran; ``built`` when one built but its example inputs failed, and then
    its :func:`attention_classes` in ``attention``."""

    built = False
    attention: list[str] = []


def _overrides(config: Any, groups: tuple[dict[str, int], ...],
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
            shrunk = _overrides(sub, groups, widths)
            if shrunk:
                found[name] = {**sub.to_dict(), **shrunk}
    return found


def _shrunk(config: Any, groups: tuple[dict[str, int], ...]) -> dict[str, Any]:
    """The fields of ``groups`` that ``config`` sets above their shrunk value, shrunk."""
    found: dict[str, Any] = {}
    for group in groups:
        for name, value in group.items():
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


def _zoo() -> Any:
    """tests/hosts/transformers/zoo.py (the test data), loaded once."""
    zoo = sys.modules.get("transformers_zoo")
    if zoo is None:
        spec = importlib.util.spec_from_file_location("transformers_zoo", _ZOO)
        zoo = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(zoo)
    return zoo


def _zoo_config(model_type: str) -> dict[str, Any] | None:
    """The keyword arguments the zoo builds ``model_type`` with (its first row), or None."""
    zoo = _zoo()
    row = next((a for a in zoo.ARCHITECTURES + zoo.REFUSED if a.model_type == model_type), None)
    return None if row is None else {**zoo._COMMON, **row.config}


def _attempt(model_type: str, groups: tuple[dict[str, int], ...] | None, seed: int
             ) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Build and run one attempt; ``groups`` None: the zoo's config."""
    from transformers import AutoConfig, AutoModel
    from oretrofit.hosts.transformers.contracts import example_inputs
    if groups is None:
        kwargs = _zoo_config(model_type)
        if kwargs is None:
            raise _NotInZoo(model_type)
    else:
        kwargs = _overrides(AutoConfig.for_model(model_type), groups)
    config = AutoConfig.for_model(model_type, **kwargs)
    with torch.device("meta"):
        count = sum(p.numel() for p in AutoModel.from_config(config).parameters())
    if count > MAX_PARAMETERS:
        raise ValueError(f"{count / 1e6:.0f} M parameters (more than the census' cap of "
                         f"{MAX_PARAMETERS / 1e6:.0f} M)")
    torch.manual_seed(seed)
    model = _zoo().jitter(AutoModel.from_config(config), seed)        # as the zoo builds
    try:
        inputs = example_inputs(model, seed=seed)
        with torch.no_grad():
            model(**inputs)
    except Exception as error:
        raise _InputsFail(f"the example inputs do not run it: {type(error).__name__}: "
                          f"{error}", attention_classes(model)) from error
    return model, inputs


def build(model_type: str, seed: int
          ) -> tuple[nn.Module, dict[str, torch.Tensor], str] | Unbuilt:
    """``(model, example inputs, attempt name)``, or why no tiny model builds and runs."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    if model_type not in MODEL_MAPPING_NAMES:
        return Unbuilt("no AutoModel class for this config (a sub-config, or a model without a "
                       "base class)")
    errors, ran = [], []
    for name, groups in ATTEMPTS.items():
        try:
            return (*_attempt(model_type, groups, seed), name)
        except _NotInZoo:
            continue
        except Exception as error:                          # noqa: BLE001 - the next attempt
            ran += [error] if isinstance(error, _InputsFail) else []
            errors.append(f"{name}: {type(error).__name__}: {str(error)[:300]}")
    reason = Unbuilt("; ".join(errors))
    reason.built = bool(ran)
    reason.attention = ran[0].attention if ran else []
    return reason


_AUDIO = ("SPEECH_SEQ_2_SEQ", "CTC", "AUDIO_CLASSIFICATION", "AUDIO_XVECTOR",
          "AUDIO_FRAME_CLASSIFICATION", "TEXT_TO_WAVEFORM", "TEXT_TO_SPECTROGRAM", "RNNT", "TDT")
_MULTIMODAL = ("IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM", "ZERO_SHOT_IMAGE_CLASSIFICATION",
               "ZERO_SHOT_OBJECT_DETECTION", "VISUAL_QUESTION_ANSWERING",
               "DOCUMENT_QUESTION_ANSWERING", "RETRIEVAL", "TEXT_RECOGNITION")
_TEXT_ENCODER = ("MASKED_LM", "TEXT_ENCODING", "SEQUENCE_CLASSIFICATION", "TOKEN_CLASSIFICATION",
                 "QUESTION_ANSWERING", "MULTIPLE_CHOICE")
_VISION = ("IMAGE_CLASSIFICATION", "IMAGE", "MASKED_IMAGE_MODELING", "VIDEO_CLASSIFICATION",
           "CAUSAL_IMAGE_MODELING", "BACKBONE", "DEPTH_ESTIMATION", "SEMANTIC_SEGMENTATION")
# first listed wins: a model type in several task mappings takes the first category it is in
_CATEGORIES = (("audio", _AUDIO), ("multimodal", _MULTIMODAL),
               ("encoder-decoder", ("SEQ_TO_SEQ_CAUSAL_LM",)), ("text encoder", ("MASKED_LM",)),
               ("text decoder", ("CAUSAL_LM",)), ("text encoder", _TEXT_ENCODER),
               ("vision", _VISION))


def category(model_type: str) -> str:
    """audio, multimodal, encoder-decoder, text encoder, text decoder, vision or other: the first
    of :data:`_CATEGORIES` whose transformers task mappings (``MODEL_FOR_<TASK>_MAPPING_NAMES``)
    name the model type; else by its name (``…vision…`` / ``…text…`` sub-models)."""
    from transformers.models.auto import modeling_auto
    for name, tasks in _CATEGORIES:
        if any(model_type in getattr(modeling_auto, f"MODEL_FOR_{task}_MAPPING_NAMES", {})
               for task in tasks):
            return name
    if "vision" in model_type or model_type.endswith(("_image_model", "_visual")):
        return "vision"
    if "text" in model_type:
        return "text encoder"
    if "audio" in model_type or "speech" in model_type:
        return "audio"
    return "other"


def attention_classes(model: nn.Module) -> list[str]:
    """The classes of ``model``'s softmax attention modules, as the host detects them: modules
    that call transformers' attention interface, compute their weights by a softmax themselves
    (:func:`~oretrofit.hosts.transformers.layouts.computes_attention`), or are attention-named
    and call ``scaled_dot_product_attention``; empty for attention-free (convolutional,
    state-space, recurrent) models, which the host refuses by design."""
    from oretrofit.hosts.transformers.layouts import calls_attention_interface, computes_attention
    return sorted({type(m).__name__ for m in model.modules()
                   if calls_attention_interface(m) or computes_attention(m)
                   or ("Attention" in type(m).__name__
                       and "scaled_dot_product_attention" in _source(type(m)))})


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""
