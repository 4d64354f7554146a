"""transformers BERT host: tiny random configs for breadth, all-MiniLM-L6-v2 for the real claims."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

from oretrofit import retrofitted  # noqa: E402
from oretrofit.hosts.transformers.layouts import calls_attention_interface  # noqa: E402
from oretrofit.hosts.transformers.measures import (EPS, SENTENCES, TAU, embedding_cosines,  # noqa: E402
                                    hidden_readout, load_minilm, null_insertion, padding_deltas)



def _tiny_bert(**overrides: object) -> BertModel:
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, **overrides)
    return BertModel(config).eval()


@pytest.fixture(scope="module")
def minilm() -> tuple[torch.nn.Module, object]:
    return load_minilm()


def test_sites_cover_inject_norms_attention_and_ffn() -> None:
    model = _tiny_bert()
    keys = list(model.state_dict())
    # the attention interface from transformers 5.0; 4.x's BertSdpaSelfAttention calls SDPA itself
    # (the fused-kernel route), and the config keeps its implementation
    interface = calls_attention_interface(model.encoder.layer[0].attention.self)
    with retrofitted(model, "full-o", TAU) as r:
        kinds = [(row["site"], row["kind"]) for row in r.report()]
        assert list(model.state_dict()) == keys
        assert model.config._attn_implementation == ("oretrofit" if interface else "sdpa")
    assert model.config._attn_implementation == "sdpa"
    assert kinds[:7] == [("embeddings.position_embeddings", "inject"),
                         ("embeddings.token_type_embeddings", "inject"),
                         ("embeddings.LayerNorm", "norm"),
                         ("encoder.layer.0.attention.self", "attention"),
                         ("encoder.layer.0.attention.output.LayerNorm", "norm"),
                         ("encoder.layer.0.output.dense", "ffn"),
                         ("encoder.layer.0.output.LayerNorm", "norm")]
    assert len(kinds) == 3 + 2 * 4


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_padding_mask_honoured_and_revert_exact(arm: str) -> None:
    model = _tiny_bert()
    ids = torch.randint(0, 120, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).last_hidden_state
        with retrofitted(model, arm, TAU):
            out = model(ids, attention_mask=mask).last_hidden_state
        assert torch.equal(model(ids, attention_mask=mask).last_hidden_state, reference)
    real = mask.bool()
    torch.testing.assert_close(out[real], reference[real], atol=1e-5, rtol=1e-5)


def test_null_insertion_and_mask_free_padding_tiny() -> None:
    model = _tiny_bert()
    ids = torch.randint(1, 120, (1, 6))
    with retrofitted(model, "full-o", TAU):
        for at in (6, 3):
            result = null_insertion(model, ids, at)
            assert result["inserted_max_abs"] == 0
            assert result["old_max_delta"] < 1e-5
        deltas = padding_deltas(model, [[5, 6, 7, 8, 9], [10, 11]], "right", hidden_readout)
    assert max(deltas) < 1e-5


def test_cross_attention_takes_source_presences_from_the_encoder_output() -> None:
    model = _tiny_bert(is_decoder=True, add_cross_attention=True)
    ids, memory = torch.randint(1, 120, (1, 5)), torch.randn(1, 6, 32)
    inserted = torch.cat([memory[:, :3], torch.zeros(1, 2, 32), memory[:, 3:]], dim=1)
    with torch.no_grad():
        reference = model(ids, encoder_hidden_states=memory).last_hidden_state
        with retrofitted(model, "full-o", TAU, eps=1e-12) as r:
            assert r.spec()["uncovered"] == []
            assert "encoder.layer.0.crossattention.self" in r.spec()["sites"]
            out = model(ids, encoder_hidden_states=memory).last_hidden_state
            null_sources = model(ids, encoder_hidden_states=inserted).last_hidden_state
        unpatched_null = model(ids, encoder_hidden_states=inserted).last_hidden_state
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    assert (null_sources - out).abs().max() < 1e-5             # null encoder tokens are excluded
    assert (unpatched_null - reference).abs().max() > 1e-3


def test_minilm_tau_to_zero_cosines(minilm: tuple) -> None:
    model, tokenizer = minilm
    for arm in ("oa", "full-o"):
        cosines = embedding_cosines(model, tokenizer, SENTENCES, arm)       # the defaults
        assert len(cosines) == 32 and cosines.min() >= 0.999999


def test_minilm_null_insertion_exact_under_full_o(minilm: tuple) -> None:
    model, tokenizer = minilm
    ids = tokenizer(SENTENCES[8], return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    unpatched = [null_insertion(model, ids, at) for at in (n, n // 2)]
    with retrofitted(model, "full-o", TAU, eps=EPS):
        patched = [null_insertion(model, ids, at) for at in (n, n // 2)]
    for result in patched:
        assert result["inserted_max_abs"] == 0
        assert result["old_max_delta"] < 1e-4
    assert min(r["old_max_delta"] for r in unpatched) > 1e-2


def test_minilm_mask_free_padding(minilm: tuple) -> None:
    model, tokenizer = minilm
    ids = [tokenizer(s)["input_ids"] for s in SENTENCES[:6]]
    with retrofitted(model, "full-o", TAU, eps=EPS):
        assert max(padding_deltas(model, ids, "right", hidden_readout)) < 1e-4
    assert max(padding_deltas(model, ids, "right", hidden_readout)) > 1e-2
