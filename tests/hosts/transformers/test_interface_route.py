"""The ``oretrofit`` attention function's causality (hosts/transformers/interface_route.py): a
causal call without a mask reaches OAttention as its ``causal`` flag, never as an (Nq, Nk)
triangle built per layer; a padded call keeps the model's own mask."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaModel  # noqa: E402

from oretrofit import retrofitted  # noqa: E402
from oretrofit.hosts.transformers import interface_route  # noqa: E402


def test_a_causal_call_without_a_mask_passes_the_flag(monkeypatch) -> None:
    model = LlamaModel(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attn_implementation="sdpa")).eval()
    calls = []

    def recording(*args, **kwargs):
        calls.append((kwargs["mask"], kwargs["causal"]))
        return real(*args, **kwargs)

    real = interface_route.o_attention
    monkeypatch.setattr(interface_route, "o_attention", recording)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0))
    padding = torch.ones(2, 6, dtype=torch.long)
    padding[1, :2] = 0
    with torch.no_grad(), retrofitted(model, "full-o", 1e-6):
        flagged = model(input_ids=ids).last_hidden_state
        assert calls and all(mask is None and causal for mask, causal in calls)
        calls.clear()
        model(input_ids=ids, attention_mask=padding)
        assert calls and all(mask is not None and not causal for mask, causal in calls)

        def triangle(*args, **kwargs):                             # the mask built per layer
            if kwargs.pop("causal"):
                kwargs["mask"] = torch.ones(6, 6, dtype=torch.bool).tril()
            return real(*args, **kwargs)

        monkeypatch.setattr(interface_route, "o_attention", triangle)
        built = model(input_ids=ids).last_hidden_state
    assert torch.equal(flagged, built)
