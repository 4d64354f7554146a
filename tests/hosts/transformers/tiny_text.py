"""Text for the tiny models (vocabulary 99): a word-level tokenizer (the built-in calibration
text's first words as ids 4…, every other word [UNK]) and a tiny causal LM."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


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


def tiny_causal_lm() -> nn.Module:
    """A jittered 2-layer ``LlamaForCausalLM`` (width 32, 4 heads) in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from oretrofit.hosts.transformers.shrink import jitter
    torch.manual_seed(0)
    return jitter(LlamaForCausalLM(LlamaConfig(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)).eval(), 0)
