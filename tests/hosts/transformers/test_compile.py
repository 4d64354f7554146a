"""A retrofitted transformers model under ``torch.compile`` compiles each shape once, as the
unpatched model does: the graphs its calls compile (generation twice over, plain forwards with a
cache the forward creates or a lazily grown one) are as many as the unpatched model's,
none break, the first call may be compiled (the kernel check runs outside tracing), and the
tokens are the unpatched ones at τ→0."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Callable  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from transformers import (BertConfig, BertModel, DynamicCache, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM)

from oretrofit import retrofitted  # noqa: E402
from oretrofit._kernels import routes  # noqa: E402

DEEP = 9            # above Dynamo's recompile limit (8): a per-layer recompile would hit it
IDS = torch.tensor([[5, 6, 7, 8]])


def _tiny(layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()


def _tiny_bert() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64)).eval()


def _compiled_calls(call: Callable[[], torch.Tensor], times: int) -> tuple[list[int], int,
                                                                          torch.Tensor]:
    """``(graphs compiled after each call, graph breaks, last output)``, from a fresh Dynamo."""
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for _ in range(times):
        out = call()
        graphs.append(counters["stats"]["unique_graphs"])
    return graphs, sum(counters["graph_break"].values()), out


def _generate(model: LlamaForCausalLM) -> Callable[[], torch.Tensor]:
    return lambda: model.generate(IDS, max_new_tokens=3, do_sample=False)


@pytest.mark.parametrize("arm", ["full-o", "oa"])
def test_generating_twice_compiles_the_graphs_of_the_unpatched_model(
        arm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny(DEEP)
    monkeypatch.setattr(routes, "_CHECKED", {})       # the first compiled call would check
    with torch.no_grad():
        model.forward = torch.compile(model.forward, backend="eager")
        try:
            unpatched = _compiled_calls(_generate(model), 2)
            with retrofitted(model, arm, 1e-8):
                patched = _compiled_calls(_generate(model), 2)
        finally:
            del model.forward
            torch._dynamo.reset()
    assert unpatched[1] == 0 and unpatched[0][0] == unpatched[0][1]
    assert patched[:2] == unpatched[:2]
    assert torch.equal(patched[2], unpatched[2])


def test_compiled_forwards_compile_the_graphs_of_the_unpatched_model() -> None:
    """The cache the forward creates (its layers get their presence layers inside the traced
    call) and a lazily grown cache passed in."""
    model = _tiny(2)
    compiled = torch.compile(model, backend="eager")
    calls = {"cache the forward creates": lambda: compiled(IDS).logits,
             "lazily grown cache": lambda: compiled(IDS, cache=DynamicCache()).logits}
    with torch.no_grad():
        try:
            for name, call in calls.items():
                unpatched = _compiled_calls(call, 2)
                with retrofitted(model, "full-o", 1e-8):
                    patched = _compiled_calls(call, 2)
                assert patched[:2] == unpatched[:2], name
                torch.testing.assert_close(patched[2], unpatched[2], rtol=0, atol=1e-5)
        finally:
            torch._dynamo.reset()


@pytest.mark.parametrize("make", [_tiny_bert, lambda: _tiny(2)], ids=["bert", "llama"])
def test_forwards_with_grad_compile_the_graphs_of_the_unpatched_model(make) -> None:
    """Called with grad on (a server that never enters ``no_grad``) at three lengths: OAttention's
    autograd Function traces whole, its source presences the receivers' own (BERT) included, and
    the lengths share one dynamic graph. A graph break in it would compile each frame around it
    on its own, past the recompile limit, and run the rest uncompiled."""
    model = make()
    compiled = torch.compile(model, backend="eager")
    lengths = [torch.arange(1, n + 1)[None] for n in (4, 6, 8)]

    def calls() -> Callable[[], torch.Tensor]:
        ids = iter(lengths)
        return lambda: compiled(input_ids=next(ids))[0]

    try:
        unpatched = _compiled_calls(calls(), 3)
        with retrofitted(model, "full-o", 1e-8):
            patched = _compiled_calls(calls(), 3)
    finally:
        torch._dynamo.reset()
    assert unpatched[1] == 0 and patched[:2] == unpatched[:2]
    assert patched[2].requires_grad
    torch.testing.assert_close(patched[2], unpatched[2], rtol=0, atol=1e-5)


def test_the_attention_implementation_lookup_traces_without_a_graph_break() -> None:
    from oretrofit.hosts.transformers.interface_route import _original_implementation
    model = _tiny(2)
    with retrofitted(model, "full-o", 1e-2):
        model.set_attn_implementation("eager")
        traced = torch.compile(_original_implementation, fullgraph=True, backend="eager")
        assert traced(model.config) == "eager"
    assert traced(model.config) == "sdpa"


# full-o's FFN stream gate: the first retrofit's graphs guard on its always-called exit hook
@pytest.mark.parametrize(("arm", "first_graphs"), [("full-o", 2), ("oa", 1)])
def test_retrofitting_again_compiles_one_set_of_graphs_after_the_first(
        arm: str, first_graphs: int) -> None:
    """A model retrofitted, reverted and retrofitted again (``retrofitted`` used per request)
    reuses the graphs of the retrofit before: the FFN stream gate a retrofit installs is the
    layer's gate of the last retrofit, and once it has confirmed its decision its exit hook is a
    plain one, whose id no graph guards (an always-called hook's id is guarded)."""
    model = _tiny(2)
    compiled = torch.compile(model, backend="eager")
    graphs, outputs = [], []
    with torch.no_grad():
        try:
            torch._dynamo.reset()
            counters.clear()
            for _ in range(4):
                with retrofitted(model, arm, 1e-8):
                    outputs.append(compiled(IDS).logits)
                graphs.append(counters["stats"]["unique_graphs"])
        finally:
            torch._dynamo.reset()
    assert graphs == [1] + [first_graphs] * 3
    assert all(torch.equal(out, outputs[0]) for out in outputs)
