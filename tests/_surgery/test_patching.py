"""Reversible class-swap surgery: set_site / site_config / o_subclass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oretrofit._surgery.patching import SiteConfig, o_subclass, set_site, site_config


class Doubled:
    """A toy site mixin: doubles the wrapped module's output while the site is on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


class Other:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def test_set_site_swaps_class_and_undo_restores_it() -> None:
    lin = nn.Linear(3, 3)
    keys, x = list(lin.state_dict()), torch.randn(2, 3)
    before = lin(x)
    undo = set_site(lin, Doubled, "double", SiteConfig(tau=1.0))
    assert type(lin).__name__ == "OLinear" and isinstance(lin, nn.Linear)
    assert list(lin.state_dict()) == keys
    assert torch.equal(lin(x), 2 * before)
    assert site_config(lin, "double") == SiteConfig(tau=1.0, eps=0.0)
    undo()
    assert type(lin) is nn.Linear and "_oretrofit" not in lin.__dict__
    assert site_config(lin, "double") is None
    assert torch.equal(lin(x), before)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_class_is_restored_by_the_last_undo(order: tuple[int, int]) -> None:
    lin = nn.Linear(3, 3)
    undos = [set_site(lin, Doubled, key, SiteConfig(tau=1.0)) for key in ("a", "b")]
    undos[order[0]]()
    assert type(lin) is o_subclass(nn.Linear, Doubled)
    assert site_config(lin, ("a", "b")[order[0]]) is None
    assert site_config(lin, ("a", "b")[order[1]]) is not None
    undos[order[1]]()
    assert type(lin) is nn.Linear and "_oretrofit" not in lin.__dict__


def test_conflicts_raise() -> None:
    lin = nn.Linear(3, 3)
    set_site(lin, Doubled, "a", SiteConfig(tau=1.0))
    with pytest.raises(RuntimeError, match="already patched on this module"):
        set_site(lin, Doubled, "a", SiteConfig(tau=1.0))
    with pytest.raises(RuntimeError, match="another mixin"):
        set_site(lin, Other, "b", SiteConfig(tau=1.0))


def test_subclass_is_created_once() -> None:
    assert o_subclass(nn.LayerNorm, Doubled) is o_subclass(nn.LayerNorm, Doubled)
    assert o_subclass(nn.LayerNorm, Doubled) is not o_subclass(nn.Linear, Doubled)
