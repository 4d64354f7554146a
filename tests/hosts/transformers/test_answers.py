"""A model's answers against the unpatched model's (oretrofit/hosts/transformers/answers.py):
which kind a model gives, prompts checked, and each site measured on its own input."""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from torch import nn  # noqa: E402

from oretrofit import retrofit  # noqa: E402
from oretrofit.hosts.transformers.answers import (answer_kind, reference_answers,  # noqa: E402
                                                  site_deviations)
from oretrofit.hosts.transformers.check import Setting  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from hosts.transformers.tiny_text import tiny_causal_lm, word_tokenizer  # noqa: E402

PROMPTS = ["The cat sits outside.", "A man is playing a guitar on the street."]


def test_a_model_with_an_lm_head_generates_and_a_backbone_embeds() -> None:
    assert answer_kind(tiny_causal_lm()) == "generate"
    assert answer_kind(tiny_causal_lm().model) == "embed"
    bert = next(a for a in zoo.ARCHITECTURES if a.model_type == "bert")
    assert answer_kind(zoo.build(bert)) == "embed"


def test_one_string_of_prompts_is_refused_not_read_letter_by_letter() -> None:
    with pytest.raises(ValueError, match=r"prompts is one string \(it would be read character "
                                         r"by character\); give a list of prompts: \['a cat'\]"):
        reference_answers(tiny_causal_lm(), word_tokenizer(), "a cat")


@pytest.mark.parametrize("prompts", [[], ["a cat", "  "], ["a cat", 3]])
def test_prompts_must_be_non_empty_strings(prompts: list) -> None:
    with pytest.raises(ValueError, match="prompts must be non-empty strings"):
        reference_answers(tiny_causal_lm(), word_tokenizer(), prompts)


def test_each_site_is_measured_on_the_unpatched_input_to_it():
    """With every attention site silenced at once, each site's deviation is the one it has
    patched alone: the upstream sites' changes do not reach it."""
    model, tokenizer = tiny_causal_lm(), word_tokenizer()
    ids = tokenizer(PROMPTS[1], return_tensors="pt")["input_ids"]
    call = lambda: model(input_ids=ids)                                        # noqa: E731

    together = site_deviations(model, lambda: Setting("oa", 1e-8, 1e3).patched(model), call,
                               top=10)
    deviations = [row["deviation"] for row in together]
    assert len(together) == 2 and deviations == sorted(deviations, reverse=True)
    assert min(deviations) > 1e-2
    for row in together:
        alone = site_deviations(model, lambda: _alone(model, row["site"]), call)
        assert alone[0]["site"] == row["site"]
        assert alone[0]["deviation"] == pytest.approx(row["deviation"], rel=1e-4)


@contextlib.contextmanager
def _alone(model: nn.Module, site: str) -> Iterator[Any]:
    """``model`` with only ``site`` patched (``oa``, ε = 1e3); reverted on exit."""
    applied = retrofit(model, "oa", 1e-8, 1e3, targets=[f"re:{re.escape(site)}"])
    try:
        yield applied
    finally:
        applied.revert()
