"""The classification prior: k classes cut from the regression prior's targets, each present among the train rows."""

import numpy as np
import pytest
import torch

from oretrofit.demo_host.classes import ClassConfig, classes_of, sample_class_batch
from oretrofit.demo_host.prior import PriorConfig, sample_batch

PRIOR = PriorConfig(min_rows=30, max_rows=60, min_features=2, max_features=5, mlp_max_width=8, fourier_features=8)


@pytest.mark.parametrize("seed", range(6))
def test_every_task_has_k_classes_each_among_the_train_rows(seed):
    cfg = ClassConfig(max_classes=10, binary_fraction=0.3)
    batch = sample_class_batch(np.random.default_rng(seed), 8, PRIOR, cfg)
    labels = batch.y.numpy()
    assert np.array_equal(labels, labels.round())                      # class indices, as floats
    for b in range(labels.shape[1]):
        k = int(labels[:, b].max()) + 1
        assert 2 <= k <= cfg.max_classes
        assert set(labels[: batch.n_train, b].astype(int)) == set(range(k))   # every class in train
        assert labels[:, b].min() == 0


def test_classes_are_the_targets_cut_at_train_values_then_permuted():
    """Rows ordered by y fall in contiguous classes: the classes are intervals of y, relabelled."""
    rng = np.random.default_rng(5)
    y = rng.normal(size=200)
    labels = classes_of(y, 150, ClassConfig(max_classes=6, binary_fraction=0.0), rng)
    runs = labels[np.argsort(y)]
    changes = np.flatnonzero(np.diff(runs)) + 1
    assert len(changes) == len(np.unique(labels)) - 1                  # one interval per class
    assert len(np.unique(labels)) >= 2


def test_a_target_with_fewer_distinct_train_values_gets_fewer_classes():
    y = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.5])
    for seed in range(10):
        labels = classes_of(y, 6, ClassConfig(max_classes=10, binary_fraction=0.0), np.random.default_rng(seed))
        assert set(labels[:6]) == {0, 1}


def test_binary_fraction_one_gives_binary_tasks_and_the_features_are_the_regression_priors():
    cfg = ClassConfig(binary_fraction=1.0)
    batch = sample_class_batch(np.random.default_rng(2), 5, PRIOR, cfg)
    assert batch.y.max().item() == 1.0
    regression = sample_batch(np.random.default_rng(2), 5, PRIOR)
    assert torch.equal(batch.x, regression.x) and batch.n_train == regression.n_train


def test_same_seed_same_labels():
    a = sample_class_batch(np.random.default_rng(9), 3, PRIOR, ClassConfig())
    b = sample_class_batch(np.random.default_rng(9), 3, PRIOR, ClassConfig())
    assert torch.equal(a.y, b.y)


@pytest.mark.parametrize("fields, match", [({"max_classes": 1}, "at least 2"),
                                           ({"binary_fraction": 1.5}, "probability")])
def test_bad_class_configs_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        ClassConfig(**fields)
