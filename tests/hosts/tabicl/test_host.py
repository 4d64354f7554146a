"""The TabICL host: ``oretrofit.retrofit`` finds it for the vendor's class, τ → 0 reproduces
the unpatched forward (plain, KV cache and representation cache, many classes), ``revert`` is
bit-identical, and what it cannot retrofit exactly is refused by name."""

from __future__ import annotations

import pickle

import pytest
import torch

import oretrofit
from oretrofit import RetrofitError

from .conftest import table

TASKS = ("classifier", "regressor")


def _names(model: torch.nn.Module) -> list[str]:
    return [site.name for site, _ in oretrofit.plan_retrofit(model, "full-o").entries]


def test_every_attention_norm_ffn_and_target_embedding_is_a_site(tiny):
    names = _names(tiny())
    assert names[0] == "te.col" and "te.icl" in names
    for stage in ("col.0.induce1", "col.0.induce2", "row.0", "row.cls", "icl.0", "icl.1"):
        attention = stage if stage.startswith(("col", "row.cls")) else f"{stage}.attn"
        assert {attention, f"{stage}.norm", f"{stage}.ffn"} <= set(names), stage
    assert {"row.out_norm", "icl.out_norm"} <= set(names)
    assert len(names) == 22
    oa = [site.name for site, _ in oretrofit.plan_retrofit(tiny(), "oa").entries]
    assert oa == ["col.0.induce1", "col.0.induce2", "row.0.attn", "row.cls", "icl.0.attn",
                  "icl.1.attn"]


def test_a_model_that_is_not_target_aware_has_no_column_target_site(tiny):
    assert "te.col" not in _names(tiny(col_target_aware=False))


def _before_and_after(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, fp32,
                      arm: str = "full-o") -> tuple[torch.Tensor, torch.Tensor, oretrofit.Retrofit]:
    """The forward unpatched, then retrofitted with ``arm`` at τ = 1e-8, and the retrofit."""
    with torch.no_grad():
        reference = model(x, y, inference_config=fp32)
        r = oretrofit.retrofit(model, arm, tau=1e-8)
        return reference, model(x, y, inference_config=fp32), r


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_to_zero_is_the_unpatched_forward_and_revert_is_bit_identical(tiny, fp32, task, arm):
    model = tiny(task)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = table(task)
    reference, patched, r = _before_and_after(model, x, y, fp32, arm)
    r.revert()
    with torch.no_grad():
        back = model(x, y, inference_config=fp32)
    assert r.plan.host == "tabicl"
    assert (patched - reference).abs().max() < 1e-5
    assert not torch.equal(patched, reference)             # the O path did run
    assert torch.equal(back, reference)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(type(m).__module__.startswith(("tabicl", "torch")) for m in model.modules())


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("mode", ["kv", "repr"])
def test_the_caches_built_under_o_reproduce_the_forward(tiny, fp32, task, mode):
    model = tiny(task)
    x, y = table(task)
    with torch.no_grad():
        reference = model(x, y, inference_config=fp32)
        model.forward_with_cache(x[:, :8], y, store_cache=True, cache_mode=mode,
                                 inference_config=fp32)
        oretrofit.retrofit(model, "full-o", tau=1e-8)
        with pytest.raises(RetrofitError, match="KV cache was built without the sources' "
                                                "presences .*fit again after retrofitting"):
            model.forward_with_cache(X_test=x[:, 8:], use_cache=True, store_cache=False,
                                     cache_mode=mode, inference_config=fp32)
        model.forward_with_cache(x[:, :8], y, store_cache=True, cache_mode=mode,
                                 inference_config=fp32)
        cached = model.forward_with_cache(X_test=x[:, 8:], use_cache=True, store_cache=False,
                                          cache_mode=mode, inference_config=fp32)
    assert (cached - reference).abs().max() < 1e-5


def test_many_classes_mixed_radix_and_hierarchical_keep_the_forward(tiny, fp32):
    model = tiny(max_classes=3)
    x = torch.randn(1, 20, 5, generator=torch.Generator().manual_seed(1))
    y = (torch.arange(14) % 7).float()[None]
    reference, patched, _ = _before_and_after(model, x, y, fp32)
    assert reference.shape == (1, 6, 7)
    assert (patched - reference).abs().max() < 1e-5


@pytest.mark.parametrize("ssmax", ["ssmax", "ssmax-mlp", "qassmax-mlp", "none"])
def test_every_scalable_softmax_keeps_the_forward(tiny, fp32, ssmax):
    reference, patched, _ = _before_and_after(tiny(col_ssmax=ssmax, icl_ssmax=ssmax),
                                              *table("classifier"), fp32)
    assert (patched - reference).abs().max() < 1e-5


def test_a_large_tau_silences_a_gated_target_embedding(tiny, fp32):
    """OInject really gates: with τ far above ‖h‖² the train rows' target embeddings vanish,
    so the forward no longer depends on the train labels."""
    model = tiny()
    x, y = table("classifier")
    oretrofit.retrofit(model, "full-o", tau=1e-8, site_tau={"te.col": 1e12, "te.icl": 1e12})
    with torch.no_grad():
        a = model(x, y, inference_config=fp32)
        b = model(x, y.flip(-1), inference_config=fp32)
    assert torch.equal(a, b)


@pytest.mark.parametrize(("config", "refusal"), [
    ({"norm_first": False}, r"post-norm blocks \(norm_first=False\)"),
    ({"col_affine": True}, r"affine column embedding \(col_affine=True\)")])
def test_what_the_host_cannot_retrofit_exactly_is_refused_by_name(tiny, config, refusal):
    with pytest.raises(RetrofitError, match=refusal):
        oretrofit.retrofit(tiny(**config), "full-o")


def test_a_masked_call_is_refused_under_o(tiny):
    model = tiny()
    oretrofit.retrofit(model, "oa", tau=1e-8)
    block = model.row_interactor.tf_row.blocks[0]
    x = torch.randn(2, 4, 16)
    with pytest.raises(RetrofitError, match="takes no masks: pad with zero vectors"):
        block(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))


def test_a_retrofitted_model_pickles_as_itself(tiny, fp32):
    model = tiny()
    x, y = table("classifier")
    _, patched, _ = _before_and_after(model, x, y, fp32)
    copy = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        assert torch.equal(copy(x, y, inference_config=fp32), patched)
        oretrofit.Retrofit.of(copy).revert()
        assert not torch.equal(copy(x, y, inference_config=fp32), patched)
        assert torch.equal(model(x, y, inference_config=fp32), patched)
