"""The hooks' per-call cost on a retrofitted transformers model: under ``full-o`` each carrier's
presence is computed once per forward, shared by the hooks that read it (the norm in front of the
attention and the attention's capture; the norm in front of the MLP and the FFN gate), and the
shared presence leaves the outputs as they were."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from oretrofit import retrofitted  # noqa: E402
from oretrofit._operators import presence_memo  # noqa: E402

LAYERS = 3
TAU = 1e-2          # large enough that ρτ differs from 1, so a stale or misplaced one would show


def _tiny() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[torch.Size]:
    computed: list[torch.Size] = []
    original = presence_memo.presence

    def counting(h: torch.Tensor, tau: float, keepdim: bool = False) -> torch.Tensor:
        computed.append(h.shape)
        return original(h, tau, keepdim)

    monkeypatch.setattr(presence_memo, "presence", counting)
    return computed


def test_full_o_computes_each_carriers_presence_once_per_forward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = _tiny(), torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), retrofitted(model, "full-o", TAU):
        model(ids)                                   # the first call traces the FFN stream
        computed = _counted(monkeypatch)
        model(ids)
    # per layer: the layer input and the stream before the MLP; then the final norm's input
    assert len(computed) == 2 * LAYERS + 1


def test_shared_presences_leave_generation_and_logits_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = _tiny(), torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), retrofitted(model, "full-o", TAU):
        shared = model(ids).logits
        tokens = model.generate(ids, max_new_tokens=4, do_sample=False)
        monkeypatch.setattr(presence_memo, "_memoizable", lambda h: False)
        assert torch.equal(model(ids).logits, shared)
        assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False), tokens)
