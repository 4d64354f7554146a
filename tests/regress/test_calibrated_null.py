"""Null insertion stays exact under a calibrated spec: on the demo TabPFN v3 host with the
Full-O spec `calibrate` derives from diabetes (per-site τ from ~1e-4 to ~1, not one τ), a zero
row token inserted among the train rows changes no test prediction and comes out exactly 0
(fp64). The unpatched host fails the same check, so the test can fail."""

from __future__ import annotations

import pytest
import torch
from tabpfn.architectures.interface import PerformanceOptions

from oretrofit import apply_spec
from oretrofit.regress import SplitProtocol
from oretrofit.regress.calibrate import calibrate_tabpfn
from oretrofit.regress.data import load_datasets
from oretrofit.tabpfn import build_model, load_checkpoint, resolve_model_path

TOL = 1e-11
FULL_PATH = PerformanceOptions(use_chunkwise_inference=False)


@pytest.fixture(scope="module")
def spec() -> dict:
    dataset = load_datasets(["sklearn:diabetes"])["sklearn:diabetes"]
    return calibrate_tabpfn("demo", [dataset], [11], arm="full-o",
                            protocol=SplitProtocol(max_train=48, max_test=24))


def _forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor):
    """The whole forward with the row tokens after column aggregation replaced by ``rows``."""
    handle = model.column_aggregator.register_forward_hook(lambda m, i, o: rows.clone())
    try:
        return model(x, y, only_return_standard_out=False, performance_options=FULL_PATH)
    finally:
        handle.remove()


def _shift(model: torch.nn.Module) -> tuple[float, float]:
    """(largest change of a test output, largest |embedding| of the null row) when a zero row
    token is inserted as train row n."""
    g = torch.Generator().manual_seed(0)
    n, m, c = 8, 4, 3
    x = torch.randn(n + m, 1, c, generator=g, dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64)
    aggregator = model.column_aggregator
    rows = torch.randn(1, n + m, aggregator.num_cls_tokens, model.emsize, generator=g,
                       dtype=torch.float64)
    with torch.no_grad():
        before = _forward(model, x, y, rows)
        after = _forward(model, torch.cat([x[:n], x[n - 1:n], x[n:]]),
                         torch.cat([y, y.new_tensor([3.0])]),
                         torch.cat([rows[:, :n], rows.new_zeros(1, 1, *rows.shape[2:]),
                                    rows[:, n:]], dim=1))
    change = float((after["standard"] - before["standard"]).abs().max())
    return change, float(after["train_embeddings"][n].abs().max())


def test_a_null_train_row_is_exact_under_the_calibrated_full_o_spec(spec):
    taus = sorted(spec["site_tau"].values())
    assert len(set(taus)) > 1 and taus[0] > 1e-6          # per-site τ, far above 1e-8
    model = build_model(load_checkpoint(resolve_model_path("demo")))[0].double()
    assert _shift(model)[0] > 1e-6                        # the law fails unpatched
    retrofit = apply_spec(model, spec)
    try:
        change, null = _shift(model)
    finally:
        retrofit.revert()
    assert change <= TOL and null == 0.0
