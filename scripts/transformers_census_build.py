"""Tiny models from default configs, and the category of a model type, for
``scripts/transformers_census.py``.

A default config is shrunk as the self-check shrinks a user's
(:mod:`oretrofit.hosts.transformers.shrink`: the size fields it has, per-layer lists cut to 2
layers, the fields tied to them kept in relation). The example inputs are
:func:`oretrofit.hosts.transformers.contracts.example_inputs` (by the model's main input and
forward signature). Attempts, first that builds and runs its example inputs wins: the tiny config
``tests/hosts/transformers/zoo.py`` gives the model type (its first row) where it has one, then
the shrinks of :data:`~oretrofit.hosts.transformers.shrink.GROUPS` (every field, every field but
the image ones, every field at a width of 192, the layer counts only); each under the cap of
30 M parameters (counted on the meta device first).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oretrofit.hosts.transformers.shrink import GROUPS, shrunk_fields, tiny_model

__all__ = ["build", "category", "attention_classes", "ATTEMPTS", "Unbuilt"]

# the zoo's row first, then the package's shrinks (the self-check's too)
ATTEMPTS: dict[str, tuple[dict[str, int], ...] | None] = {"zoo": None, **GROUPS}
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
        kwargs = shrunk_fields(AutoConfig.for_model(model_type), groups)
    config = AutoConfig.for_model(model_type, **kwargs)
    model = tiny_model(AutoModel._model_mapping[type(config)], config, seed)   # as the zoo builds
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
