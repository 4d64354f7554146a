"""Padding is inert under ``full-o`` with no mask: datasets of different row counts, train
sizes and widths, their row tokens stacked and zero-padded in one forward, give each dataset's
own forward."""

from __future__ import annotations

import pytest
import torch

import oretrofit
from oretrofit import RetrofitError
from oretrofit.hosts.tabicl.padding import padded_forward

from .conftest import table

# (lanes, rows, train rows, features): ragged in every dimension
DATASETS = [(2, 12, 8, 5), (1, 9, 5, 3), (2, 15, 9, 7)]


def _datasets(task: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pairs = [table(task, lanes, rows, train, features, seed=k)
             for k, (lanes, rows, train, features) in enumerate(DATASETS)]
    return [x for x, _ in pairs], [y for _, y in pairs]


@pytest.mark.parametrize("task", ["classifier", "regressor"])
@pytest.mark.parametrize("grouping", ["same", "valid", False])
def test_zero_padded_rows_and_features_are_inert(tiny, fp32, task, grouping):
    model = tiny(task, col_feature_group=grouping)
    xs, ys = _datasets(task)
    with torch.no_grad():
        vendor = [model(x, y, inference_config=fp32) for x, y in zip(xs, ys)]
        oretrofit.retrofit(model, "full-o", tau=1e-8)
        alone = [model(x, y, inference_config=fp32) for x, y in zip(xs, ys)]
        padded = padded_forward(model, xs, ys, inference_config=fp32)
    for own, together, unpatched in zip(alone, padded, vendor):
        assert together.shape == own.shape
        assert (together - own).abs().max() < 1e-6
        assert (together - unpatched).abs().max() < 1e-5


def test_the_padding_leaks_without_every_site_and_is_refused(tiny, fp32):
    model = tiny()
    xs, ys = _datasets("classifier")
    with pytest.raises(RetrofitError, match="retrofit the model with arm 'full-o'"):
        padded_forward(model, xs, ys, inference_config=fp32)
    oretrofit.retrofit(model, "oa", tau=1e-8)
    with pytest.raises(RetrofitError, match="retrofit the model with arm 'full-o'"):
        padded_forward(model, xs, ys, inference_config=fp32)


def test_the_model_is_left_as_it_is(tiny, fp32):
    model = tiny()
    oretrofit.retrofit(model, "full-o", tau=1e-8)
    hooks = {name: dict(m._forward_hooks) for name, m in model.named_modules()}
    reserved = model.col_embedder.reserve_cls_tokens
    padded_forward(model, *_datasets("classifier"), inference_config=fp32)
    assert hooks == {name: dict(m._forward_hooks) for name, m in model.named_modules()}
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.col_embedder.reserve_cls_tokens == reserved > 0
