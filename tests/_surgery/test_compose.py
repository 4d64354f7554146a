"""Hosts compose: a transformers BERT backbone inside a wrapper whose attention-pool head is an
``nn.MultiheadAttention`` (the BERT host takes the backbone, the torch.nn fallback the head)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

from oretrofit import RetrofitError, retrofit, retrofitted  # noqa: E402

D = 32


class PooledBert(nn.Module):
    """BERT backbone; the CLS state attends over all states through an attention-pool head."""

    def __init__(self) -> None:
        super().__init__()
        config = BertConfig(vocab_size=120, hidden_size=D, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=64)
        self.backbone = BertModel(config)
        self.pool = nn.MultiheadAttention(D, 4, batch_first=True)
        with torch.no_grad():                         # non-zero biases and norm affines
            for p in self.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        self.eval()

    def forward(self, **inputs: Tensor) -> Tensor:
        h = self.backbone(**inputs).last_hidden_state                  # (B, N, D)
        return self.pool(h[:, :1], h, h, need_weights=False)[0][:, 0]  # (B, D)


def test_backbone_goes_to_bert_and_the_pool_head_to_torch_nn() -> None:
    model = PooledBert()
    with retrofitted(model, "full-o", 1e-8) as r:
        spec = r.spec()
        sites = {row["site"]: row["kind"] for row in r.report()}
    assert spec["host"] == "transformers"
    assert spec["hosts"] == ["transformers", "torch.nn"]
    assert set(spec["host_versions"]) == {"transformers", "torch"}
    assert spec["uncovered"] == []
    assert sites["pool"] == "attention"
    assert sites["backbone.encoder.layer.1.attention.self"] == "attention"
    assert "backbone.embeddings.LayerNorm" in sites            # by BERT, not twice by torch.nn
    # two position/token-type tables, the embedding norm, 4 per layer, the pool head
    assert len(sites) == 3 + 2 * 4 + 1


def test_composed_model_contracts() -> None:
    torch.manual_seed(0)
    model = PooledBert()
    ids = torch.randint(1, 120, (1, 6))
    at, n = 3, ids.shape[1]
    with torch.no_grad():
        reference = model(input_ids=ids)
        embeds = model.backbone.get_input_embeddings()(ids)
        inserted = torch.cat([embeds[:, :at], torch.zeros(1, 1, D), embeds[:, at:]], dim=1)
        positions = torch.cat([torch.arange(at), torch.tensor([at - 1]), torch.arange(at, n)])
        nulled = dict(inputs_embeds=inserted, position_ids=positions[None],
                      attention_mask=torch.ones(1, n + 1, dtype=torch.long))
        moved = (model(**nulled) - model(inputs_embeds=embeds)).abs().max()
        with retrofitted(model, "full-o", 1e-12, eps=1e-12):
            agree = model(input_ids=ids)
        with retrofitted(model, "full-o", 1e-6):
            drift = (model(**nulled) - model(inputs_embeds=embeds)).abs().max()
        after = model(input_ids=ids)
    assert (agree - reference).abs().max() <= 1e-4 * reference.abs().max()
    assert drift <= 1e-4
    assert moved > 1e-3                 # unpatched, the pool head attends to the null token
    assert torch.equal(after, reference)


def test_uncovered_union_names_each_host() -> None:
    model = PooledBert()
    model.head = nn.Linear(D, 2)                        # a read-out head no host has a site for
    with pytest.raises(RetrofitError, match=r"head \(Linear\) \[host torch\.nn\]"):
        retrofit(model, "full-o")
    with retrofitted(model, "oa", 1e-8, allow_partial=True) as r:
        assert r.spec()["uncovered"] == ["head (Linear)"]
        assert r.spec()["hosts"] == ["transformers", "torch.nn"]
