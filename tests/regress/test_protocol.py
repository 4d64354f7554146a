"""The split and capping rule: deterministic, disjoint, capped, recorded."""

from __future__ import annotations

import numpy as np
import pytest

from oretrofit.regress.protocol import PAPER_PROTOCOL, SplitProtocol, rmse_r2


@pytest.mark.parametrize("n, n_train, n_test", [(252, 189, 63), (1030, 512, 256),
                                                 (8192, 512, 256), (240, 180, 60)])
def test_sizes_follow_the_quarter_and_caps(n, n_train, n_test):
    split = PAPER_PROTOCOL.split(n, 11)
    assert (len(split.train), len(split.test)) == (n_train, n_test)
    assert not set(split.train) & set(split.test)
    assert max(split.train.max(), split.test.max()) < n


def test_split_is_deterministic_in_the_seed_and_matches_the_documented_rule():
    a, b, c = PAPER_PROTOCOL.split(1030, 23), PAPER_PROTOCOL.split(1030, 23), \
        PAPER_PROTOCOL.split(1030, 37)
    assert a.digest() == b.digest() != c.digest()
    perm = np.random.default_rng(23).permutation(1030)
    np.testing.assert_array_equal(a.test, perm[:258][:256])
    np.testing.assert_array_equal(a.train, perm[258:][:512])


def test_describe_and_validation():
    described = SplitProtocol(max_train=64, max_test=32).describe()
    assert described["name"] == "permute-quarter-cap-v1" and described["max_train"] == 64
    assert "default_rng(seed)" in described["rule"]
    with pytest.raises(ValueError, match="test_fraction"):
        SplitProtocol(test_fraction=1.0)
    with pytest.raises(ValueError, match="row caps"):
        SplitProtocol(max_test=0)
    with pytest.raises(ValueError, match="at least 2 rows"):
        PAPER_PROTOCOL.split(1, 0)


def test_rmse_r2_against_hand_worked_values():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    rmse, r2 = rmse_r2(y, np.array([1.0, 2.0, 3.0, 5.0]))   # one residual of 1; Σ(y−ȳ)² = 5
    assert rmse == 0.5 and r2 == 1.0 - 1.0 / 5.0
    assert rmse_r2(y, y) == (0.0, 1.0)
    rmse, r2 = rmse_r2(np.ones(3), np.zeros(3))               # constant target: R² undefined
    assert rmse == 1.0 and np.isnan(r2)
