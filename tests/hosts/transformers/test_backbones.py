"""A PreTrainedModel holding plain torch.nn attention next to a transformers encoder (TabSTAR's
structure: a BERT text encoder feeding an ``nn.TransformerEncoder``) retrofits in one plan: the
transformers host for the BERT part, the torch.nn host for the rest."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel, PreTrainedModel

import oretrofit
from oretrofit import RetrofitError
from oretrofit.hosts.transformers.backbones import pretrained_models


class _Config(BertConfig):
    model_type = "tabstar_look_alike"


class _TabStarLike(PreTrainedModel):
    config_class = _Config

    def __init__(self, config: _Config, head: bool = False) -> None:
        super().__init__(config)
        self.text_encoder = BertModel(config)
        layer = nn.TransformerEncoderLayer(config.hidden_size, 2, 32, dropout=0.0,
                                           batch_first=True)
        self.tabular_encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16),
                                                     enable_nested_tensor=False)
        self.head = nn.Linear(config.hidden_size, 1) if head else None
        self.post_init()

    def forward(self, input_ids=None, inputs_embeds=None):
        h = self.text_encoder(input_ids=input_ids, inputs_embeds=inputs_embeds).last_hidden_state
        h = self.tabular_encoder(h)
        return h if self.head is None else self.head(h)


def _model(head: bool = False) -> _TabStarLike:
    torch.manual_seed(0)
    config = _Config(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return _TabStarLike(config, head).eval()


def test_the_transformers_parts_are_the_transformers_hosts():
    assert [path for path, _ in pretrained_models(_model())] == ["text_encoder"]


def test_one_plan_over_both_hosts_keeps_the_host_at_tau_to_zero_and_reverts_exactly():
    model = _model()
    ids = torch.randint(1, 50, (2, 7))
    with torch.no_grad():
        reference = model(ids)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    fit = oretrofit.retrofit(model, "full-o", tau=1e-8)
    assert fit.plan.hosts == ["transformers", "torch.nn"]
    sites = [site.name for site, _ in fit.plan.entries]
    assert any(s.startswith("text_encoder.") for s in sites)
    assert any(s.startswith("tabular_encoder.layers.1.self_attn") for s in sites)
    with torch.no_grad():
        assert (model(ids) - reference).abs().max().item() < 1e-5
        embeds = torch.randn(2, 7, 16)
        embeds[1, 4:] = 0.0                          # zero tokens: exactly zero at the output
        out = model(inputs_embeds=embeds)
    assert torch.equal(out[1, 4:], torch.zeros_like(out[1, 4:]))
    assert out[1, :4].abs().max().item() > 0
    fit.revert()
    assert type(model.tabular_encoder.layers[0]) is nn.TransformerEncoderLayer
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key
    with torch.no_grad():
        assert torch.equal(model(ids), reference)


def test_a_head_in_the_composites_own_code_is_named_not_passed():
    with pytest.raises(RetrofitError, match=r"head \(Linear\) \[host torch.nn\]"):
        oretrofit.retrofit(_model(head=True), "full-o", tau=1e-8)
