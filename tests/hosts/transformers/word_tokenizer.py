"""A word-level tokenizer for the tiny models (vocabulary 99): the built-in calibration text's
first words (ids 4…), every other word [UNK]."""

from __future__ import annotations

from typing import Any


def word_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` splitting on whitespace; ``[PAD]`` is id 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from oretrofit.hosts.transformers.calibrate import builtin_texts
    words = sorted({w for line in builtin_texts() for w in line.split()})[:90]
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3,
             **{w: i + 4 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                                   pad_token="[PAD]")
