"""O-closure law on the TabPFN v3 host: a zero-carrier token appended (or inserted) at a patched
boundary leaves every old output unchanged and receives exactly 0 (fp64, τ = 0.5 so presences
are far from 1). Each law is also shown to fail on the unpatched block, so the test can fail."""

from __future__ import annotations

import pytest
import torch
from tabpfn.architectures.interface import PerformanceOptions

import oretrofit
from oretrofit.hosts.tabpfn import v3_blocks

TAU, TOL = 0.5, 1e-11
FULL_PATH = PerformanceOptions(use_chunkwise_inference=False)


def _zeros_at(x: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    """``x`` with one zero slice inserted at ``index`` along ``dim``."""
    shape = list(x.shape)
    shape[dim] = 1
    head, tail = x.narrow(dim, 0, index), x.narrow(dim, index, x.shape[dim] - index)
    return torch.cat([head, x.new_zeros(shape), tail], dim=dim)


def _drop(x: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    keep = [i for i in range(x.shape[dim]) if i != index]
    return x.index_select(dim, torch.tensor(keep))


def _assert_closed(before: torch.Tensor, after: torch.Tensor, dim: int, index: int) -> None:
    torch.testing.assert_close(_drop(after, dim, index), before, rtol=0, atol=TOL)
    assert torch.equal(after.select(dim, index), torch.zeros_like(after.select(dim, index)))


@pytest.fixture(autouse=True)
def _inference():
    with torch.no_grad():          # the host's memory-saving chunking writes in place
        yield


@pytest.fixture
def patched(fresh_model):
    model = fresh_model()
    oretrofit.retrofit(model, "full-o", TAU)
    return model


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("which", ["cross_attn_block1", "cross_attn_block2"])
def test_fde_cross_attention_block_sources_and_receivers(patched, fresh_model, which):
    layer = patched.feature_distribution_embedder.layers[0]
    block = getattr(layer, which)
    n_ind, e = layer.inducing_vectors.shape
    receivers = layer.inducing_vectors.unsqueeze(0).expand(3, -1, -1)        # (Bc, I, E)
    context = _rand(3, 7, e)
    out = block(receivers, context)
    # A null source (appended or inserted) is inert, the scaling MLP reads the presence mass.
    for index in (7, 2):
        torch.testing.assert_close(block(receivers, _zeros_at(context, 1, index)), out,
                                   rtol=0, atol=TOL)
    _assert_closed(out, block(_zeros_at(receivers, 1, n_ind), context), 1, n_ind)
    base_block = getattr(fresh_model().feature_distribution_embedder.layers[0], which)
    assert not torch.allclose(base_block(receivers, _zeros_at(context, 1, 7)),
                              base_block(receivers, context), atol=1e-6)


def test_softmax_scaling_count_would_break_insertion(patched, monkeypatch):
    """The insertion law catches a scaling MLP that reads the key count instead of Σ p_j."""
    block = patched.feature_distribution_embedder.layers[0].cross_attn_block1
    receivers = patched.feature_distribution_embedder.layers[0].inducing_vectors[None]
    context = _rand(1, 6, receivers.shape[-1])
    real, count = v3_blocks._mass_scaled_queries, {}
    monkeypatch.setattr(v3_blocks, "_mass_scaled_queries",
                        lambda s, q, mass: real(s, q, torch.full_like(mass, count["n"])))
    count["n"] = 6.0
    before = block(receivers, context)
    count["n"] = 7.0
    assert not torch.allclose(block(receivers, _zeros_at(context, 1, 6)), before, atol=1e-6)


def test_induced_self_attention_block_zero_row(patched):
    layer = patched.feature_distribution_embedder.layers[1]
    x = _rand(1, 9, 3, layer.inducing_vectors.shape[1])                     # (B, R, C, E)
    out, _ = layer(x, single_eval_pos=6)
    _assert_closed(out, layer(_zeros_at(x, 1, 6), single_eval_pos=7)[0], 1, 6)   # train row
    _assert_closed(out, layer(_zeros_at(x, 1, 9), single_eval_pos=6)[0], 1, 9)   # test row


def test_column_block_self_attention_and_cls_readout(patched, fresh_model):
    col = patched.column_aggregator
    first, last = col.blocks[0], col.blocks[-1]
    x = _rand(1, 4, 6, col.embed_dim)                                        # (B, R, S, E)
    _assert_closed(first(x, rope=col.rope), first(_zeros_at(x, 2, 6), rope=col.rope), 2, 6)
    cls, context = x[:, :, :2], x
    out = last.forward_cross(cls, context, col.rope)
    torch.testing.assert_close(last.forward_cross(cls, _zeros_at(context, 2, 6), col.rope), out,
                               rtol=0, atol=TOL)
    _assert_closed(out, last.forward_cross(_zeros_at(cls, 2, 2), context, col.rope), 2, 2)
    base = fresh_model().column_aggregator
    assert not torch.allclose(base.blocks[0](_zeros_at(x, 2, 6), rope=base.rope)[:, :, :6],
                              base.blocks[0](x, rope=base.rope), atol=1e-6)


def test_column_aggregator_zero_column(patched):
    col = patched.column_aggregator
    x = _rand(1, 5, 4, col.embed_dim)                                        # (B, R, C, E)
    torch.testing.assert_close(col(_zeros_at(x, 2, 4)), col(x), rtol=0, atol=TOL)


@pytest.mark.parametrize("memory_factor", [None, 2])
def test_icl_block_zero_train_and_test_rows(patched, fresh_model, memory_factor):
    block = patched.icl_blocks[0]
    x = _rand(2, 10, patched.icl_emsize)                                     # (B, R, D)
    out, _ = block(x.clone(), 7, memory_factor)
    _assert_closed(out, block(_zeros_at(x, 1, 7), 8, memory_factor)[0], 1, 7)
    _assert_closed(out, block(_zeros_at(x, 1, 3), 8, memory_factor)[0], 1, 3)
    _assert_closed(out, block(_zeros_at(x, 1, 10), 7, memory_factor)[0], 1, 10)
    base = fresh_model().icl_blocks[0]
    assert not torch.allclose(base(_zeros_at(x, 1, 7), 8)[0][:, :7], base(x, 7)[0][:, :7],
                              atol=1e-6)


def test_icl_block_with_fewer_test_kv_heads(small_ckpt):
    """The test-rows GQA/MQA branch (``icl_num_kv_heads_test``) keeps the law too."""
    from tabpfn.architectures import tabpfn_v3 as v3

    from oretrofit.tabpfn import load_checkpoint
    config, _ = v3.parse_config({**load_checkpoint(small_ckpt)["config"],
                                 "icl_num_kv_heads_test": 1})
    model = v3.get_architecture(config).double().eval()
    oretrofit.retrofit(model, "oa", TAU)
    block = model.icl_blocks[0]
    x = _rand(1, 9, model.icl_emsize)
    out, _ = block(x, 6)
    _assert_closed(out, block(_zeros_at(x, 1, 6), 7)[0], 1, 6)
    _assert_closed(out, block(_zeros_at(x, 1, 9), 6)[0], 1, 9)


def _forward_with_rows(model, x, y, rows):
    """Whole forward with the stage-2 row tokens replaced by ``rows`` (B, R, Cl, E)."""
    handle = model.column_aggregator.register_forward_hook(lambda m, i, o: rows.clone())
    try:
        return model(x, y, only_return_standard_out=False, performance_options=FULL_PATH)
    finally:
        handle.remove()


@pytest.mark.parametrize("arm", ["full-o", "oa"])
def test_whole_forward_zero_row_at_icl_stage(fresh_model, arm):
    """te.icl + every ICL block + output_norm through TabPFNV3.forward: a zero row token
    inserted as a train row changes no test output and comes out exactly 0 (full-o). Under
    oa the ungated target encoding lifts it, so the law needs full-o."""
    model = fresh_model()
    oretrofit.retrofit(model, arm, TAU)
    n, m, c = 8, 4, 3
    x, y = _rand(n + m, 1, c), _rand(n)
    rows = _rand(1, n + m, model.column_aggregator.num_cls_tokens, model.emsize)
    ref = _forward_with_rows(model, x, y, rows)
    x_ins = torch.cat([x[:n], x[n - 1:n], x[n:]])
    y_ins = torch.cat([y, y.new_tensor([3.0])])
    out = _forward_with_rows(model, x_ins, y_ins, _zeros_at(rows, 1, n))
    if arm == "oa":
        assert not torch.allclose(out["standard"], ref["standard"], atol=1e-6)
        return
    torch.testing.assert_close(out["standard"], ref["standard"], rtol=0, atol=TOL)
    _assert_closed(ref["train_embeddings"], out["train_embeddings"], 0, n)
    # a zero test row gets a zero row embedding (the decoder's bias is a per-row read-out)
    x_test = torch.cat([x, x[-1:]])
    out = _forward_with_rows(model, x_test, y, _zeros_at(rows, 1, n + m))
    _assert_closed(ref["test_embeddings"], out["test_embeddings"], 0, m)
