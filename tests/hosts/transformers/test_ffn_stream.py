"""The MLP branch's gate reads the residual stream its output is added to (``.stream``), checked
at finite τ, where the contracts cannot see which stream it is (as τ → 0 every presence is 1,
and a null token's is 0 in every stream)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from oretrofit import RetrofitError, retrofitted  # noqa: E402
from oretrofit._surgery.patching import SiteConfig  # noqa: E402
from oretrofit._operators.presence import presence  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from oretrofit.hosts.transformers.backbones import layers  # noqa: E402
from oretrofit.hosts.transformers.gates import gate_branch_output  # noqa: E402
from oretrofit.hosts.transformers.stream import gate_traced_branch  # noqa: E402

# architecture -> (MLP branch, the module whose input is the stream its output is added to,
# the module whose input the host read before: the layer for "parallel residual",
# post_attention_layernorm for "pre-norm"; "" = the layer), from each layer's forward, and a τ
# at which the stream's presences sit inside (0, 1) under full-o (they shrink layer by layer)
STREAMS = {
    "DINOv2": ("mlp", "norm2", "", 1.0),                                 # sequential pre-norm
    "Wav2Vec2": ("feed_forward", "feed_forward", "", 2.0),               # post-norm
    "OLMo2": ("mlp", "mlp", "post_attention_layernorm", 1.0),            # norms after branches
    "GPT-J": ("mlp", "", "", 0.3),                                       # parallel residual
}


def _arch(name: str) -> zoo.Architecture:
    return next(a for a in zoo.ARCHITECTURES if a.name == name)


def _inputs_of(module: nn.Module, store: dict, key: str) -> torch.utils.hooks.RemovableHandle:
    def hook(m: nn.Module, args: tuple, kwargs: dict) -> None:
        store[key] = args[0] if args else kwargs["hidden_states"]
    return module.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("name", STREAMS)
def test_the_mlp_gate_is_the_presence_of_the_stream_it_is_added_to(name: str) -> None:
    arch = _arch(name)
    if zoo.expectation(arch) != "covered":                 # GPT-J before its release
        return zoo.assert_refused_in_this_release(arch)
    model = zoo.build(arch)
    branch_path, stream_path, old_path, tau = STREAMS[name]
    _, layer = layers(model)[1]
    branch = layer.get_submodule(branch_path)
    seen: dict[str, Tensor] = {}
    with retrofitted(model, "full-o", tau), torch.no_grad():
        handles = [_inputs_of(branch, seen, "branch"),
                   _inputs_of(layer.get_submodule(stream_path), seen, "stream"),
                   _inputs_of(layer.get_submodule(old_path), seen, "old"),
                   branch.register_forward_hook(lambda m, a, y: seen.update(gated=y))]
        try:
            model(**zoo.example_inputs(model))
            ungated = type(branch).forward(branch, seen["branch"])   # FFN(x), no hooks
        finally:
            for handle in handles:
                handle.remove()
    p = presence(seen["stream"], tau)
    assert 0 < p.min() < 0.9                               # none zero, some clearly below 1
    expected = p.unsqueeze(-1) * ungated
    assert torch.allclose(seen["gated"], expected, rtol=1e-5, atol=1e-6)
    if old_path != stream_path:                            # the layout this replaced was wrong
        before = presence(seen["old"], tau).unsqueeze(-1) * ungated
        assert (seen["gated"] - before).abs().max() > 1e-3 * ungated.abs().max()


class _MixedLayer(nn.Module):
    """Attention reads the layer input as it came (post-norm, so far), but the MLP is added to
    its norm's input (pre-norm): the host's decision and the layer's sums disagree."""

    def __init__(self) -> None:
        super().__init__()
        self.attn, self.norm, self.mlp = nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 4)

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.attn(h)
        return h + self.mlp(self.norm(h))


def test_a_stream_the_layer_does_not_add_to_is_refused_at_the_call() -> None:
    layer = _MixedLayer()
    undo = gate_traced_branch("layer.mlp", layer, layer.attn, layer.mlp, SiteConfig(1.0))
    try:
        for _ in range(2):                              # refused again: nothing was accepted
            with pytest.raises(RetrofitError, match=r"layer\.mlp: it read the stream .* as its own "
                                                    r"input, the output of norm \(post-norm\), "
                                                    r"but the layer adds .* to other tensors"):
                layer(torch.randn(2, 3, 4))
            assert torch._C._len_torch_function_stack() == 0     # the trace has ended
    finally:
        undo()


class _SwitchingLayer(nn.Module):
    """Pre-norm until ``post`` is set, then post-norm: the MLP reads ``norm1``'s output, which
    its output is added to (a layer that is sound either way, but reads its stream differently
    from one call to the next)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn, self.mlp = nn.Linear(4, 4), nn.Linear(4, 4)
        self.norm1, self.norm2 = nn.LayerNorm(4), nn.LayerNorm(4)
        self.post = False

    def forward(self, h: Tensor) -> Tensor:
        if self.post:
            h = self.norm1(h + self.attn(h))
            return self.norm2(h + self.mlp(h))
        h = h + self.attn(self.norm1(h))
        return h + self.mlp(self.norm2(h))


def test_a_confirmed_gate_refuses_a_later_call_that_reads_another_stream() -> None:
    layer, x = _SwitchingLayer(), torch.randn(2, 3, 4)
    undo = gate_traced_branch("layer.mlp", layer, layer.attn, layer.mlp, SiteConfig(1.0))
    try:
        with torch.no_grad():
            confirmed = [layer(x) for _ in range(3)]          # the first traced, the rest not
            layer.post = True
            with pytest.raises(RetrofitError, match=r"layer\.mlp: this call reads the stream as "
                                                    r"its own input, the output of norm1 "
                                                    r"\(post-norm\), its first read it as the "
                                                    r"input of norm2 \(pre-norm\)"):
                layer(x)
            layer.post = False
            assert torch.equal(layer(x), confirmed[0])     # the refused call left nothing behind
    finally:
        undo()


@pytest.mark.parametrize("shape", [(2, 3, 4), (6, 4)])
def test_the_branch_output_is_gated_per_token_flattened_or_not(shape: tuple[int, ...]) -> None:
    column, y = torch.rand(2, 3, 1), torch.randn(shape)            # the gates' (B, N, 1) form
    assert torch.equal(gate_branch_output(column, (y, "router logits"), nn.Identity())[0],
                       (column * y.reshape(2, 3, 4)).reshape(shape))


def test_a_branch_output_of_another_token_count_is_refused() -> None:
    with pytest.raises(RetrofitError, match="Linear returned \\(5, 4\\) for a residual stream of "
                                            "\\(2, 3\\) tokens"):
        gate_branch_output(torch.rand(2, 3, 1), torch.randn(5, 4), nn.Linear(4, 4))
