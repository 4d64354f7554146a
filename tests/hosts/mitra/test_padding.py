"""The token boundary and the padded forward: zero-padded rows and features inert under full-o,
with no mask, and not under oa."""

from __future__ import annotations

import pytest
import torch

from oretrofit import retrofit
from oretrofit.hosts.mitra import padded_forward, random_model


def _calls(task: str) -> list[tuple[torch.Tensor, ...]]:
    calls = []
    for seed, (b, s, q, f) in enumerate([(1, 12, 5, 4), (2, 20, 3, 6), (1, 7, 9, 2)]):
        g = torch.Generator().manual_seed(seed)
        y = (torch.randint(0, 3, (b, s), generator=g) if task == "classification"
             else torch.randn(b, s, generator=g))
        calls.append((torch.randn(b, s, f, generator=g), y, torch.randn(b, q, f, generator=g),
                      *(torch.zeros(b, n, dtype=torch.bool) for n in (f, s, q))))
    return calls


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_zero_padded_rows_and_features_are_inert_under_full_o(task):
    model = random_model(task, seed=0)
    retrofit(model, "full-o", tau=1e-8)
    calls = _calls(task)
    with torch.no_grad():
        padded = padded_forward(model, calls)
        loop = [model(*(t.clone() for t in call)) for call in calls]
    assert [p.shape for p in padded] == [out.shape for out in loop]
    assert max((p - out).abs().max().item() for p, out in zip(padded, loop)) <= 1e-5


def test_under_oa_the_padding_leaks():
    model = random_model("classification", seed=0)
    retrofit(model, "oa", tau=1e-8)
    calls = _calls("classification")
    with torch.no_grad():
        padded = padded_forward(model, calls)
        loop = [model(*(t.clone() for t in call)) for call in calls]
    assert max((p - out).abs().max().item() for p, out in zip(padded, loop)) > 1e-3
