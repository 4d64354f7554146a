"""The TabPFN v3 host: sites per arm, τ limits, state_dict, revert, chunked paths, errors."""

from __future__ import annotations

import inspect

import pytest
import torch
from tabpfn.architectures import tabpfn_v3 as v3
from tabpfn.architectures.interface import PerformanceOptions

import oretrofit
from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn import releases
from oretrofit.tabpfn import load_checkpoint

FULL_PATH = PerformanceOptions(use_chunkwise_inference=False)


def _data(n: int = 24, m: int = 8, c: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n + m, 1, c, generator=g, dtype=torch.float64)          # (R, B, C)
    return x, x[:n, 0] @ torch.randn(c, generator=g, dtype=torch.float64)


@torch.no_grad()
def _predict(model, options: PerformanceOptions = FULL_PATH) -> torch.Tensor:
    x, y = _data()
    return model(x, y, performance_options=options)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_sites_of_each_arm(fresh_model):
    model = fresh_model()
    cfg = model.config
    oa = oretrofit.plan_retrofit(model, "oa")
    names = [s.name for s, _ in oa.entries]
    expected = ([f"fde.{i}.induce{j}" for i in range(cfg.dist_embed_num_blocks) for j in (1, 2)]
                + [f"col.{k}.attn" for k in range(cfg.feat_agg_num_blocks - 1)] + ["col.cls"]
                + [f"icl.{k}.attn" for k in range(cfg.nlayers)])
    assert names == expected
    full = {s.name: s.kind for s, _ in oretrofit.plan_retrofit(model, "full-o").entries}
    assert {"te.col", "te.icl", "col.out_norm", "icl.out_norm", "icl.0.norm", "icl.0.ffn",
            "fde.0.induce1.ffn", "col.cls.norm"} <= set(full)
    assert full["te.icl"] == "inject" and full["icl.out_norm"] == "norm"
    assert oretrofit.plan_retrofit(model, "base").entries == []


def test_base_is_bit_identical(fresh_model):
    model = fresh_model()
    before = _predict(model)
    r = oretrofit.retrofit(model, "base")
    assert torch.equal(_predict(model), before) and r.plan.entries == []


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_limits(fresh_model, arm):
    model = fresh_model()
    base = _predict(model)
    with oretrofit.retrofitted(model, arm, 1e-12, eps=1e-12):
        assert _rel(_predict(model), base) <= 1e-6
    with oretrofit.retrofitted(model, arm, 1.0):
        assert _rel(_predict(model), base) > 1e-3


def test_state_dict_and_strict_load(fresh_model, small_ckpt):
    model = fresh_model(torch.float32)
    keys = list(model.state_dict())
    oretrofit.retrofit(model, "full-o", 1e-8)
    state = model.state_dict()
    assert list(state) == keys
    reference = load_checkpoint(small_ckpt)["state_dict"]
    assert all(torch.equal(state[k], reference[k]) for k in keys)
    model.load_state_dict(reference, strict=True)
    assert isinstance(model.icl_blocks[0], v3.ICLTransformerBlock)


def test_revert_is_bit_identical_and_clean(fresh_model):
    model = fresh_model()
    before = _predict(model)
    classes = {name: type(m) for name, m in model.named_modules()}
    r = oretrofit.retrofit(model, "full-o", 1.0)
    assert not torch.equal(_predict(model), before)
    r.revert()
    assert torch.equal(_predict(model), before)
    assert {name: type(m) for name, m in model.named_modules()} == classes
    assert all("_oretrofit" not in m.__dict__ and not m._forward_hooks
               for m in model.modules())
    with pytest.raises(RetrofitError, match="already reverted"):
        r.revert()


def test_patched_forward_keeps_the_vendor_signature(fresh_model):
    """tabpfn picks its KV-cache engine from ``forward``'s parameters (return_kv_cache)."""
    model = fresh_model()
    vendor = inspect.signature(model.forward)
    oretrofit.retrofit(model, "full-o", 1e-8)
    assert type(model).__name__ == "OTabPFNV3" and inspect.signature(model.forward) == vendor


def test_chunked_paths_agree(fresh_model):
    """Row chunking (inducing hiddens from column chunks) and memory-saving chunking give the
    unchunked result under full-o, and under base."""
    for arm in ("base", "full-o"):
        model = fresh_model()
        oretrofit.retrofit(model, arm, 0.5)
        full = _predict(model)
        model.inference_chunk_cells, model.inference_col_chunk_size = 5 * 4, 2   # 5-row chunks
        chunked = _predict(model, PerformanceOptions(use_chunkwise_inference=True,
                                                     save_peak_memory_factor=3))
        torch.testing.assert_close(chunked, full, rtol=1e-10, atol=1e-10)


def test_learned_receivers_are_reported(fresh_model):
    model = fresh_model()
    r = oretrofit.retrofit(model, "oa", 1e-8)
    report = {row["site"]: row["receivers"] for row in r.report()}
    assert report["fde.0.induce1"]["inducing_vectors.min"] > 0.999
    assert report["col.cls"]["cls_tokens.mean"] > 0.999
    assert report["icl.0.attn"] == {}
    site = next(s for s, _ in r.plan.entries if s.name == "col.cls")
    p = site.receivers(1.0)["cls_tokens.mean"]
    norms = model.column_aggregator.cls_tokens.detach().square().sum(-1)
    assert p == pytest.approx(float((norms / (1 + norms)).mean()), rel=1e-6)
    # random-init learned receivers are small vectors: at τ = 1 their gate is far from 1
    assert p < 0.1


def test_site_tau_and_targets(fresh_model):
    model = fresh_model()
    r = oretrofit.retrofit(model, "full-o", 1e-8, site_tau={r"re:icl\..*": 1e-6},
                           exclude=["te.*"])
    taus = {row["site"]: row["tau"] for row in r.report()}
    assert taus["icl.0.attn"] == 1e-6 and taus["fde.0.induce1"] == 1e-8
    assert "te.col" not in taus and "te.icl" not in taus


def test_errors_name_the_fix(fresh_model, monkeypatch):
    model = fresh_model()
    with pytest.raises(RetrofitError, match="unknown arm"):
        oretrofit.retrofit(model, "o-everything")
    with pytest.raises(ValueError, match="tau must be a positive"):
        oretrofit.retrofit(model, "oa", 0.0)
    with pytest.raises(RetrofitError, match="targets pattern 'nothing.*' matches no site"):
        oretrofit.retrofit(model, "oa", targets=["nothing.*"])
    with pytest.raises(RetrofitError, match="no site matched for arm 'oa'"):
        oretrofit.retrofit(model, "oa", targets=["te.*"])          # a site, but no oa site
    r = oretrofit.retrofit(model, "oa")
    with pytest.raises(RetrofitError, match="already retrofitted"):
        oretrofit.retrofit(model, "full-o")
    r.revert()
    for untested in ("7.0.0", "8.0.0", "9.3.0", "9.2.0.dev1"):
        monkeypatch.setattr(releases, "installed_version", lambda v=untested: v)
        with pytest.raises(RetrofitError, match=rf"tabpfn {untested} is (not supported|older).*"
                                                r"8\.0\.1 to 9\.2\.0.*pip install "
                                                r"'tabpfn>=8\.[01]\.[01],<=9\.2\.0'"):
            oretrofit.retrofit(model, "oa")
    assert "_oretrofit" not in model.icl_blocks[0].__dict__       # nothing half-patched
    monkeypatch.undo()
    later = type("TabPFNV4", (torch.nn.Module,), {"__module__": "tabpfn.architectures.tabpfn_v4"})
    with pytest.raises(RetrofitError, match=r"tabpfn_v4.TabPFNV4 is not supported: .*later "
                                            r"tabpfn.*supported: v2 \(TabPFNV2,.*v2\.5 \(TabPFNV2p5.*v3 "
                                            r"\(TabPFNV3.*v3\.5 \(TabPFNV3p5"):
        oretrofit.retrofit(later(), "oa")


def test_unpatched_icl_attention_keeps_the_callers_arguments(fresh_model):
    """A block whose FFN alone is patched calls the vendor attention exactly as tabpfn does
    (8.0.1 passes ``attention_backend``; later releases pass nothing extra)."""
    model = fresh_model()
    calls: list[dict] = []
    attention = model.icl_blocks[0].icl_attention
    forward = attention.forward
    attention.forward = lambda *a, **k: (calls.append(k), forward(*a, **k))[1]
    base = _predict(model)
    vendor_kwargs = dict(calls[0])
    calls.clear()
    with oretrofit.retrofitted(model, "full-o", 1e-12, eps=1e-12, targets=["icl.*.ffn"]):
        assert _rel(_predict(model), base) <= 1e-6
    assert calls == [vendor_kwargs]
