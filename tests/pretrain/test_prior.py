"""The synthetic prior: seeded, shaped like TabPFN input, standardised on the train rows."""

import dataclasses

import numpy as np
import pytest
import torch

from oretrofit.pretrain.prior import PriorConfig, sample_batch, sample_task

CFG = PriorConfig(min_rows=40, max_rows=80, min_features=2, max_features=6)


def test_same_seed_same_batch_and_other_seed_differs():
    a = sample_batch(np.random.default_rng(3), 4, CFG)
    b = sample_batch(np.random.default_rng(3), 4, CFG)
    c = sample_batch(np.random.default_rng(4), 4, CFG)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.n_train == b.n_train
    assert a.x.shape != c.x.shape or not torch.equal(a.x, c.x)


@pytest.mark.parametrize("seed", range(5))
def test_batch_shapes_and_ranges(seed):
    batch = sample_batch(np.random.default_rng(seed), 3, CFG)
    rows, b, features = batch.x.shape
    assert b == 3 and batch.y.shape == (rows, 3)
    assert CFG.min_rows <= rows <= CFG.max_rows
    assert CFG.min_features <= features <= CFG.max_features
    assert rows * CFG.min_train_fraction - 1 <= batch.n_train <= rows * CFG.max_train_fraction + 1
    assert torch.isfinite(batch.x).all() and torch.isfinite(batch.y).all()


@pytest.mark.parametrize("seed", range(5))
def test_task_standardised_on_train_rows(seed):
    x, y = sample_task(np.random.default_rng(seed), 60, 5, 40, CFG)
    assert np.allclose(y[:40].mean(), 0.0, atol=1e-9) and np.isclose(y[:40].std(), 1.0)
    varying = x[:40].std(axis=0) > 1e-8
    assert np.allclose(x[:40, varying].mean(axis=0), 0.0, atol=1e-9)
    assert np.allclose(x[:40, varying].std(axis=0), 1.0)
    assert not np.allclose(y[40:].mean(), 0.0, atol=1e-12)  # test rows are not re-centred


def test_noise_level_bounds_signal_fraction():
    quiet = dataclasses.replace(CFG, noise_min=1e-4, noise_max=1e-4)
    loud = dataclasses.replace(CFG, noise_min=10.0, noise_max=10.0)
    # f is standardised before noise is added: corr(y, noise-free y) ≈ 1/sqrt(1 + σ²).
    for cfg, lo, hi in ((quiet, 0.999, 1.0), (loud, 0.0, 0.4)):
        x1, y1 = sample_task(np.random.default_rng(7), 400, 3, 300, cfg)
        x2, y2 = sample_task(np.random.default_rng(7), 400, 3, 300, quiet)
        corr = np.corrcoef(y1, y2)[0, 1]
        assert np.array_equal(x1, x2) and lo <= abs(corr) <= hi
