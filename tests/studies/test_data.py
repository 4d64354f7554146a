"""Splits, train-fitted standardisation and the original-unit regression metrics (B.2)."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_diabetes

from oretrofit.studies.data import check_tasks, load_split
from oretrofit.studies.training import metrics


def test_stratified_60_20_20_split_with_train_fitted_standardisation():
    split = load_split("wine", 11, zero_columns=2)
    assert split.sizes() == {"train": 106, "val": 36, "test": 36}
    assert split.n_features == 15 and split.n_classes == 3
    assert torch.equal(split.x_test[:, -2:], torch.zeros(36, 2))
    torch.testing.assert_close(split.x_train[:, :-2].mean(0), torch.zeros(13), atol=1e-5, rtol=0)
    assert split.x_test[:, :-2].mean(0).abs().max() > 1e-3       # test moments not refitted
    for part in (split.y_train, split.y_val, split.y_test):       # stratified: every class present
        assert torch.bincount(part, minlength=3).min() > 0


def test_splits_differ_by_seed_and_repeat_exactly():
    a, b, c = load_split("iris", 11), load_split("iris", 11), load_split("iris", 23)
    assert torch.equal(a.x_test, b.x_test) and not torch.equal(a.x_test, c.x_test)


def test_diabetes_metrics_are_in_original_units():
    split = load_split("diabetes", 37)
    _, y = load_diabetes(return_X_y=True)
    y_test = split.y_test.double() * split.target_scale + split.target_mean
    assert np.isin(np.round(y_test.numpy()), y).all()
    zero = torch.zeros(len(split.y_test), 1)                      # predicts the train mean
    expected = float((y_test - split.target_mean).square().mean().sqrt())
    assert metrics(split, zero, split.y_test)["rmse"] == pytest.approx(expected, rel=1e-9)


def test_unknown_dataset_is_named():
    with pytest.raises(ValueError, match="choose from iris"):
        check_tasks(["irs"], ("iris", "wine"))
