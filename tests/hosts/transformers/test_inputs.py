"""zero_padded_inputs: token ids checked where they enter, and left padding that keeps every real
token at the position it has alone, whatever the model's position scheme."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from transformers import BloomConfig, BloomModel, GPT2Config, GPT2Model  # noqa: E402

from oretrofit import retrofitted  # noqa: E402
from oretrofit.hosts.transformers.inputs import zero_padded_inputs  # noqa: E402
from oretrofit.hosts.transformers.measures import load_minilm  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def _gpt2() -> GPT2Model:
    torch.manual_seed(0)
    return GPT2Model(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                bos_token_id=0, eos_token_id=0)).eval()


def _padded_against_alone(model, sequences, side):
    """Max |Δ| of every real token's final state, padded batch (no mask, ``full-o``) against its
    sequence alone (the unpatched model, no padding)."""
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in sequences]
        with retrofitted(model, "full-o"):
            out = model(**zero_padded_inputs(model, sequences, side)).last_hidden_state
    width = out.shape[1]
    return max((out[i, :len(s)] if side == "right" else out[i, width - len(s):])
               .sub(a).abs().max().item() for i, (s, a) in enumerate(zip(sequences, alone)))


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_on_either_side_keeps_real_tokens_where_they_are_alone(minilm, side):
    """Learned absolute positions (MiniLM's table, GPT-2's wpe): left padding gave the real
    tokens of a shorter row negative positions, "index -4 is out of bounds"; now they sit at
    0 … n−1 as alone, the padding at position 0, and their states match alone."""
    model, tokenizer = minilm
    texts = ["a long sentence with several words in it", "short"]
    ids = [tokenizer(t)["input_ids"] for t in texts]
    assert _padded_against_alone(model, ids, side) <= 1e-5
    assert _padded_against_alone(_gpt2(), [[5, 6, 7, 8, 9, 10], [11, 12]], side) <= 1e-5
    positions = zero_padded_inputs(model, ids, side)["position_ids"]
    real = [list(range(len(i))) for i in ids]
    width = len(ids[0])
    expected = ([r + list(range(len(r), width)) for r in real] if side == "right"
                else [[0] * (width - len(r)) + r for r in real])
    assert positions.tolist() == expected


class _PositionsByPlace(GPT2Model):
    """GPT-2 whose forward takes no position_ids: its table is read by place in the batch."""

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        return super().forward(input_ids=input_ids, inputs_embeds=inputs_embeds)


def test_a_model_without_position_ids_gets_none_and_left_padding_where_positions_stay():
    """BLOOM (ALiBi) takes no position_ids: passing them was an error at the call. Its positions
    are relative, so padding on either side keeps the real tokens' states; a learned table read
    by place in the batch would move them under left padding, which is refused there."""
    torch.manual_seed(0)
    model = BloomModel(BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4)).eval()
    rows = [[5, 6, 7, 8, 9], [10, 11]]
    assert set(zero_padded_inputs(model, rows)) == {"inputs_embeds"}
    assert _padded_against_alone(model, rows, "right") <= 1e-5
    assert _padded_against_alone(model, rows, "left") <= 1e-5
    by_place = _PositionsByPlace(_gpt2().config).eval()
    assert set(zero_padded_inputs(by_place, rows)) == {"inputs_embeds"}
    with pytest.raises(ValueError, match="_PositionsByPlace looks positions up in a learned "
                                         "table but its forward takes no position_ids.*use "
                                         "side='right'"):
        zero_padded_inputs(by_place, rows, side="left")
    assert set(zero_padded_inputs(by_place, [[5, 6], [7, 8]], side="left")) == {"inputs_embeds"}


@pytest.mark.parametrize("sequences,message", [
    ([[1.0, 2.5]], r"sequence 0 holds torch.float32 values, not integer token ids \(a float id "
                   r"would be cut to an integer\); give integers, e.g. ids.long\(\)"),
    (torch.tensor([[101.0, 102.0]]), r"sequence 0 holds torch.float32 values"),
    ([[101, 102], [101, 30522]], r"sequence 1 holds token id 30522, outside the 30522 ids "
                                 r"BertModel embeds \(\[0, 30522\)\); use ids of the model's "
                                 r"own tokenizer"),
    ([[101, -1]], r"sequence 0 holds token id -1, outside the 30522 ids"),
    ("some text", r"sequences holds text, not token ids; tokenize it with BertModel's tokenizer"),
    (["some text"], r"sequences holds text"),
    ([["some", "words"]], r"sequence 0 is not a sequence of integer token ids .*tokenize text "
                          r"with BertModel's tokenizer"),
    ([torch.tensor([[101, 102]])], r"sequence 0 has shape \(1, 2\), not 1-D; .*ids\[0\] for a "
                                   r"row"),
    (torch.tensor([101, 102]), r"sequences is a 1-D tensor; give a list of 1-D token id "
                               r"sequences"),
    ([101, 102], r"sequences is one flat list of token ids; give a list of sequences: \[ids\]"),
    ([[True, False]], r"sequence 0 holds booleans, not token ids"),
    ([[101], []], r"sequence 1 is empty"),
    ([], r"sequences must be a non-empty list"),
    (7, r"sequences must be a list of token id sequences, got int"),
])
def test_bad_token_ids_are_refused_naming_the_fix(minilm, sequences, message):
    with pytest.raises(ValueError, match=message):
        zero_padded_inputs(minilm[0], sequences)


def test_integer_ids_of_any_container_are_taken(minilm):
    model = minilm[0]
    rows = [[101, 7592, 102], [101, 102]]
    expected = zero_padded_inputs(model, rows)
    for given in ([np.array(r, dtype=np.int32) for r in rows], [tuple(r) for r in rows],
                  [torch.tensor(r, dtype=torch.int32) for r in rows]):
        got = zero_padded_inputs(model, given)
        assert all(torch.equal(got[k], expected[k]) for k in expected)
    batch = torch.tensor([[101, 7592, 102], [101, 2088, 102]])
    assert zero_padded_inputs(model, batch)["inputs_embeds"].shape == (2, 3, 384)
