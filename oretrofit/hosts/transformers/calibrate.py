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

from ..._surgery.calibrate import calibrate

__all__ = ["BUILTIN_TEXTS", "GIVEN_TEXTS", "DEFAULT_MAX_TOKENS", "builtin_texts", "token_cap",
           "text_batches", "calibrate_text"]

BUILTIN_TEXTS = "built-in"          # the data name of :func:`builtin_texts`
GIVEN_TEXTS = "given"               # the data name of lines given without a source
DEFAULT_MAX_TOKENS = 128            # tokens kept per line unless the model has fewer positions


def builtin_texts() -> list[str]:
    """The small calibration set used when no text is given: the host report's sentences and
    prompts (:mod:`oretrofit.hosts.transformers.measures`: everyday English, one line of code)."""
    from .measures import PROMPTS, SENTENCES
    return [*SENTENCES, *PROMPTS]


def token_cap(model: nn.Module, tokenizer: Any, max_tokens: int | None) -> int:
    """The tokens kept per line: ``max_tokens``, or :data:`DEFAULT_MAX_TOKENS` when None, never
    more than the model takes: its position table (``config.max_position_embeddings``) and the
    tokenizer's ``model_max_length``, whichever is smaller (the default shrinks to it; a larger
    ``max_tokens`` is an error)."""
    limits = [getattr(model.config, "max_position_embeddings", None),
              getattr(tokenizer, "model_max_length", None)]
    limit = min([int(n) for n in limits if isinstance(n, int) and 0 < n < 10**9], default=None)
    if max_tokens is None:
        return min(DEFAULT_MAX_TOKENS, limit or DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if limit is not None and max_tokens > limit:
        raise ValueError(f"max_tokens {max_tokens} exceeds the {limit} positions "
                         f"{type(model).__name__} takes; use --max-tokens {limit} or fewer")
    return max_tokens


def text_batches(model: nn.Module, tokenizer: Any, lines: Sequence[str],
                 max_tokens: int | None = None) -> list[dict[str, torch.Tensor]]:
    """One input dict per non-blank line: its token ids ``(1, n)``, n ≤ :func:`token_cap`
    (``decoder_input_ids`` too for an encoder-decoder model)."""
    config = model.config
    if getattr(config, "image_size", None) is not None:
        raise ValueError(f"{type(model).__name__} reads images, not text; calibrate it from "
                         "Python with oretrofit.calibrate(model, [{'pixel_values': ...}, ...])")
    max_tokens = token_cap(model, tokenizer, max_tokens)
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


def calibrate_text(model: nn.Module, tokenizer: Any, lines: Sequence[str] | None = None, *,
                   source: str | None = None, arm: str = "full-o", delta: float = 1e-3,
                   quantile: float = 0.01, max_tokens: int | None = None,
                   exclude: Sequence[str] | None = None) -> dict[str, Any]:
    """The calibrated patch spec of ``arm`` for ``model`` over ``lines`` (default:
    :func:`builtin_texts`): ``τ_site = δ/(1−δ)·Q_q(‖h‖²)``; each line cut to ``max_tokens``
    tokens (see :func:`text_batches`). ``source`` names where the lines came from in the spec (a
    file; :data:`BUILTIN_TEXTS` without lines, :data:`GIVEN_TEXTS` with lines and no source)."""
    if lines is None:
        lines, source = builtin_texts(), source or BUILTIN_TEXTS
    source = source or GIVEN_TEXTS
    max_tokens = token_cap(model, tokenizer, max_tokens)
    batches = text_batches(model, tokenizer, lines, max_tokens)
    text = "\n".join(line for line in lines if line.strip())
    data = {"texts": source, "texts_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "rows": len(batches), "tokens": int(sum(b["input_ids"].numel() for b in batches)),
            "max_tokens": max_tokens, "tokenizer": type(tokenizer).__name__,
            "model_class": type(model).__name__}
    return calibrate(model, batches, delta, quantile, arm=arm, exclude=exclude, data=data)
