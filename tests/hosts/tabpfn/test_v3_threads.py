"""Concurrent forwards of one retrofitted v3 model (``predict`` of copies of one estimator on
several threads): each forward's own state (the ``te.icl`` row tokens, the pending ``te.col``
injection) is kept per thread, never on the shared model, so no forward sees another's."""

from __future__ import annotations

import copy
import threading

import numpy as np
import torch

from oretrofit.tabpfn import make_regressor

from . import FAST

SAME = 1e-9          # fp64: the same forward, alone or beside another thread's


def test_two_threads_predicting_with_copies_of_one_full_o_estimator_get_their_own(small_ckpt):
    rng = np.random.default_rng(3)
    x, t = rng.normal(size=(90, 4)), rng.normal(size=(30, 4))
    ys = [x @ rng.normal(size=4) * scale for scale in (1.0, 50.0)]    # same shapes, other targets
    regressor, _ = make_regressor(small_ckpt, "full-o", 1e-8, inference_precision=torch.float64,
                                  **FAST)
    fitted = [copy.copy(regressor).fit(x, y) for y in ys]
    alone = [f.predict(t) for f in fitted]
    seen: list[list[np.ndarray]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def predict(i: int) -> None:
        try:
            start.wait()
            for _ in range(4):
                seen[i].append(fitted[i].predict(t))
        except BaseException as exc:                   # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=predict, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i in (0, 1):
        assert len(seen[i]) == 4
        worst = max(float(np.abs(p - alone[i]).max() / np.abs(alone[i]).max()) for p in seen[i])
        assert worst <= SAME, (i, worst)


def test_the_te_col_hook_comes_off_with_the_retrofit(small_ckpt):
    regressor, retrofit = make_regressor(small_ckpt, "full-o", 1e-8, **FAST)
    embed = retrofit.model.x_embed
    assert len(embed._forward_hooks) == 1
    retrofit.revert()
    assert len(embed._forward_hooks) == 0


def test_one_fitted_estimator_shared_by_four_threads_returns_the_serial_predictions(small_ckpt):
    """One fitted full-O estimator, four threads, test sets of mixed sizes: every prediction is
    the one the same call gives alone, bit for bit."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 4))
    regressor, _ = make_regressor(small_ckpt, "full-o", 1e-8, inference_precision=torch.float64)
    fitted = regressor.fit(x, x @ rng.normal(size=4))
    tests = [rng.normal(size=(5 + (i * 7) % 23, 4)) for i in range(4 * 20)]
    alone = [fitted.predict(t) for t in tests]
    seen: list[np.ndarray | None] = [None] * len(tests)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def predict(i: int) -> None:
        try:
            start.wait()
            for j in range(i, len(tests), 4):
                seen[j] = fitted.predict(tests[j])
        except BaseException as exc:                   # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=predict, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert all(np.array_equal(a, s) for a, s in zip(alone, seen))
