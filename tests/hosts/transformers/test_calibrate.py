"""calibrate_text: τ per site from lines of text, in batches of one length, read up to a budget."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

pytest.importorskip("transformers")

from oretrofit import calibrate  # noqa: E402
from oretrofit.hosts.transformers.calibrate import (BATCH_TOKENS, TextBudgetWarning,  # noqa: E402
                                                    builtin_texts, calibrate_text, line_chars)
from oretrofit.hosts.transformers.measures import load_minilm  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def _lines() -> list[str]:
    """The built-in lines and 140 more of mixed lengths (pairs and triples of them joined)."""
    base = builtin_texts()
    pairs = [f"{a} {b}" for a, b in itertools.permutations(base[:10], 2)]
    triples = [" ".join(t) for t in itertools.islice(itertools.permutations(base[10:20], 3), 50)]
    return [*base, *pairs, *triples]


def test_batches_of_one_length_give_the_spec_of_one_line_at_a_time(minilm):
    """Run alone, a line's tokens are all real; batched with lines of its own length they are
    too (no padding, no mask), and each site's record, τ and the digest of the token tensors
    equal those of the lines run one at a time, while the forwards drop from one per line (and
    per site) to one per length."""
    model, tokenizer = minilm
    lines, forwards = _lines(), []
    spec = calibrate_text(model, tokenizer, lines, max_tokens=48)
    alone = [{"input_ids": torch.tensor([tokenizer(line, truncation=True, max_length=48)
                                         ["input_ids"]])} for line in lines]
    hook = model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        reference = calibrate(model, alone)
    finally:
        hook.remove()
    assert spec["site_tau"] == reference["site_tau"]
    assert spec["calibration"]["sites"] == reference["calibration"]["sites"]
    data = spec["calibration"]["data"]
    assert data["sha256"] == reference["calibration"]["data"]["sha256"]
    assert (data["rows"], data["tokens"]) == (len(lines), sum(b["input_ids"].numel() for b in alone))
    lengths = {b["input_ids"].numel() for b in alone}
    assert len(forwards) == len(lines) and data["batches"] == len(lengths) < len(lines) / 4
    assert data["budget_reached"] is False


def test_the_text_is_read_up_to_the_token_budget(minilm):
    """An endless text is calibrated on its first lines up to the budget, and what follows is
    never read; the warning says so and names the option that raises the budget."""
    model, tokenizer = minilm
    read = []

    def endless():
        for line in itertools.cycle(builtin_texts()):
            read.append(line)
            yield line

    with pytest.warns(TextBudgetWarning, match=r"read up to the token budget of 300 tokens: τ "
                                               r"is calibrated on its first \d+ non-blank lines "
                                               r"\(\d+ tokens\).*--token-budget"):
        spec = calibrate_text(model, tokenizer, endless(), token_budget=300)
    data = spec["calibration"]["data"]
    assert data["budget_reached"] is True and 300 - 128 < data["tokens"] <= 300
    assert len(read) == data["rows"] + 1          # the line that would pass the budget, no more


def test_a_long_line_is_cut_before_it_is_tokenized(minilm):
    """A 2-million-character line reaches the tokenizer as its first 100 characters a kept
    token, and keeps the same tokens as the whole line tokenized and truncated."""
    model, tokenizer = minilm
    line = "the cat sat on the mat and looked at the dog " * 45_000
    seen = []

    def recording(text, **kwargs):
        seen.append(len(text))
        return tokenizer(text, **kwargs)

    recording.model_max_length = tokenizer.model_max_length
    spec = calibrate_text(model, recording, [line], max_tokens=16)
    whole = calibrate_text(model, tokenizer, [line[:100_000]], max_tokens=16)
    assert seen == [line_chars(16)] == [1600]
    data, expected = spec["calibration"]["data"], whole["calibration"]["data"]
    assert data["tokens"] == 16 and data["sha256"] == expected["sha256"]


def test_a_long_text_runs_in_batches_within_the_batch_size(minilm):
    model, tokenizer = minilm
    widths = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape), with_kwargs=True)
    try:
        spec = calibrate_text(model, tokenizer, ["a b c d e f"] * 1500 + ["a b"] * 3)
    finally:
        hook.remove()
    rows = BATCH_TOKENS // 8                        # 6 words + [CLS] + [SEP]
    assert widths == [(3, 4), *[(rows, 8)] * (1500 // rows), (1500 % rows, 8)]
    assert spec["calibration"]["data"]["batches"] == math.ceil(1500 / rows) + 1


@pytest.mark.parametrize("lines,budget,message", [
    ("one line", 1000, "lines is one string"),
    ([b"bytes"], 1000, "calibration lines must be strings, got bytes"),
    (["ok"], 10, "token_budget must be an integer of at least the 128 tokens a line may keep, "
                 "got 10"),
    (["ok"], True, "token_budget must be an integer"),
    (["  ", "\t"], 1000, "no non-blank line"),
])
def test_bad_text_or_budget_is_refused_naming_the_fix(minilm, lines, budget, message):
    model, tokenizer = minilm
    with pytest.raises(ValueError, match=message):
        calibrate_text(model, tokenizer, lines, token_budget=budget)
