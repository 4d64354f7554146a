"""Calibrate a transformers model's per-site τ on lines of text (see :func:`oretrofit.calibrate`).

Each line is tokenized with the model's own tokenizer and run alone (batch 1, no padding), so
every carrier a site sees is a real token's: no pad token is counted. An encoder-decoder model's
decoder reads the same tokens. The spec records the text (SHA-256 of the lines, their number and
tokens) beside what :func:`oretrofit.calibrate` records (the token tensors' SHA-256, the
model's weights).
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch
from torch import nn

from ._calibrate import calibrate

__all__ = ["BUILTIN_TEXTS", "builtin_texts", "text_batches", "calibrate_text"]

BUILTIN_TEXTS = "built-in"          # the data name of :func:`builtin_texts`


def builtin_texts() -> list[str]:
    """The small calibration set used when no text is given: the host report's sentences and
    prompts (:mod:`oretrofit.hosts_report`: everyday English, one line of code)."""
    from .hosts_report import PROMPTS, SENTENCES
    return [*SENTENCES, *PROMPTS]


def text_batches(model: nn.Module, tokenizer: Any, lines: Sequence[str], max_tokens: int
                 ) -> list[dict[str, torch.Tensor]]:
    """One input dict per non-blank line: its token ids ``(1, n)``, n ≤ ``max_tokens``
    (``decoder_input_ids`` too for an encoder-decoder model)."""
    config = model.config
    if getattr(config, "image_size", None) is not None:
        raise ValueError(f"{type(model).__name__} reads images, not text; calibrate it from "
                         "Python with oretrofit.calibrate(model, [{'pixel_values': ...}, ...])")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    batches = []
    for line in lines:
        if not line.strip():
            continue
        ids = torch.tensor([tokenizer(line, truncation=True, max_length=max_tokens)["input_ids"]])
        batch = {"input_ids": ids}
        if getattr(config, "is_encoder_decoder", False):
            batch["decoder_input_ids"] = ids
        batches.append(batch)
    if not batches:
        raise ValueError("the calibration text has no non-blank line; give at least one line")
    return batches


def calibrate_text(model: nn.Module, tokenizer: Any, lines: Sequence[str], *, source: str,
                   arm: str = "full-o", delta: float = 1e-3, quantile: float = 0.01,
                   max_tokens: int = 128) -> dict[str, Any]:
    """The calibrated patch spec of ``arm`` for ``model`` over ``lines`` (``source`` names where
    they came from: a file, or :data:`BUILTIN_TEXTS`): ``τ_site = δ/(1−δ)·Q_q(‖h‖²)``."""
    batches = text_batches(model, tokenizer, lines, max_tokens)
    text = "\n".join(line for line in lines if line.strip())
    data = {"texts": source, "texts_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "rows": len(batches), "tokens": int(sum(b["input_ids"].numel() for b in batches)),
            "max_tokens": max_tokens, "tokenizer": type(tokenizer).__name__,
            "model_class": type(model).__name__}
    return calibrate(model, batches, delta, quantile, arm=arm, data=data)
