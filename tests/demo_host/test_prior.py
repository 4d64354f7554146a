"""The synthetic prior: seeded, shaped like TabPFN input, standardised on the train rows."""

import dataclasses

import numpy as np
import pytest
import torch

from oretrofit.demo_host.prior import PriorConfig, _additive, sample_batch, sample_task

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


@pytest.mark.parametrize("seed", range(4))
def test_zero_inflated_columns_have_a_mass_at_their_minimum(seed):
    x, _ = sample_task(np.random.default_rng(seed), 300, 4, 200, dataclasses.replace(CFG, zero_inflated=1.0))
    for column in x.T:  # max(0, z − θ), standardised: every censored row sits at the column's minimum
        assert np.sum(np.isclose(column, column.min(), rtol=0, atol=1e-9)) >= 2


@pytest.mark.parametrize("seed", range(4))
def test_latent_inputs_change_the_target_not_the_columns(seed):
    skewed = dataclasses.replace(CFG, family_weights=(0.0, 0.0, 1.0))
    x_obs, y_obs = sample_task(np.random.default_rng(seed), 100, 3, 70, skewed)
    x_lat, y_lat = sample_task(np.random.default_rng(seed), 100, 3, 70,
                               dataclasses.replace(skewed, latent_inputs=1.0))
    assert np.array_equal(x_obs, x_lat) and not np.allclose(y_obs, y_lat)


@pytest.mark.parametrize("seed", range(4))
def test_tree_family_is_piecewise_constant(seed):
    # One tree of depth ≤ 2 and no noise to speak of: at most 4 target values.
    trees = dataclasses.replace(CFG, family_weights=(0.0, 0.0, 0.0, 1.0), tree_max_count=1,
                                tree_max_depth=2, noise_min=1e-9, noise_max=1e-9)
    _, y = sample_task(np.random.default_rng(seed), 200, 3, 150, trees)
    assert 1 <= len(np.unique(np.round(y, 6))) <= 4


@pytest.mark.parametrize("seed", range(4))
def test_linear_family_without_interactions_is_exactly_linear(seed):
    # Only the linear family, no products, no noise to speak of: y is affine in the columns it reads.
    additive = dataclasses.replace(CFG, family_weights=(0.0, 0.0, 1.0), linear_max_interactions=0,
                                   noise_min=1e-9, noise_max=1e-9)
    x, y = sample_task(np.random.default_rng(seed), 200, 4, 150, additive)
    design = np.column_stack([x, np.ones(len(x))])
    residual = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    assert np.abs(residual).max() < 1e-6
    products = dataclasses.replace(additive, linear_max_interactions=50)
    x, y = sample_task(np.random.default_rng(seed), 200, 4, 150, products)
    design = np.column_stack([x, np.ones(len(x))])
    assert np.abs(y - design @ np.linalg.lstsq(design, y, rcond=None)[0]).max() > 1e-2


@pytest.mark.parametrize("seed", range(4))
def test_additive_family_has_no_interactions(seed):
    # Σ_i g_i(x_i) on the corners of a rectangle: f(a1, a2) + f(b1, b2) = f(b1, a2) + f(a1, b2)
    a, b = np.random.default_rng(100 + seed).normal(size=(2, 3))
    corners = np.array([a, [b[0], a[1], a[2]], [a[0], b[1], a[2]], [b[0], b[1], a[2]]])
    f = _additive(corners, CFG, np.random.default_rng(seed))
    assert abs(f[0] + f[3] - f[1] - f[2]) < 1e-9
    assert abs(f[0] - f[3]) > 1e-3                      # and the curves do vary


@pytest.mark.parametrize("seed", range(4))
def test_additive_family_bends_where_its_length_scales_are_short(seed):
    # on continuous columns the curves are not affine (a binary column would make any curve affine)...
    x = np.random.default_rng(200 + seed).normal(size=(300, 3))
    short = dataclasses.replace(CFG, length_scale_min=0.5, length_scale_max=1.0)
    design = np.column_stack([x, np.ones(len(x))])
    f = _additive(x, short, np.random.default_rng(seed))
    assert np.abs(f - design @ np.linalg.lstsq(design, f, rcond=None)[0]).max() > 0.1 * f.std()
    # ...and without cosines they are exactly linear
    f = _additive(x, dataclasses.replace(short, additive_cosines=0), np.random.default_rng(seed))
    assert np.abs(f - design @ np.linalg.lstsq(design, f, rcond=None)[0]).max() < 1e-9 * max(f.std(), 1.0)


def test_a_fifth_weight_draws_additive_tasks():
    # a fifth weight of 1 (the others 0): finite tasks, standardised on the train rows
    curves = dataclasses.replace(CFG, family_weights=(0.0, 0.0, 0.0, 0.0, 1.0))
    batch = sample_batch(np.random.default_rng(5), 3, curves)
    train_sd = batch.y[:batch.n_train].std(dim=0, unbiased=False)
    assert torch.isfinite(batch.y).all() and torch.allclose(train_sd, torch.ones(3), atol=1e-5)


@pytest.mark.parametrize(("change", "message"), [
    ({"family_weights": (0.5, 0.5)}, "3 to 5 non-negative weights"),
    ({"family_weights": (0.1,) * 6}, "3 to 5 non-negative weights"),
    ({"additive_cosines": -1}, "additive_cosines is a count"),
    ({"family_weights": (0.0, 0.0, 0.0)}, "not all zero"),
    ({"family_weights": (1.0, -0.1, 0.2)}, "non-negative"),
    ({"zero_inflated": 1.5}, "zero_inflated is a probability"),
    ({"latent_inputs": -0.1}, "latent_inputs is a probability"),
    ({"linear_max_interactions": -1}, "linear_max_interactions is a count"),
    ({"max_rows": 39}, "3 <= min_rows <= max_rows"),
    ({"min_rows": 2}, "3 <= min_rows <= max_rows"),
    ({"min_features": 0}, "1 <= min_features <= max_features"),
    ({"max_features": 1}, "1 <= min_features <= max_features"),
])
def test_invalid_prior_options_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(CFG, **change)
