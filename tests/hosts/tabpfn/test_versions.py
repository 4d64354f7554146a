"""Every supported TabPFN model version (``oretrofit.hosts.tabpfn.versions``), random weights
from the version's own ``parse_config``, both arms and both tasks: τ→0 agreement with the
unpatched model, a null train row and a zero feature column inserted at the token boundary
(v3/v3.5: the row tokens entering the ICL stage and the cell tokens entering the column
aggregator; v2.5/v2.6: the cell grid entering the first block) are inert under full-o,
``revert()`` is bit-identical, state_dict keys and strict load are kept; the refused versions
and unknown ones are refused by name. Runs on whichever tabpfn release is installed (the
release environments of ``make test-tabpfn-releases`` run it on the oldest and newest release
shipping each version)."""

from __future__ import annotations

import importlib.util
import inspect

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
V2 = {"v2", "v2.5", "v2.6"}                # the per-feature transformer family (sites "v2_5")


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


def _grid(version: str, model: torch.nn.Module, rows: int) -> torch.Tensor:
    """Fixed random tokens for the boundary of ``version``: v2.x the cell grid ``(1, R, C + 1,
    E)`` (2 feature groups of 4 features, + the target cell); v3 the row tokens ``(1, R, Cl,
    E)``."""
    cells = 3 if version in V2 else model.column_aggregator.num_cls_tokens
    return torch.randn(1, rows, cells, model.emsize, generator=torch.Generator().manual_seed(2),
                       dtype=torch.float64)


def _first_block_input(model: torch.nn.Module, edit):
    """A hook editing the grid entering the first block (a tensor, or later releases' one-element
    list)."""
    def hook(_module: torch.nn.Module, args: tuple) -> tuple:
        x = args[0]
        return ([edit(x[0])] if isinstance(x, list) else edit(x), *args[1:])

    return model.blocks[0].register_forward_pre_hook(hook)


def _with_tokens(model: torch.nn.Module, version: str, tokens: torch.Tensor):
    """A hook putting ``tokens`` at the boundary: v2.5/v2.6 the grid handed to the thinking
    rows (before they are prepended), v2 the grid entering the first block, v3 the column
    aggregator's output."""
    if version in V2 and hasattr(model, "add_thinking_rows"):
        return model.add_thinking_rows.register_forward_pre_hook(
            lambda m, args: (tokens.clone(), *args[1:]))
    if version in V2:
        return _first_block_input(model, lambda x: tokens.clone())
    return model.column_aggregator.register_forward_hook(lambda m, i, o: tokens.clone())


@pytest.mark.parametrize("version,task", CASES)
@pytest.mark.parametrize("arm", ["oa", "full-o", None])
def test_null_train_row_inserted(version, task, arm):
    """A zero token row inserted as a train row at the boundary changes no test prediction
    under full-o. Under oa: v3's ungated target encoding (te.icl) lifts it; v2.x has no
    addition after the boundary (its target is a cell of its own), so the gated attentions
    suffice. Unpatched (``None``) it always changes them (the test can fail)."""
    model = _model(version, task)
    if arm is not None:
        oretrofit.retrofit(model, arm, TAU)
    x, y = _data(task)
    n = y.shape[0]
    tokens = _grid(version, model, x.shape[0])

    def run(x_: torch.Tensor, y_: torch.Tensor, tokens_: torch.Tensor) -> torch.Tensor:
        handle = _with_tokens(model, version, tokens_)
        try:
            return _forward(model, x_, y_, task)
        finally:
            handle.remove()

    ref = run(x, y, tokens)
    out = run(torch.cat([x[:n], x[n - 1:n], x[n:]]), torch.cat([y, y[:1]]),
              _zeros_at(tokens, 1, n))
    if arm is None or (arm == "oa" and version not in V2):
        assert _rel(out, ref) > TOL
    else:
        assert _rel(out, ref) <= TOL


def _appended(x_BRCE: torch.Tensor) -> torch.Tensor:
    return _zeros_at(x_BRCE, 2, x_BRCE.shape[2])


def _with_zero_column(model: torch.nn.Module, version: str):
    """v2.x: a zero cell column (every row, thinking rows too) inserted before the target
    column (the decoder reads the last column) of the grid entering the first block; v3: a
    zero cell-token column appended to those entering the column aggregator (appended: the
    column tokens carry RoPE positions, so one inserted in the middle would move the others'
    positions, a positional change, not a null token)."""
    if version in V2:
        return _first_block_input(model, lambda x: _zeros_at(x, 2, x.shape[2] - 1))
    return model.column_aggregator.register_forward_pre_hook(
        lambda m, args, kwargs: (args, {**kwargs, "x_BRiCE": _appended(kwargs["x_BRiCE"])}),
        with_kwargs=True)


@pytest.mark.parametrize("version,task", CASES)
def test_zero_feature_column_inserted(version, task):
    """A zero feature column at the boundary changes no prediction (full-o); unpatched it
    does."""
    model = _model(version, task)
    oretrofit.retrofit(model, "full-o", TAU)
    x, y = _data(task)
    ref = _forward(model, x, y, task)
    handle = _with_zero_column(model, version)
    try:
        assert _rel(_forward(model, x, y, task), ref) <= TOL
    finally:
        handle.remove()
    base = _model(version, task)
    handle = _with_zero_column(base, version)
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


@pytest.mark.parametrize("version,task", CASES)
def test_each_site_records_the_modules_it_patches(version, task):
    """A spec records each site's modules (class, weight shapes), by which a spec saved under
    another tabpfn release is checked; every site of every version names at least one, and
    every site but a norm without affine weights (v2's) records a weight shape."""
    model = _model(version, task)
    with oretrofit.retrofitted(model, "full-o") as r:
        records = r.spec()["site_modules"]
    assert list(records) == [site.name for site, _ in r.plan.entries]
    named = dict(model.named_modules())
    for name, record in records.items():
        assert record["classes"] and (record["shapes"] or record["kind"] == "norm"), name
        for path, cls in record["classes"].items():            # its class, or one it extends
            assert cls in {c.__name__ for c in type(named[path]).__mro__}, (name, path)


@pytest.mark.parametrize("version", SHIPPED)
def test_learned_receivers_reported(version):
    r = oretrofit.retrofit(_model(version, "regressor"), "oa", 1e-8)
    report = {row["site"]: row["receivers"] for row in r.report()}
    if version == "v2":                            # no thinking rows
        assert not report["blk.0.col"]
        return
    if version in V2:
        assert report["blk.0.col"]["thinking_rows.min"] > 0.999
        return
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


def test_a_refused_row_names_itself(monkeypatch):
    """A row without sites (how the table lists a version the host cannot gate) is refused by
    name, as a model, a checkpoint's architecture and a file name, with the supported
    versions."""
    row = versions.ModelVersion("v4", "tabpfn.architectures.tabpfn_v4", "TabPFNV4", "10.0.0",
                                refusal="its new blocks are not gated", names=("v4",))
    monkeypatch.setattr(versions, "VERSIONS", (*versions.VERSIONS, row))
    fake = type(row.cls, (torch.nn.Module,), {"__module__": row.module})
    listed = r"supported: v2 \(TabPFNV2, tabpfn 8\.1\.0\+\), v2\.5 \(TabPFNV2p5"
    with pytest.raises(RetrofitError, match=r"TabPFNV4 \(TabPFN v4\) is not supported: its new "
                                            r"blocks are not gated; " + listed):
        oretrofit.retrofit(fake(), "oa")
    with pytest.raises(RetrofitError, match=r"TabPFN v4\) is not supported: .*" + listed):
        versions.version_of_checkpoint("tabpfn_v4")
    with pytest.raises(RetrofitError, match=r"reads it as a TabPFN v4 checkpoint"):
        versions.version_from_name("tabpfn-v4-regressor.ckpt")


@pytest.mark.parametrize("name,label", [("tabpfn-v3.5-fast-20260909.safetensors", "v3.5"),
                                        ("tabpfn-v3.5-classifier.ckpt", "v3.5"),
                                        ("tabpfn-v3-regressor-v3_default.ckpt", "v3"),
                                        ("tabpfn-v2.5-regressor-v2.5_default.ckpt", "v2.5"),
                                        ("tabpfn-v2.6-classifier.ckpt", "v2.6"),
                                        ("tabpfn-v2-regressor.ckpt", "v2"), ("model.ckpt", "v2")])
def test_version_from_the_file_name(name, label):
    assert versions.version_from_name(name).label == label


@pytest.mark.parametrize("version", [v for v in SHIPPED if v in V2])
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_v2_kv_cache_keeps_the_presences(version, arm):
    """9.x's explicit KV cache of v2.5/v2.6 under O: the test rows predicted from the cache
    (the train rows' presences in the extra key channel) match the full forward; a cache
    built before the retrofit is refused."""
    model = _model(version, "regressor")
    x, y = _data("regressor")
    if "return_kv_cache" not in inspect.signature(model.forward).parameters:
        # tabpfn 8.x: no KV cache on v2.x, so no path that could carry presences past the gate
        with pytest.raises(TypeError, match="return_kv_cache"):
            model(x, y, performance_options=FULL_PATH, return_kv_cache=True)
        return
    n = y.shape[0]
    with torch.no_grad():
        _, stale = model(x, y, performance_options=FULL_PATH, return_kv_cache=True)
    oretrofit.retrofit(model, arm, TAU)
    full = _forward(model, x, y, "regressor")
    with torch.no_grad():
        _, cache = model(x, y, performance_options=FULL_PATH, return_kv_cache=True)
        cached = model(x[n:], None, performance_options=FULL_PATH, kv_cache=cache,
                       x_is_test_only=True)
        assert _rel(cached, full) <= TOL
        with pytest.raises(RetrofitError, match="built without the train rows' presences"):
            model(x[n:], None, performance_options=FULL_PATH, kv_cache=stale,
                  x_is_test_only=True)
