"""One smoke test on the vendor's default v3 size (58.3M parameters, random weights)."""

from __future__ import annotations

import numpy as np

from oretrofit.tabpfn import make_regressor, write_random_checkpoint

from . import FAST


def test_default_size_full_o_fit_predict(tmp_path, table):
    path = write_random_checkpoint(tmp_path / "tabpfn-v3-default-random.ckpt", "default", seed=0)
    regressor, result = make_regressor(path, "full-o", 1e-8, **FAST)
    assert sum(p.numel() for p in result.model.parameters()) == 58_274_944
    assert result.model.config.nlayers == 24 and len(result.report()) > 100
    x_train, y_train, x_test = table
    prediction = regressor.fit(x_train[:20], y_train[:20]).predict(x_test[:5])
    assert prediction.shape == (5,) and np.isfinite(prediction).all()
