"""A running histogram of observed presences: how strongly τ gates a host's tokens in one run.

Use with :func:`oretrofit.observe_presence`::

    profile = PresenceProfile()
    with observe_presence(profile):
        model(x)
    profile.summary()   # {"count", "nonfinite", "mean", "below_half", "quantiles": {"0.5": …}}

Memory stays constant (``BINS`` bins on [0, 1]); quantiles are bin upper edges, so they are
exact to 1/BINS. :func:`presence_by_module` keeps one profile per module of a model, so a
run can say *where* τ gates tokens.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from .presence import observe_presence

__all__ = ["PresenceProfile", "presence_by_module"]

QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)


class PresenceProfile:
    """Accumulates every presence tensor it is called with (any shape, values in [0, 1))."""

    BINS = 1000

    def __init__(self) -> None:
        self.counts = torch.zeros(self.BINS, dtype=torch.float64)
        self.count = 0
        self.nonfinite = 0
        self.total = 0.0

    def __call__(self, p: Tensor) -> None:
        flat = p.reshape(-1).to(torch.float64).cpu()
        finite = flat[torch.isfinite(flat)]
        self.nonfinite += flat.numel() - finite.numel()
        self.counts += torch.histc(finite, bins=self.BINS, min=0.0, max=1.0)
        self.count += finite.numel()
        self.total += finite.sum().item()

    def merge(self, other: PresenceProfile) -> PresenceProfile:
        """Add ``other``'s observations to this profile (histograms add exactly); returns self."""
        self.counts += other.counts
        self.count += other.count
        self.nonfinite += other.nonfinite
        self.total += other.total
        return self

    def quantile(self, q: float) -> float:
        """Smallest bin upper edge below which at least a fraction ``q`` of the presences lie."""
        if not self.count:
            raise ValueError("no presence was observed; run the model inside observe_presence(profile)")
        index = int(torch.searchsorted(self.counts.cumsum(0), q * self.count).item())
        return min(index + 1, self.BINS) / self.BINS

    def summary(self) -> dict[str, Any]:
        """Counts, mean, the fraction below ½ and the QUANTILES (None values when nothing was seen)."""
        if not self.count:
            return {"count": 0, "nonfinite": self.nonfinite, "mean": None, "below_half": None,
                    "quantiles": {str(q): None for q in QUANTILES}}
        return {"count": self.count, "nonfinite": self.nonfinite, "mean": self.total / self.count,
                "below_half": self.counts[: self.BINS // 2].sum().item() / self.count,
                "quantiles": {str(q): self.quantile(q) for q in QUANTILES}}


@contextmanager
def presence_by_module(model: nn.Module) -> Iterator[dict[str, PresenceProfile]]:
    """Profiles of the presences computed inside the block, keyed by the qualified name of the
    innermost module of ``model`` whose forward was running ("" for the model itself, or for
    presences computed outside any of its forwards). Hooks are removed when the block ends."""
    running: list[str] = []
    profiles: dict[str, PresenceProfile] = defaultdict(PresenceProfile)

    def leave(_module: nn.Module, _args: Any, _output: Any) -> None:   # None: output unchanged
        running.pop()

    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda _m, _a, name=name: running.append(name)))
        handles.append(module.register_forward_hook(leave))
    try:
        with observe_presence(lambda p: profiles[running[-1] if running else ""](p)):
            yield profiles
    finally:
        for handle in handles:
            handle.remove()
