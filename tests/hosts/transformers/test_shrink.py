"""A config shrunk to a tiny model (oretrofit/hosts/transformers/shrink.py), as the census and
the self-check build them."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (AutoConfig, FalconConfig, FalconModel, LlamaConfig,  # noqa: E402
                          LlamaModel)

from oretrofit.hosts.transformers import shrink  # noqa: E402

TINY = shrink.GROUPS["tiny"]


def test_the_shrink_keeps_the_defaults_relations() -> None:
    """Sapiens2's per-layer key-value heads follow the shrunk heads (all heads or the shrunk
    group count), ViT's derived ``pooler_output_size`` and SAM3's ``fpn_hidden_size`` follow the
    shrunk width they equal by default."""
    sapiens = shrink.shrunk_fields(AutoConfig.for_model("sapiens2"), TINY)
    assert sapiens["num_key_value_heads_per_layer"] == [4, 2]
    dual = shrink.shrunk_fields(AutoConfig.for_model("vision-text-dual-encoder"), TINY)
    assert dual["vision_config"]["pooler_output_size"] == 32
    sam3 = shrink.shrunk_fields(AutoConfig.for_model("sam3_lite_text"), TINY)
    assert sam3["vision_config"]["fpn_hidden_size"] == 32


def test_a_users_config_shrinks_to_a_tiny_model_of_its_class_and_stays_as_it_was() -> None:
    config = LlamaConfig(num_key_value_heads=8, rope_theta=5e5, vocab_size=1000)
    before = config.to_dict()
    tiny = shrink.shrunk_config(config, TINY)
    assert config.to_dict() == before
    assert (tiny.hidden_size, tiny.num_attention_heads, tiny.num_key_value_heads, tiny.head_dim,
            tiny.intermediate_size, tiny.num_hidden_layers) == (32, 4, 2, 8, 64, 2)
    assert (tiny.vocab_size, tiny.rope_parameters) == (1000, config.rope_parameters)
    model = shrink.tiny_model(LlamaModel, tiny, attn_implementation="eager")
    assert model.config._attn_implementation == "eager" and not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.norm.weight.ne(1).all()                    # jittered: norm affines not 1


def test_a_derived_field_is_not_set_and_a_large_model_is_refused() -> None:
    tiny = shrink.shrunk_config(FalconConfig(), TINY)       # head_dim is a property of the rest
    assert "head_dim" not in shrink.shrunk_fields(FalconConfig(), TINY)
    assert (tiny.hidden_size, tiny.num_attention_heads, tiny.head_dim) == (32, 4, 8)
    with pytest.raises(ValueError, match=r"^\d+ M parameters \(more than the cap of 30 M"):
        shrink.tiny_model(FalconModel, FalconConfig())
