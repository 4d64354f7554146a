"""Every supported TabPFN model version (``oretrofit.hosts.tabpfn.versions``), random weights
from the version's own ``parse_config``, both arms and both tasks: τ→0 agreement with the
unpatched model, a null train row and a zero feature column inserted are inert under full-o,
``revert()`` is bit-identical, state_dict keys and strict load are kept; the refused versions
and unknown ones are refused by name. Runs on whichever tabpfn release is installed (the
release environments of ``make test-tabpfn-releases`` run it on the oldest and newest release
shipping each version)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tabpfn.architectures.interface import PerformanceOptions

import oretrofit
from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn import versions
from oretrofit.hosts.tabpfn.checkpoints import random_model

FULL_PATH = PerformanceOptions(use_chunkwise_inference=False)
TAU, TOL, REL = 0.5, 1e-5, 1e-5
SHIPPED = [v.label for v in versions.VERSIONS
           if v.sites and importlib.util.find_spec(v.module) is not None]
CASES = [(v, t) for v in SHIPPED for t in ("regressor", "classifier")]


def _model(version: str, task: str) -> torch.nn.Module:
    return random_model(version, "small", seed=0, task=task)[0].double()


def _data(task: str, n: int = 20, m: int = 6, c: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n + m, 1, c, generator=g, dtype=torch.float64)          # (R, B, C)
    y = x[:n, 0] @ torch.randn(c, generator=g, dtype=torch.float64)
    return x, (torch.bucketize(y, y.new_tensor([-0.5, 0.5])).double() if task == "classifier"
               else y)


@torch.no_grad()
def _forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: str, **kw: object):
    """The version's forward: v3.5 takes ``task_type``; v3 reads the task from its config."""
    if versions.version_of(model).label == "v3.5":
        kw["task_type"] = "multiclass" if task == "classifier" else "regression"
    return model(x, y, performance_options=FULL_PATH, **kw)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _zeros_at(x: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = 1
    return torch.cat([x.narrow(dim, 0, index), x.new_zeros(shape),
                      x.narrow(dim, index, x.shape[dim] - index)], dim=dim)


@pytest.mark.parametrize("version,task", CASES)
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_to_zero_recovers_the_host(version, task, arm):
    model = _model(version, task)
    x, y = _data(task)
    base = _forward(model, x, y, task)
    with oretrofit.retrofitted(model, arm, 1e-12, eps=1e-12):
        assert _rel(_forward(model, x, y, task), base) <= REL
    with oretrofit.retrofitted(model, arm, 1.0):
        assert _rel(_forward(model, x, y, task), base) > 1e-3     # the test can fail


@pytest.mark.parametrize("version,task", CASES)
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_null_train_row_inserted(version, task, arm):
    """A zero row token inserted as a train row at the ICL stage (after the column stage)
    changes no test prediction under full-o; under oa the ungated target encoding lifts it."""
    model = _model(version, task)
    oretrofit.retrofit(model, arm, TAU)
    x, y = _data(task)
    n = y.shape[0]
    with torch.no_grad():
        rows = torch.randn(1, x.shape[0], model.column_aggregator.num_cls_tokens, model.emsize,
                           generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def run(x_: torch.Tensor, y_: torch.Tensor, rows_: torch.Tensor) -> torch.Tensor:
        handle = model.column_aggregator.register_forward_hook(lambda m, i, o: rows_.clone())
        try:
            return _forward(model, x_, y_, task)
        finally:
            handle.remove()

    ref = run(x, y, rows)
    out = run(torch.cat([x[:n], x[n - 1:n], x[n:]]), torch.cat([y, y[:1]]), _zeros_at(rows, 1, n))
    if arm == "oa":
        assert _rel(out, ref) > TOL
    else:
        assert _rel(out, ref) <= TOL


def _appended(x_BRCE: torch.Tensor) -> torch.Tensor:
    return _zeros_at(x_BRCE, 2, x_BRCE.shape[2])


@pytest.mark.parametrize("version,task", CASES)
def test_zero_feature_column_inserted(version, task):
    """A zero cell-token column appended to those entering the column aggregator changes no
    prediction (full-o). Appended: the column tokens carry RoPE positions, so one inserted in
    the middle would move the others' positions (a positional change, not a null token)."""
    model = _model(version, task)
    oretrofit.retrofit(model, "full-o", TAU)
    x, y = _data(task)
    ref = _forward(model, x, y, task)
    handle = model.column_aggregator.register_forward_pre_hook(
        lambda m, args, kwargs: (args, {**kwargs, "x_BRiCE": _appended(kwargs["x_BRiCE"])}),
        with_kwargs=True)
    try:
        assert _rel(_forward(model, x, y, task), ref) <= TOL
    finally:
        handle.remove()
    base = _model(version, task)
    handle = base.column_aggregator.register_forward_pre_hook(
        lambda m, args, kwargs: (args, {**kwargs, "x_BRiCE": _appended(kwargs["x_BRiCE"])}),
        with_kwargs=True)
    assert _rel(_forward(base, x, y, task), _forward(_model(version, task), x, y, task)) > TOL
    handle.remove()


@pytest.mark.parametrize("version,task", CASES)
def test_revert_state_dict_and_strict_load(version, task):
    model = _model(version, task)
    x, y = _data(task)
    before = _forward(model, x, y, task)
    classes = {name: type(m) for name, m in model.named_modules()}
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    r = oretrofit.retrofit(model, "full-o", 1.0)
    assert list(model.state_dict()) == list(reference)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in reference.items())
    model.load_state_dict(reference, strict=True)
    assert not torch.equal(_forward(model, x, y, task), before)
    r.revert()
    assert torch.equal(_forward(model, x, y, task), before)
    assert {name: type(m) for name, m in model.named_modules()} == classes
    assert all("_oretrofit" not in m.__dict__ and not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("version", SHIPPED)
def test_learned_receivers_reported(version):
    r = oretrofit.retrofit(_model(version, "regressor"), "oa", 1e-8)
    report = {row["site"]: row["receivers"] for row in r.report()}
    assert report["fde.0.induce1"]["inducing_vectors.min"] > 0.999
    assert report["col.cls"]["cls_tokens.mean"] > 0.999


def test_v3_5_sites_or_the_release_it_needs():
    if "v3.5" not in SHIPPED:                       # tabpfn 8.x: refused naming the release
        with pytest.raises(RetrofitError, match=r"TabPFN v3.5 ships from tabpfn 9.0.0; tabpfn "
                                                r"\S+ is installed: pip install 'tabpfn>=9.0.0'"):
            _model("v3.5", "regressor")
        return
    model = _model("v3.5", "regressor")
    full = [s.name for s, _ in oretrofit.plan_retrofit(model, "full-o").entries]
    assert full[-5:] == ["head.reg.norm", "head.reg.ffn", "head.cls.norm", "head.cls.ffn", "dec"]
    oa = [s.name for s, _ in oretrofit.plan_retrofit(model, "oa").entries]
    assert oa[-1] == "dec" and "te.col" in full and "te.col" not in oa


def test_ungatable_module_refused_by_name():
    model = _model(SHIPPED[-1], "regressor")
    model.icl_blocks[0].extra = torch.nn.Conv1d(2, 2, 3)
    with pytest.raises(RetrofitError, match=r"module icl_blocks\.0\.extra of type "
                                            r"torch\.nn\.modules\.conv\.Conv1d is not one the host"):
        oretrofit.retrofit(model, "oa")
    assert "_oretrofit" not in model.icl_blocks[0].__dict__


@pytest.mark.parametrize("row", [v for v in versions.VERSIONS if not v.sites],
                         ids=lambda v: v.label)
def test_refused_versions_name_themselves(row):
    fake = type(row.cls, (torch.nn.Module,), {"__module__": row.module})
    with pytest.raises(RetrofitError, match=rf"{row.cls} \(TabPFN {row.label}\) is not "
                                            r"supported: .*supported: v3 \(TabPFNV3"):
        oretrofit.retrofit(fake(), "oa")
    with pytest.raises(RetrofitError, match=rf"TabPFN {row.label}\) is not supported"):
        versions.version_of_checkpoint(row.architecture_name)


@pytest.mark.parametrize("name,label", [("tabpfn-v3.5-fast-20260909.safetensors", "v3.5"),
                                        ("tabpfn-v3.5-classifier.ckpt", "v3.5"),
                                        ("tabpfn-v3-regressor-v3_default.ckpt", "v3")])
def test_version_from_the_file_name(name, label):
    assert versions.version_from_name(name).label == label


@pytest.mark.parametrize("name", ["tabpfn-v2.5-regressor-v2.5_default.ckpt",
                                  "tabpfn-v2.6-classifier.ckpt", "model.ckpt"])
def test_refused_file_names(name):
    with pytest.raises(RetrofitError, match="is not supported"):
        versions.version_from_name(name)
