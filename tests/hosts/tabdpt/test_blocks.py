"""The O-mixin of tabdpt's layer: every site alone is the vendor's layer at τ → 0, and the
attention's length scale reads the presence mass of the context rows."""

from __future__ import annotations

import pytest
import torch

from oretrofit import retrofit


@pytest.mark.parametrize("site", ["icl.1.norm", "icl.1.te", "icl.1.attn", "icl.1.ffn"])
def test_each_site_alone_is_the_vendor_layer(model, batch, site):
    x, y = batch(False)
    with torch.no_grad():
        before = model(x, y, False)
        handle = retrofit(model, "full-o", tau=1e-8, targets=[site])
        assert [s.name for s, _ in handle.plan.entries] == [site]
        assert (model(x, y, False) - before).abs().max().item() <= 1e-5


def _layer_output(layer, x, y, eval_pos):
    with torch.no_grad():
        return layer(x, y, eval_pos)


def test_a_null_context_row_changes_neither_weights_nor_length_scale(model):
    """A zero context row appended to the context: under O the layer's output for the other
    rows is that without it (weights and the scale β(n) read the presence mass, not the number
    of rows); the vendor's changes, through the softmax and through β."""
    layer = model.transformer_encoder[0]
    g = torch.Generator().manual_seed(3)
    n, m, d = 6, 3, layer.embed_dim
    x = torch.randn(n + m, 1, d, generator=g)
    y = torch.randn(n, 1, 8, generator=g)
    padded_x = torch.cat([x[:n], x.new_zeros(1, 1, d), x[n:]])
    padded_y = torch.cat([y, torch.randn(1, 1, 8, generator=g)])
    real = torch.cat([torch.arange(n), torch.arange(n + 1, n + 1 + m)])
    assert float(layer.kappa) > 0 and n > float(layer.n0)        # β(n) depends on n here
    vendor = _layer_output(layer, x, y, n)
    assert (_layer_output(layer, padded_x, padded_y, n + 1)[real] - vendor).abs().max() > 1e-3
    retrofit(model, "full-o", tau=1e-8, targets=["icl.0.*"])
    retrofitted = _layer_output(layer, x, y, n)
    assert (retrofitted - vendor).abs().max() <= 1e-5
    padded = _layer_output(layer, padded_x, padded_y, n + 1)
    assert (padded[real] - retrofitted).abs().max() <= 1e-6
    assert torch.equal(padded[n], torch.zeros_like(padded[n]))  # the null row stays null
