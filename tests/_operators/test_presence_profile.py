"""Presence observation: every presence computed inside the block reaches the observer; the
profile's histogram gives counts, mean, the fraction below ½ and quantiles to 1/BINS."""

import pytest
import torch

from oretrofit import (HiddenCarrierOAttention, PresenceProfile, observe_presence, presence,
                       presence_by_module)


def test_observers_see_every_presence_inside_the_block_only():
    seen: list[torch.Tensor] = []
    h = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    presence(h, 1.0)                                   # outside: not observed
    with observe_presence(seen.append):
        with observe_presence(seen.append):           # nested observers both see it
            p = presence(h, 1.0)
        presence(h, 2.0)
    assert len(seen) == 3 and torch.equal(seen[0], p) and torch.equal(seen[1], p)
    assert torch.equal(seen[2], presence(h, 2.0)) and not seen[0].requires_grad
    assert torch.allclose(p, torch.tensor([0.0, 0.5, 25 / 26]))


def test_profile_counts_mean_below_half_and_quantiles():
    profile = PresenceProfile()
    values = torch.linspace(0.0005, 0.9995, 1000)       # one value in each bin
    profile(values[:400])
    profile(values[400:].reshape(20, 30))
    profile(torch.tensor([float("nan")]))
    summary = profile.summary()
    assert summary["count"] == 1000 and summary["nonfinite"] == 1
    assert summary["mean"] == pytest.approx(values.double().mean().item(), abs=1e-12)
    assert summary["below_half"] == pytest.approx(0.5, abs=1e-12)
    assert summary["quantiles"]["0.5"] == pytest.approx(0.5, abs=1e-9)
    assert summary["quantiles"]["0.1"] == pytest.approx(0.1, abs=1e-9)
    assert summary["quantiles"]["0.99"] == pytest.approx(0.99, abs=1e-9)


def test_profile_of_a_module_run_and_an_empty_profile():
    torch.manual_seed(0)
    attention = HiddenCarrierOAttention(8, 2, tau=1.0)
    h = torch.randn(2, 5, 8) * 0.1
    profile = PresenceProfile()
    with observe_presence(profile):
        attention(h)
    expected = presence(h, 1.0)
    assert profile.count >= expected.numel()
    assert profile.summary()["quantiles"]["0.99"] <= expected.max().item() + 1e-3
    empty = PresenceProfile().summary()
    assert empty["count"] == 0 and empty["quantiles"]["0.5"] is None
    with pytest.raises(ValueError, match="observe_presence"):
        PresenceProfile().quantile(0.5)


def test_presences_are_attributed_to_the_innermost_running_module():
    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = HiddenCarrierOAttention(8, 2, tau=1.0), HiddenCarrierOAttention(8, 2, tau=1.0)
            self.mix = torch.nn.Linear(8, 8, bias=False)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.second(self.mix(self.first(h)[0]))[0]

    torch.manual_seed(0)
    model = Stack()
    h = torch.randn(1, 4, 8)
    h[0, 1] = 0.0                                        # one null token
    with presence_by_module(model) as profiles:
        model(h)
        presence(h, 1.0)                                 # outside every forward: the root key ""
    assert set(profiles) == {"first", "second", ""}
    first = presence(h, 1.0)
    assert profiles["first"].count == profiles["second"].count == first.numel()
    assert profiles["first"].summary()["below_half"] >= 0.25   # the null token's presence is 0
    assert profiles["second"].summary()["quantiles"]["0.01"] <= 0.001  # it stays null through O
    assert profiles[""].count == first.numel()
    # Hooks are gone after the block.
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_merged_profiles_equal_one_profile_of_everything():
    a, b, whole = PresenceProfile(), PresenceProfile(), PresenceProfile()
    first, second = torch.rand(50), torch.cat([torch.rand(30), torch.tensor([float("inf")])])
    a(first), b(second), whole(first), whole(second)
    merged = PresenceProfile().merge(a).merge(b)
    assert merged.summary() == whole.summary()
    assert torch.equal(merged.counts, whole.counts) and merged.nonfinite == 1
