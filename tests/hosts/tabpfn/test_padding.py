"""The token boundaries of :mod:`oretrofit.hosts.tabpfn.padding`: in the one padded forward of
``predict_batched``, every padded cell, row and column enters the layers behind each boundary as
an exact zero carrier (presence 0), and every real one as a non-zero carrier; per version."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn import padding
from oretrofit.hosts.tabpfn.checkpoints import write_random_checkpoint
from oretrofit.tabpfn import make_regressor, predict_batched

from . import FAST

from .test_batched import OTHER_VERSIONS, REG_PRECISION, SAME, _each, _rel

V3_FAMILY = ["v3", *[v for v in OTHER_VERSIONS if v.startswith("v3")]]
V2_FAMILY = [v for v in OTHER_VERSIONS if v.startswith("v2")]


def _ragged(count: int = 5, seed: int = 4) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Datasets whose rows (train and test) and widths all differ."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        n, m, c = 30 + 17 * k, 3 + 2 * k, 2 + 3 * k
        x = rng.normal(size=(n + m, c))
        out.append((x[:n], x[:n] @ rng.normal(size=c), x[n:]))
    return out


@pytest.fixture
def checkpoint(tmp_path, small_ckpt):
    def make(version: str):
        if version == "v3":
            return small_ckpt
        return write_random_checkpoint(tmp_path / f"tabpfn-{version}-regressor-random.ckpt",
                                       "small", version=version)
    return make


def _layouts(monkeypatch) -> list[padding.Layout]:
    """Every layout the batched forwards are built from, in order."""
    layouts: list[padding.Layout] = []
    original = padding.Layout.of
    monkeypatch.setattr(padding.Layout, "of", classmethod(
        lambda cls, calls: layouts.append(original(calls)) or layouts[-1]))
    return layouts


@pytest.mark.parametrize("version", V3_FAMILY)
def test_cell_and_row_tokens_of_the_padding_are_zero(checkpoint, monkeypatch, version):
    """v3/v3.5: padded cells enter the distribution embedder as exact zeros, padded rows enter
    every ICL block and leave the output norm as exact zeros."""
    regressor, result = make_regressor(checkpoint(version), "full-o", 1e-8,
                                       inference_precision=torch.float32, **FAST)
    model, seen = result.model, []
    layouts = _layouts(monkeypatch)

    def keep(name):
        def hook(module, args, kwargs, *out):
            seen.append((name, out[0] if out else (args or (kwargs["x_BRiCE"],))[0]))
        return hook

    hooks = [model.feature_distribution_embedder.register_forward_pre_hook(keep("cells"),
                                                                           with_kwargs=True),
             model.output_norm.register_forward_hook(keep("out"), with_kwargs=True),
             *[b.register_forward_pre_hook(keep("icl"), with_kwargs=True)
               for b in model.icl_blocks]]
    try:
        predict_batched(regressor, *zip(*_ragged()), max_padding=math.inf)
    finally:
        for hook in hooks:
            hook.remove()
    layout = layouts[-1]
    pad_rows = layout.padded_rows(torch.device("cpu"))
    assert pad_rows.any() and len({c.x.shape[2] for c in layout.calls}) > 1
    cells = torch.cat([x for name, x in seen if name == "cells"], dim=1)   # row chunks, in order
    for call, lanes in layout.parts():                                     # padded columns
        assert (cells[lanes][..., call.x.shape[2]:, :] == 0).all()
    assert (cells[pad_rows] == 0).all() and (cells[~pad_rows].norm(dim=-1) > 0).any(-1).all()
    for name, x in seen:                                                   # (B, R, D)
        if name != "cells":
            assert (x[pad_rows] == 0).all() and (x[~pad_rows].norm(dim=-1) > 0).all()
    assert {name for name, _ in seen} == {"cells", "icl", "out"}


@pytest.mark.parametrize("version", V2_FAMILY)
def test_block_input_of_the_padding_is_zero_in_every_block(checkpoint, monkeypatch, version):
    """v2/v2.x: at the input of every block of the padded forward, the padded rows, the padded
    feature groups (their thinking rows too) are exact zeros; every real cell and the target
    column are not (a dataset's feature groups: the non-zero cells of its first train row)."""
    regressor, result = make_regressor(checkpoint(version), "full-o", 1e-8,
                                       inference_precision=torch.float32, **FAST)
    model, seen = result.model, []
    layouts = _layouts(monkeypatch)
    hooks = [b.register_forward_pre_hook(
        lambda m, args: seen.append(padding._block_input(args)[0].clone()))
        for b in model.blocks]
    try:
        sets = _ragged()
        predict_batched(regressor, *zip(*sets), max_padding=math.inf)
    finally:
        for hook in hooks:
            hook.remove()
    layout = layouts[-1]
    grids = seen[-len(model.blocks):]                         # the padded forward's blocks
    thinking = grids[0].shape[1] - layout.n - layout.m
    assert grids[0].shape[0] == layout.lanes and len({c.x.shape[2] for c in layout.calls}) > 1
    for grid in grids:                                        # (lanes, T + N + M, G + 1, E)
        real = torch.zeros(grid.shape[:3], dtype=torch.bool)
        widths = []
        for call, lanes in layout.parts():
            groups = int((grid[lanes, thinking, :-1].norm(dim=-1) > 0).sum(-1).max())
            widths.append(groups)
            for rows in (slice(0, thinking + call.n_train),
                         slice(thinking + layout.n, thinking + layout.n + call.n_test)):
                real[lanes, rows, :groups] = True
                real[lanes, rows, -1] = True
        assert (grid[~real] == 0).all() and (grid[real].norm(dim=-1) > 0).all()
        assert len(set(widths)) > 1 and max(widths) == grid.shape[2] - 1


@pytest.mark.parametrize("version", V2_FAMILY)
def test_oa_suffices_for_padded_columns_and_base_is_refused(checkpoint, version):
    """v2/v2.x add nothing behind the boundary (post-norms without affine part, bias-free
    MLPs): the attention sites alone keep padded rows and columns inert."""
    sets = _ragged()
    kw = {"inference_precision": REG_PRECISION}
    regressor, _ = make_regressor(checkpoint(version), "oa", 1e-8, **kw, **FAST)
    got = predict_batched(regressor, *zip(*sets), max_padding=math.inf)
    assert max(map(_rel, got, _each(regressor, "predict", sets))) <= SAME
    with pytest.raises(RetrofitError, match=r"padding needs the sites blk\.0\.row.*'oa' or "
                                            r"'full-o'"):
        predict_batched(make_regressor(checkpoint(version), "base", **FAST)[0], *zip(*sets))


def test_an_unknown_architecture_is_refused_by_name():
    with pytest.raises(RetrofitError, match="no token boundaries for Linear; it knows "
                                            r"tabpfn\.architectures\.tabpfn_v2"):
        padding.boundaries_of(torch.nn.Linear(2, 2))
