"""Example inputs of a transformers model for the contracts (:mod:`.contracts`): by the model's
main input and forward signature, and the config fields that size them."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["example_inputs", "accepts", "GRIDS"]


_DEFAULT_IMAGE = 64                   # pixels a side when the config names no image size
_VISUAL_BOXES = 5                     # region features of a vision-and-language model (LXMERT)


def example_inputs(model: nn.Module, batch: int = 2, tokens: int = 7, seed: int = 0
                   ) -> dict[str, Any]:
    """Model inputs, by the model's main input: pre-flattened patches and their grid for a vision
    tower that takes a ``grid_thw`` (:func:`_patch_grid`), a waveform for audio models (``input_values``,
    long enough for ``tokens`` frames), pixels for vision models (``pixel_values`` /
    ``pixel_values_videos``: :func:`_pixels`), token ids (+ decoder ids) otherwise; then the
    further inputs its forward asks for (:func:`_side_inputs`)."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    if any(accepts(model, name) for name in GRIDS):
        return _patch_grid(model, batch, generator)
    if main == "input_values":
        return {"input_values": torch.randn(batch, _samples(config, tokens),
                                            generator=generator)}
    if main.startswith("pixel_values") or getattr(config, "image_size", None) is not None:
        pixels = _pixels(config, batch, generator)
        inputs = {main if main.startswith("pixel_values") else "pixel_values": pixels}
    else:
        ids = torch.randint(3, config.vocab_size, (batch, tokens), generator=generator)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = ids[:, : tokens - 2]
    return {**inputs, **_side_inputs(model, inputs, generator)}


GRIDS = ("grid_thw", "image_grid_thw")   # (images, 3): temporal, height, width in patches
_GRID_SIDE = 4                          # patches a side of each image in a patch grid


def _patch_grid(model: nn.Module, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
    """A vision tower's pre-flattened patches ``(batch · 1 · s · s, C · T · P · P)`` (its first
    forward parameter: ``hidden_states`` / ``pixel_values``) and their grid ``(batch, 3)`` of
    ``(1, s, s)``, s = :data:`_GRID_SIDE` (a multiple of the tower's merge size); C the config's
    ``in_channels`` / ``num_channels`` (3), T its ``temporal_patch_size`` / ``patch_temporal``
    (1), P its ``patch_size``; ``merge_sizes`` ``(batch,)`` where the forward asks for them."""
    config = model.config
    channels = _field(config, ("in_channels", "num_channels"), 3)
    temporal = _field(config, ("temporal_patch_size", "patch_temporal"), 1)
    merge = _field(config, ("spatial_merge_size", "merge_size", "merge_kernel_size"), 1)
    side = _GRID_SIDE * merge
    grid = torch.tensor([[1, side, side]] * batch)
    rows = batch * side * side, channels * temporal * config.patch_size ** 2
    main = next(iter(inspect.signature(model.forward).parameters))
    inputs = {main: torch.randn(rows, generator=generator),
              next(n for n in GRIDS if accepts(model, n)): grid}
    if accepts(model, "merge_sizes"):
        inputs["merge_sizes"] = torch.full((batch,), merge)
    return inputs


def _field(config: Any, names: tuple[str, ...], default: int) -> int:
    """The first of ``names`` the config sets (the first entry of a list), else ``default``."""
    value = next((v for n in names if (v := getattr(config, n, None)) is not None), default)
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _image_size(config: Any) -> tuple[int, int]:
    """``(height, width)`` of ``config.image_size`` (an int, or a list / tuple ending in them),
    else of ``crop_size``, else :data:`_DEFAULT_IMAGE`."""
    size = next((s for s in (getattr(config, "image_size", None),
                             getattr(config, "crop_size", None)) if s is not None),
                _DEFAULT_IMAGE)
    return (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size[-2:])


def _pixels(config: Any, batch: int, generator: torch.Generator) -> Tensor:
    """``(B, C, H, W)`` pixels, or ``(B, T, C, H, W)`` for a video config (``num_frames`` /
    ``frames_per_clip``); ``num_channels`` channels (3 where the config names none)."""
    frames = getattr(config, "num_frames", None) or getattr(config, "frames_per_clip", None)
    shape = (batch, *([frames] if frames else []), getattr(config, "num_channels", 3),
             *_image_size(config))
    return torch.randn(shape, generator=generator)


def _side_inputs(model: nn.Module, inputs: dict[str, Tensor], generator: torch.Generator
                 ) -> dict[str, Any]:
    """The further inputs ``model``'s forward takes, beside its main input: ``bbox`` (valid
    boxes, one a token), ``visual_feats`` / ``visual_pos`` (region features), ``noise`` (the
    patch order a random-masking model shuffles by, fixed so that calls agree) and
    ``use_cache=False`` (a one-shot forward; hybrid caches of linear-attention layers cannot
    answer its length)."""
    config, found = model.config, {}
    first = next(iter(inputs.values()))
    if accepts(model, "bbox") and "input_ids" in inputs:
        found["bbox"] = _boxes(config, first.shape, generator)
    if accepts(model, "visual_feats"):
        found["visual_feats"] = torch.rand(first.shape[0], _VISUAL_BOXES,
                                           config.visual_feat_dim, generator=generator)
        found["visual_pos"] = torch.rand(first.shape[0], _VISUAL_BOXES, config.visual_pos_dim,
                                         generator=generator)
    if accepts(model, "noise") and first.dim() == 4 and isinstance(config.patch_size, int):
        height, width = first.shape[-2:]
        patches = (height // config.patch_size) * (width // config.patch_size)
        found["noise"] = torch.rand(first.shape[0], patches, generator=generator)
    if accepts(model, "use_cache") and getattr(config, "use_cache", False):
        found["use_cache"] = False
    return found


def _boxes(config: Any, shape: torch.Size, generator: torch.Generator) -> Tensor:
    """``(B, N, dim_bbox)`` boxes, corners ordered (x0 ≤ x1, y0 ≤ y1): integer coordinates
    below ``max_2d_position_embeddings`` where the config embeds them, else in [0, 1]."""
    corners = torch.rand(*shape, getattr(config, "dim_bbox", 4) // 2, 2, generator=generator)
    boxes = corners.sort(dim=-2).values.flatten(-2)          # (x0, y0) first, then (x1, y1)
    table = getattr(config, "max_2d_position_embeddings", None)
    return (boxes * (table - 1)).long() if table else boxes


def _samples(config: Any, frames: int) -> int:
    """Waveform length whose feature encoder (``conv_kernel`` / ``conv_stride``) emits ``frames``
    frames: L_{k+1} = (L_k − kernel) // stride + 1, inverted layer by layer."""
    length = frames
    for kernel, stride in reversed(list(zip(config.conv_kernel, config.conv_stride))):
        length = (length - 1) * stride + kernel
    return length


def accepts(module: nn.Module, name: str) -> bool:
    """Whether ``module``'s forward takes a parameter ``name``."""
    return name in inspect.signature(module.forward).parameters
