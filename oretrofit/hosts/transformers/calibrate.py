"""Calibrate a transformers model's per-site τ on lines of text (see :func:`oretrofit.calibrate`).

Each line is tokenized with the model's own tokenizer and cut to :func:`token_cap` tokens. Lines
are run in batches of equal length (one length a batch, up to :data:`BATCH_TOKENS` tokens), so no
batch holds a pad token and every carrier a site sees is a real token's, as it is when the line
runs alone; all sites record their carriers in the same forwards. The text is read lazily and
only until :data:`DEFAULT_TOKEN_BUDGET` tokens (``token_budget``) are taken, a
:class:`TextBudgetWarning` saying so when the budget cuts it: time and memory are bounded by the
budget and one batch, not by the text. An encoder-decoder model's decoder reads the same tokens.
The spec records the text (SHA-256 of the lines used, their number and tokens) beside what
:func:`oretrofit.calibrate` records (the model's weights).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..._surgery.calibrate import calibrate

__all__ = ["BUILTIN_TEXTS", "GIVEN_TEXTS", "DEFAULT_MAX_TOKENS", "DEFAULT_TOKEN_BUDGET",
           "BATCH_TOKENS", "CHARS_PER_TOKEN", "TextBudgetWarning", "builtin_texts", "token_cap",
           "line_chars", "budget_note", "calibrate_text"]

BUILTIN_TEXTS = "built-in"          # the data name of :func:`builtin_texts`
GIVEN_TEXTS = "given"               # the data name of lines given without a source
DEFAULT_MAX_TOKENS = 128            # tokens kept per line unless the model has fewer positions
DEFAULT_TOKEN_BUDGET = 100_000      # tokens calibrated on at most, unless raised
BATCH_TOKENS = 4096                 # tokens (rows × length) one forward runs at most
CHARS_PER_TOKEN = 100               # characters of a line read per token kept (a longer line is
                                    # cut before tokenizing: no word piece spans more)


class TextBudgetWarning(UserWarning):
    """The token budget stopped the reading of the calibration text before its end."""


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


def line_chars(cap: int) -> int:
    """The characters of a line read for ``cap`` tokens: :data:`CHARS_PER_TOKEN` per token."""
    return CHARS_PER_TOKEN * cap


@dataclass
class _Tokens:
    """The calibration text as token ids, line by line in reading order, and its digests: of the
    lines (``"\\n"``-joined, as given) and of each line's input tensors as
    :func:`oretrofit.calibrate` digests a batch's (its ids ``(1, n)``, twice for an
    encoder-decoder model: encoder and decoder ids)."""

    inputs: int = 1
    rows: list[np.ndarray] = field(default_factory=list)
    tokens: int = 0
    texts: Any = field(default_factory=hashlib.sha256)
    ids: Any = field(default_factory=hashlib.sha256)
    cut: bool = False

    def add(self, line: str, ids: list[int]) -> None:
        self.texts.update(("\n" if self.rows else "").encode() + line.encode())
        row = np.asarray(ids, dtype=np.int64)
        for _ in range(self.inputs):
            self.ids.update(str((row.dtype, (1, row.size))).encode())
            self.ids.update(row.tobytes())
        self.rows.append(row)
        self.tokens += row.size


def _tokenize(tokenizer: Any, lines: Iterable[str], cap: int, budget: int, inputs: int
              ) -> _Tokens:
    """The non-blank lines' token ids (each line cut to :func:`line_chars` characters, then to
    ``cap`` tokens), read until the next line would take the total past ``budget``."""
    found, chars = _Tokens(inputs), line_chars(cap)
    for line in lines:
        if not isinstance(line, str):
            raise ValueError(f"calibration lines must be strings, got {type(line).__name__} "
                             f"({line!r:.60}); give the text, one sample per line")
        line = line[:chars]
        if not line.strip():
            continue
        ids = tokenizer(line, truncation=True, max_length=cap)["input_ids"]
        if found.tokens + len(ids) > budget:
            found.cut = True
            break
        found.add(line, ids)
    if not found.rows:
        raise ValueError("the calibration text has no non-blank line; give at least one line")
    return found


def _groups(rows: list[np.ndarray]) -> Iterator[list[np.ndarray]]:
    """The rows in groups of one length each, at most :data:`BATCH_TOKENS` tokens a group (one
    row where a row alone is longer), shortest first."""
    by_length: dict[int, list[np.ndarray]] = {}
    for row in rows:
        by_length.setdefault(row.size, []).append(row)
    for length, same in sorted(by_length.items()):
        step = max(1, BATCH_TOKENS // length)
        for start in range(0, len(same), step):
            yield same[start:start + step]


def budget_note(data: Mapping[str, Any]) -> str:
    """What the token budget cut, from a calibrated spec's ``calibration.data`` text record."""
    return (f"the calibration text was read up to the token budget of {data['token_budget']:,} "
            f"tokens: τ is calibrated on its first {data['rows']:,} non-blank lines "
            f"({data['tokens']:,} tokens) and the rest was not read; raise the budget "
            "(token_budget=, --token-budget) to calibrate on more of it")


def calibrate_text(model: nn.Module, tokenizer: Any, lines: Iterable[str] | None = None, *,
                   source: str | None = None, arm: str = "full-o", delta: float = 1e-3,
                   quantile: float = 0.01, max_tokens: int | None = None,
                   token_budget: int = DEFAULT_TOKEN_BUDGET,
                   exclude: Sequence[str] | None = None) -> dict[str, Any]:
    """The calibrated patch spec of ``arm`` for ``model`` over ``lines`` (default:
    :func:`builtin_texts`; any iterable of strings, read lazily, e.g. an open file):
    ``τ_site = δ/(1−δ)·Q_q(‖h‖²)``; each line cut to ``max_tokens`` tokens (see
    :func:`token_cap`), at most ``token_budget`` tokens in all (module docstring). ``source``
    names where the lines came from in the spec (a file; :data:`BUILTIN_TEXTS` without lines,
    :data:`GIVEN_TEXTS` with lines and no source)."""
    if getattr(model.config, "image_size", None) is not None:
        raise ValueError(f"{type(model).__name__} reads images, not text; calibrate it from "
                         "Python with oretrofit.calibrate(model, [{'pixel_values': ...}, ...])")
    if isinstance(lines, str):
        raise ValueError("lines is one string (it would be read character by character); give "
                         "a list of lines, e.g. text.splitlines()")
    if lines is None:
        lines, source = builtin_texts(), source or BUILTIN_TEXTS
    source = source or GIVEN_TEXTS
    cap = token_cap(model, tokenizer, max_tokens)
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < cap:
        raise ValueError(f"token_budget must be an integer of at least the {cap} tokens a line "
                         f"may keep, got {token_budget!r}; e.g. --token-budget "
                         f"{DEFAULT_TOKEN_BUDGET}")
    decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    found = _tokenize(tokenizer, lines, cap, token_budget, 1 + decoder)
    device = next(model.parameters()).device

    def run(host: nn.Module) -> None:
        """Every group as one batch ``(rows, n)``: no padding, no mask (``decoder_input_ids``
        the same ids for an encoder-decoder model)."""
        for group in _groups(found.rows):
            ids = torch.from_numpy(np.stack(group)).to(device)
            host(input_ids=ids, **({"decoder_input_ids": ids} if decoder else {}))

    data = {"texts": source, "texts_sha256": found.texts.hexdigest(), "rows": len(found.rows),
            "tokens": found.tokens, "max_tokens": cap, "token_budget": token_budget,
            "budget_reached": found.cut, "batches": sum(1 for _ in _groups(found.rows)),
            "sha256": found.ids.hexdigest(),
            "tokenizer": type(tokenizer).__name__, "model_class": type(model).__name__}
    spec = calibrate(model, run, delta, quantile, arm=arm, exclude=exclude, data=data)
    if found.cut:
        warnings.warn(budget_note(data), TextBudgetWarning, stacklevel=2)
    return spec
