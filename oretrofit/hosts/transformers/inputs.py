"""Example inputs of a transformers model for the contracts (:mod:`.contracts`): by the model's
main input and forward signature, and the config fields that size them."""

from __future__ import annotations

import inspect
import re
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["example_inputs", "zero_padded_inputs", "token_id_rows", "learned_positions", "accepts",
           "GRIDS", "PATCH_ROWS"]


_DEFAULT_IMAGE = 64                   # pixels a side when the config names no image size
_VISUAL_BOXES = 5                     # region features of a vision-and-language model (LXMERT)


def example_inputs(model: nn.Module, batch: int = 2, tokens: int = 7, seed: int = 0
                   ) -> dict[str, Any]:
    """Model inputs, by the model's main input (:func:`_main_input`): pre-flattened patches and
    their grid for a vision tower that takes a ``grid_thw`` (:func:`_patch_grid`), patch rows
    with their sizes or positions for one that takes those (:func:`_patch_rows`), a waveform for
    audio models (``input_values``, long enough for ``tokens`` frames), pixels for vision models
    (``pixel_values`` / ``pixel_values_videos``: :func:`_pixels`), token ids (+ decoder ids)
    otherwise, and both ids and pixels for a model with a text and an image tower
    (:func:`_two_towers`); then the further inputs its forward asks for (:func:`_side_inputs`)."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    main = _main_input(model)
    if any(accepts(model, name) for name in GRIDS):
        return _patch_grid(model, batch, generator)
    if any(accepts(model, name) for name in PATCH_ROWS):
        return _patch_rows(model, batch, generator)
    if main == "input_values":
        return {"input_values": torch.randn(batch, _samples(config, tokens),
                                            generator=generator)}
    inputs: dict[str, Any] = {}
    both = _two_towers(model)
    if main.startswith("pixel_values") or getattr(config, "image_size", None) is not None or both:
        pixels = _pixels(_image_config(config) or config, batch, generator)
        inputs[main if main.startswith("pixel_values") else "pixel_values"] = pixels
    if both or not inputs:
        ids = torch.randint(3, _vocabulary(model), (batch, tokens), generator=generator)
        inputs.update(input_ids=ids, attention_mask=torch.ones_like(ids))
        if getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = ids[:, : tokens - 2]
    return {**inputs, **_side_inputs(model, inputs, generator)}


def _main_input(model: nn.Module) -> str:
    """The model's ``main_input_name`` where its forward takes it, else the forward's first
    parameter (Gemma4's and Kimi-K2.5's vision towers inherit ``input_ids`` but take pixels)."""
    main = getattr(model, "main_input_name", "input_ids")
    return main if accepts(model, main) else _first_parameter(model)


def _first_parameter(model: nn.Module) -> str:
    """The name of the first parameter of ``model.forward``."""
    return next(iter(inspect.signature(model.forward).parameters))


def _image_config(config: Any) -> Any:
    """The config that sizes the model's images: the config itself where it names an
    ``image_size``, else a ``vision_config`` that does (a dual encoder's), else None."""
    for candidate in (config, getattr(config, "vision_config", None)):
        if getattr(candidate, "image_size", None) is not None:
            return candidate
    return None


_IMAGE_TOKENS = ("image_token_id", "image_token_index")


def _two_towers(model: nn.Module) -> bool:
    """Whether the model reads token ids and pixels side by side: its forward takes both, its
    config names no image token (the placeholder a vision-language model puts its image
    features at; there text alone runs), and it is a contrastive dual encoder (``return_loss``:
    CLIP-like) or an image model prompted by text (pixels its main input: SAM3). A captioner
    that prepends its image to the text (GIT) runs on text alone."""
    config = model.config
    return (accepts(model, "input_ids") and accepts(model, "pixel_values")
            and _image_config(config) is not None
            and not any(getattr(config, name, None) is not None for name in _IMAGE_TOKENS)
            and (accepts(model, "return_loss") or _main_input(model).startswith("pixel_values")))


GRIDS = ("grid_thw", "image_grid_thw")   # (images, 3): temporal, height, width in patches
_GRID_SIDE = 4                          # patches a side of each image in a patch grid


def _patch_grid(model: nn.Module, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
    """A vision tower's pre-flattened patches ``(batch · 1 · s · s, C · T · P · P)`` (its first
    forward parameter: ``hidden_states`` / ``pixel_values``), or ``(batch · s · s, C, P, P)``
    where a 2-D convolution embeds each patch (Kimi-K2.5), and their grid ``(batch, 3)`` of
    ``(1, s, s)``, s = :data:`_GRID_SIDE` (a multiple of the tower's merge size); C the config's
    ``in_channels`` / ``num_channels`` (3), T its ``temporal_patch_size`` / ``patch_temporal``
    (1), P its ``patch_size``; ``merge_sizes`` ``(batch,)`` where the forward asks for them."""
    config = model.config
    channels = _field(config, ("in_channels", "num_channels"), 3)
    temporal = _field(config, ("temporal_patch_size", "patch_temporal"), 1)
    merge = _field(config, ("spatial_merge_size", "merge_size", "merge_kernel_size"), 1)
    side = _GRID_SIDE * merge
    grid = torch.tensor([[1, side, side]] * batch)
    patch = config.patch_size
    by_image = any(isinstance(m, nn.Conv2d) and m.kernel_size == (patch, patch)
                   for m in model.modules())
    rows = (batch * side * side, *((channels, patch, patch) if by_image
                                   else (channels * temporal * patch ** 2,)))
    inputs = {_first_parameter(model): torch.randn(rows, generator=generator),
              next(n for n in GRIDS if accepts(model, n)): grid}
    if accepts(model, "merge_sizes"):
        inputs["merge_sizes"] = torch.full((batch,), merge)
    return inputs


def _vocabulary(model: nn.Module) -> int:
    """How many token ids the model embeds: the text config's ``vocab_size`` (a composite
    config's text sub-config holds it), else the hash buckets of a model that hashes any id
    (CANINE's code points), else the word embedding's rows."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for found in (getattr(text, "vocab_size", None), getattr(config, "num_hash_buckets", None)):
        if isinstance(found, int):
            return found
    return model.get_input_embeddings().num_embeddings


PATCH_ROWS = ("spatial_shapes", "pixel_position_ids", "target_sizes")


def _patch_rows(model: nn.Module, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
    """Images of s × s patches (s = :data:`_GRID_SIDE` times the tower's pooling or window
    kernel) for a tower that takes flattened patches with their sizes or positions: rows
    ``(batch, s · s, C · P · P)`` with ``spatial_shapes`` ``(batch, 2)`` of ``(s, s)`` and an
    all-ones ``pixel_attention_mask`` (SigLIP2), or with ``pixel_position_ids``
    ``(batch, s · s, 2)`` of (column, row) (Gemma4); MiniCPM-V's pack, every image's patches side
    by side in one strip of pixels ``(1, C, P, batch · s · s · P)``, with ``target_sizes``
    ``(batch, 2)`` of ``(s, s)``."""
    config = model.config
    channels, patch = _field(config, ("num_channels", "in_channels"), 3), config.patch_size
    side = _GRID_SIDE * _field(config, ("pooling_kernel_size", "window_kernel_size"), 1)
    sizes = torch.tensor([[side, side]] * batch)
    main = _main_input(model)
    if accepts(model, "target_sizes"):
        strip = torch.randn(1, channels, patch, batch * side * side * patch, generator=generator)
        return {main: strip, "target_sizes": sizes}
    rows = torch.randn(batch, side * side, channels * patch * patch, generator=generator)
    if accepts(model, "spatial_shapes"):
        return {main: rows, "spatial_shapes": sizes,
                "pixel_attention_mask": torch.ones(batch, side * side, dtype=torch.long)}
    row, column = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.stack([column.flatten(), row.flatten()], dim=-1)
    return {main: rows, "pixel_position_ids": positions.expand(batch, -1, -1)}


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
        found["bbox"] = _boxes(config, inputs["input_ids"].shape, generator)
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


_POSITION_TABLE = re.compile(r"(^|_)(pos|position|positions|wpe)(_|$)")


def learned_positions(model: nn.Module) -> bool:
    """Whether ``model`` looks its tokens' positions up in a learned table: an ``nn.Embedding``
    other than the input embedding named for positions (``position_embeddings``,
    ``embed_positions``, ``wpe``); rotary, ALiBi and relative schemes have none."""
    words = model.get_input_embeddings()
    return any(isinstance(m, nn.Embedding) and m is not words
               and _POSITION_TABLE.search(name.rpartition(".")[2])
               for name, m in model.named_modules())


def token_id_rows(model: nn.Module, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
    """``sequences`` as 1-D int64 tensors of ids the model embeds, ``[0, vocabulary)`` (its input
    embedding's rows), or a ValueError naming the sequence, what is wrong and the fix: text
    (tokenize it with the model's tokenizer), a flat list of ids (one sequence: ``[ids]``), a
    sequence that is not 1-D (a tokenizer's ``(1, n)`` tensor: ``ids[0]``), float or bool ids
    (a float id would be cut to an integer silently), an empty one, an id out of range."""
    what = type(model).__name__
    if isinstance(sequences, (str, bytes)) or (
            isinstance(sequences, (list, tuple)) and any(isinstance(s, str) for s in sequences)):
        raise ValueError(f"sequences holds text, not token ids; tokenize it with {what}'s "
                         "tokenizer first: [tokenizer(text)['input_ids'] for text in texts]")
    if torch.is_tensor(sequences) and sequences.dim() != 2:
        raise ValueError(f"sequences is a {sequences.dim()}-D tensor; give a list of 1-D token "
                         "id sequences (or a 2-D tensor, one sequence a row): [ids] for one")
    try:
        items = list(sequences)
    except TypeError:
        raise ValueError(f"sequences must be a list of token id sequences, got "
                         f"{type(sequences).__name__}") from None
    if not items:
        raise ValueError("sequences must be a non-empty list of non-empty token id lists")
    if all(isinstance(i, (int, np.integer)) for i in items):
        raise ValueError("sequences is one flat list of token ids; give a list of sequences: "
                         "[ids] for one")
    vocabulary = model.get_input_embeddings().num_embeddings
    return [_token_ids(index, ids, vocabulary, what) for index, ids in enumerate(items)]


def _token_ids(index: int, ids: Any, vocabulary: int, what: str) -> Tensor:
    """Sequence ``index`` as a 1-D int64 tensor, checked (see :func:`token_id_rows`)."""
    try:
        row = torch.as_tensor(ids if torch.is_tensor(ids) or isinstance(ids, np.ndarray)
                              else list(ids))
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise ValueError(f"sequence {index} is not a sequence of integer token ids ({exc}); "
                         f"tokenize text with {what}'s tokenizer") from None
    if row.dim() != 1:
        raise ValueError(f"sequence {index} has shape {tuple(row.shape)}, not 1-D; give each "
                         "sequence as 1-D ids (a tokenizer's return_tensors='pt' ids are "
                         "(batch, n): pass them whole as the 2-D batch, or ids[0] for a row)")
    if row.numel() == 0:
        raise ValueError(f"sequence {index} is empty; every sequence needs at least one token")
    if row.dtype == torch.bool:
        raise ValueError(f"sequence {index} holds booleans, not token ids (a mask?); give the "
                         "integer ids")
    if row.is_floating_point() or row.is_complex():
        raise ValueError(f"sequence {index} holds {row.dtype} values, not integer token ids (a "
                         "float id would be cut to an integer); give integers, e.g. "
                         "ids.long() if they are whole numbers")
    low, high = int(row.min()), int(row.max())
    if low < 0 or high >= vocabulary:
        bad = low if low < 0 else high
        raise ValueError(f"sequence {index} holds token id {bad}, outside the {vocabulary} ids "
                         f"{what} embeds ([0, {vocabulary})); use ids of the model's own "
                         "tokenizer")
    return row.long()


def zero_padded_inputs(model: nn.Module, sequences: Sequence[Sequence[int]],
                       side: str = "right") -> dict[str, Tensor]:
    """Mask-free batch: token embeddings zero-padded to one length at the carrier boundary.

    Returns ``inputs_embeds`` ``(B, N, d)`` (exact zeros at padding) and ``position_ids``
    ``(B, N)`` that give every real token the position it has alone: ``0 … n−1`` on either side
    (right padding continues the count, left padding sits at position 0, a row of any learned
    table or rotary scheme; under ``full-o`` a zero carrier reads none of it). A model whose
    forward takes no ``position_ids`` numbers tokens by their place in the batch: it gets none;
    its relative or ALiBi positions do not move with left padding, a learned table's would, so
    left padding is refused there (:func:`learned_positions`). Under a ``full-o`` retrofit
    the zero rows are inert: pass no attention mask. ``sequences``: a list of 1-D token id
    sequences (or a 2-D tensor of rows), checked by :func:`token_id_rows`.
    """
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    rows = token_id_rows(model, sequences)
    positioned = accepts(model, "position_ids")
    if side == "left" and not positioned and learned_positions(model) \
            and len({len(r) for r in rows}) > 1:
        raise ValueError(f"{type(model).__name__} looks positions up in a learned table but its "
                         "forward takes no position_ids, so it numbers tokens by their place in "
                         "the batch and left padding would move the real tokens of shorter "
                         "sequences; use side='right'")
    embed = model.get_input_embeddings()
    width = max(len(r) for r in rows)
    inputs = embed.weight.new_zeros(len(rows), width, embed.embedding_dim)
    positions = torch.empty(len(rows), width, dtype=torch.long, device=inputs.device)
    for index, ids in enumerate(rows):
        start = 0 if side == "right" else width - len(ids)
        inputs[index, start:start + len(ids)] = embed(ids.to(inputs.device))
        positions[index] = (torch.arange(width, device=inputs.device) - start).clamp_min(0)
    return {"inputs_embeds": inputs, **({"position_ids": positions} if positioned else {})}
