"""Padding inert under ``full-o`` with no mask: model calls on datasets of different sizes in one
forward of a TabDPT model, each equal to its own forward; padded features inert in the host
itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from oretrofit import retrofit
from oretrofit.tabdpt import padded_forward

# (context rows, test rows, features) of three datasets; the model's width is 8
SIZES = [(10, 5, 8), (6, 3, 5), (14, 1, 3)]


def _datasets(is_cls: bool, lanes: int = 1) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One model call per dataset, ``lanes`` batch lanes each."""
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(lanes, n + m, f, generator=g) for n, m, f in SIZES]
    ys = [torch.randint(0, 3, (lanes, n), generator=g).float() if is_cls
          else torch.randn(lanes, n, generator=g) for n, _, _ in SIZES]
    return xs, ys


def _own_forwards(model, xs, ys, is_cls):
    """Each call alone, its features zero-padded to the width as the vendor does."""
    return [model(F.pad(x, (0, 8 - x.shape[-1])), y, is_cls) for x, y in zip(xs, ys)]


@pytest.mark.parametrize("is_cls,lanes", [(True, 1), (False, 1), (True, 3)])
def test_padded_rows_are_inert_under_full_o(model, is_cls, lanes):
    xs, ys = _datasets(is_cls, lanes)
    with torch.no_grad():
        alone = _own_forwards(model, xs, ys, is_cls)
        retrofit(model, "full-o", tau=1e-8)
        together = padded_forward(model, xs, ys, is_cls)
    assert [t.shape for t in together] == [a.shape for a in alone]
    assert max((t - a).abs().max().item() for t, a in zip(together, alone)) <= 1e-5


@pytest.mark.parametrize("arm", ["base", "oa"])
def test_padded_rows_leak_without_the_full_arm(model, arm):
    """The comparison above can fail: unpatched, or with attention alone (a zero row gets
    ``ff_norm``'s bias through the FFN and becomes a source), the padding reaches real rows."""
    xs, ys = _datasets(True)
    with torch.no_grad():
        alone = _own_forwards(model, xs, ys, True)
        retrofit(model, arm, tau=1e-8)
        together = padded_forward(model, xs, ys, True)
    assert max((t - a).abs().max().item() for t, a in zip(together, alone)) > 1e-3


def test_padded_features_meet_only_their_encoder_weights(model):
    """A zero feature column stays zero through the model's standardisation and clipping: the
    output does not depend on the encoder's weights for it."""
    x, y = _datasets(True)[0][1], _datasets(True)[1][1]         # 5 of 8 features
    x = F.pad(x, (0, 3))
    with torch.no_grad():
        before = model(x, y, True)
        model.encoder.weight[:, 5:] = 100.0
        assert torch.equal(model(x, y, True), before)


def test_more_features_than_the_width_or_unpaired_targets_are_refused(model):
    with pytest.raises(ValueError, match="9 features, more than the model's 8"):
        padded_forward(model, [torch.randn(1, 4, 9)], [torch.zeros(1, 3)], True)
    with pytest.raises(ValueError, match="one target tensor per call"):
        padded_forward(model, [torch.randn(1, 4, 8)], [], True)
