"""The softmax route (oretrofit/hosts/transformers/softmax_route.py): OAttention inside attention
modules that compute their weights themselves. The contracts on every architecture of
``zoo.SOFTMAX_ROUTE`` run in test_architectures.py (it is part of ``zoo.ARCHITECTURES``); here:
the formula, what the route refuses, the KV cache, batch layout, train mode and strict loads."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from oretrofit import RetrofitError, retrofitted  # noqa: E402
from oretrofit._operators.attention import o_attention_reference  # noqa: E402
from oretrofit._surgery.patching import SiteConfig  # noqa: E402
from oretrofit.hosts.transformers.contracts import agreement  # noqa: E402
from oretrofit.hosts.transformers import host  # noqa: E402
from oretrofit.hosts.transformers.softmax_route import (SoftmaxCarrier, _SoftmaxSwap,  # noqa: E402
                                                        presence_softmax)
from hosts.transformers import zoo  # noqa: E402


def _arch(name: str) -> zoo.Architecture:
    return next(a for a in zoo.ARCHITECTURES + zoo.REFUSED_ON_CALL if a.name == name)


def _presences(b: int, n: int, seed: int, nulls: tuple[int, ...] = ()) -> torch.Tensor:
    p = torch.rand(b, n, generator=torch.Generator().manual_seed(seed)) * 0.9 + 0.05
    p[:, list(nulls)] = 0.0
    return p


def _swap(p_q: torch.Tensor, p_k: torch.Tensor, eps: float = 1e-6) -> _SoftmaxSwap:
    state = SoftmaxCarrier(SiteConfig(1.0, eps), site="test.attn")
    state.query, state.keys = p_q, p_k
    return _SoftmaxSwap("test.attn (Eager)", state)


def _qkv(b: int = 2, h: int = 3, n: int = 5, d: int = 4) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3))


def test_presence_softmax_is_o_attention_and_totalises_empty_rows() -> None:
    q, k, v = _qkv()
    p_q, p_k = _presences(2, 5, 0, nulls=(3,)).double(), _presences(2, 5, 1, nulls=(1,)).double()
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~causal, float("-inf"))
    w = presence_softmax(scores, p_q, p_k, eps=1e-3)
    reference, _ = o_attention_reference(q, k, v, p_q, p_k, mask=causal, eps=1e-3)
    assert torch.allclose(w @ v, reference, rtol=0, atol=1e-12)
    assert (w[:, :, 3] == 0).all() and (w[..., 1] == 0).all()     # null receiver, null source
    assert (presence_softmax(torch.full((1, 2, 4), float("-inf")), torch.ones(1, 2),
                             torch.ones(1, 4), 1e-6) == 0).all()
    # batch-major flattened scores (B·H, Nq, Nk), as XGLM's and FSMT's, place the same presences
    flat = presence_softmax(scores.reshape(6, 5, 5), p_q, p_k, eps=1e-3)
    assert torch.equal(flat, w.reshape(6, 5, 5))


def test_eager_code_under_the_swap_is_o_attention_with_dropout_on_its_weights() -> None:
    q, k, v = _qkv()
    p_q, p_k = _presences(2, 5, 2).double(), _presences(2, 5, 3, nulls=(0,)).double()
    head_mask = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)[None, :, None, None]

    def eager(training: bool) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2)) * 0.5
        w = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        w = F.dropout(w, p=0.3, training=training) * head_mask
        return torch.matmul(w, v)

    with _swap(p_q, p_k) as swap:
        out = eager(training=False)
    assert swap.softmaxes == 1
    torch.manual_seed(0)
    with _swap(p_q, p_k):
        dropped = eager(training=True)
    reference, _ = o_attention_reference(q, k, v, p_q, p_k, eps=1e-6, scale=0.5)
    assert torch.allclose(out, reference * head_mask, atol=1e-6)
    torch.manual_seed(0)
    w = F.dropout(presence_softmax(q @ k.transpose(-1, -2) * 0.5, p_q, p_k, 1e-6,
                                   torch.float32).double(), p=0.3, training=True)
    assert torch.allclose(dropped, (w * head_mask) @ v, atol=1e-6)


def _scores() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, _ = _qkv()
    return q @ k.transpose(-1, -2), _presences(2, 5, 4).double(), _presences(2, 5, 5).double()


@pytest.mark.parametrize("code, why", [
    (lambda s: (F.softmax(s, -1), torch.softmax(s, -1)), "more than once"),
    (lambda s: F.softmax(s, dim=-2), "axis -2"),
    (lambda s: F.softmax(s[..., :3], dim=-1), "not its 5 receivers and 5 sources"),
    (lambda s: (lambda w: w / w.sum(-1, keepdim=True))(s.softmax(-1)), "weights to sum"),
    (lambda s: torch.log_softmax(s, -1), "log-softmax"),
    (lambda s: F.linear(F.softmax(s, -1).transpose(1, -1), torch.eye(3, dtype=s.dtype)),
     "weights to linear"),                                  # a projection across heads
    (lambda s: torch.matmul(s, F.softmax(s, -1)), "weights to matmul"),   # weights on the right
    (lambda s: F.softmax(s, -1).masked_fill(s > 0, 1.0), "weights to masked_fill"),
    (lambda s: F.scaled_dot_product_attention(s, s, s), "fused attention kernel"),
])
def test_what_the_swap_cannot_honour_is_refused_by_name(code, why: str) -> None:  # noqa: ANN001
    scores, p_q, p_k = _scores()
    with pytest.raises(RetrofitError, match=why) as error, _swap(p_q, p_k):
        code(scores)
    assert "test.attn (Eager)" in str(error.value) and "exclude=" in str(error.value)


def test_a_packed_residual_stream_without_a_batch_axis_is_refused_by_name() -> None:
    """Presences captured from a (tokens, hidden) stream (packed sequences) have no batch axis
    to place on the scores: refused as on the interface route, not an unpacking error."""
    scores, p_q, p_k = _scores()
    with pytest.raises(RetrofitError, match=r"test.attn \(Eager\) runs on a residual stream "
                                            r"without a batch axis \(1-D presences"), \
            _swap(p_q[0], p_k[0]):
        F.softmax(scores[0], dim=-1)


def test_a_module_with_two_softmaxes_is_refused_at_its_first_call(monkeypatch) -> None:
    model = zoo.build(_arch("XGLM"))
    attention = model.layers[0].self_attn
    original = type(attention)

    class TwoSoftmaxAttention(original):
        def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            out = super().forward(*args, **kwargs)
            torch.softmax(out[0], dim=-1)
            return out

    attention.__class__ = TwoSoftmaxAttention
    # as transformers' own code would (a user's subclass goes through the self-check first)
    monkeypatch.setattr(host, "overrides", lambda model: [])
    inputs = zoo.example_inputs(model)
    with retrofitted(model, "full-o", 1e-6):
        with pytest.raises(RetrofitError, match=r"layers\.0\.self_attn \(TwoSoftmaxAttention\) "
                                                r"calls softmax more than once"):
            model(**inputs)
    assert type(attention) is TwoSoftmaxAttention


@pytest.mark.parametrize("arch", zoo.REFUSED_ON_CALL, ids=[a.name for a in zoo.REFUSED_ON_CALL])
def test_non_dense_attention_is_refused_at_the_first_call(arch: zoo.Architecture) -> None:
    if zoo.expectation(arch) != "covered":             # Falcon before the softmax route's release
        return zoo.assert_refused_in_this_release(arch)
    model = zoo.build(arch)
    inputs = zoo.example_inputs(model)
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        with retrofitted(model, "full-o", 1e-6):
            with pytest.raises(RetrofitError, match="softmax route cannot make it OAttention"):
                model(**inputs)
        assert torch.equal(model(**inputs).last_hidden_state, reference)


def test_block_sparse_bigbird_is_refused_where_it_runs_block_sparse() -> None:
    arch = zoo.Architecture("BigBird (block sparse)", "big_bird", "encoder-only",
                            dict(attention_type="block_sparse", block_size=2, num_random_blocks=1,
                                 max_position_embeddings=64))
    model = zoo.build(arch)
    inputs = zoo.example_inputs(model, tokens=32)
    with retrofitted(model, "full-o", 1e-6), torch.no_grad():
        with pytest.raises(RetrofitError, match=r"BigBirdBlockSparseAttention|more than once"):
            model(**inputs)


def _xglm() -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import AutoConfig, AutoModelForCausalLM
    arch = _arch("XGLM")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(arch.model_type, **{**zoo._COMMON, **arch.config})).eval()
    ids = torch.randint(3, 99, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, ids


@torch.no_grad()
def test_kv_cached_keys_keep_their_presences() -> None:
    """τ = 1: presences well inside (0, 1); two cached steps equal one full pass."""
    model, ids = _xglm()
    with retrofitted(model, "full-o", 1.0, eps=1e-3):
        full = model(ids).logits[:, -2:]
        step = model(ids[:, :6], use_cache=True)
        cache = step.past_key_values
        first = model(ids[:, 6:7], past_key_values=cache, use_cache=True).logits
        second = model(ids[:, 7:], past_key_values=cache, use_cache=True).logits
    assert torch.allclose(torch.cat([first, second], dim=1), full, atol=1e-5)
    stale = model(ids[:, :6], use_cache=True).past_key_values             # filled unpatched
    with retrofitted(model, "full-o", 1.0), pytest.raises(RetrofitError, match="KV cache"):
        model(ids[:, 6:7], past_key_values=stale, use_cache=True)


@torch.no_grad()
def test_generation_with_the_cache_is_unchanged_at_tau_to_zero() -> None:
    model, ids = _xglm()
    reference = model.generate(ids[:, :5], max_new_tokens=6, do_sample=False)
    for arm in ("oa", "full-o"):
        with retrofitted(model, arm, 1e-12, eps=1e-12):
            assert torch.equal(model.generate(ids[:, :5], max_new_tokens=6, do_sample=False),
                               reference)


@pytest.mark.parametrize("name", ["XGLM", "BLOOM (ALiBi)", "Megatron-BERT"])
@torch.no_grad()
def test_batch_rows_get_their_own_presences(name: str) -> None:
    """τ = 1 and one row with zero tokens: each row of a batch equals the row alone, so the
    presences land on their batch row ((B·H, N, N) scores for XGLM, (B, H, N, N) else)."""
    model = zoo.build(_arch(name))
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(0))
    embeds = model.get_input_embeddings()(ids)
    embeds[0, 2:4] = 0.0
    ones = torch.ones(2, 6, dtype=torch.long)
    with retrofitted(model, "full-o", 1.0, eps=1e-3):
        batch = model(inputs_embeds=embeds, attention_mask=ones).last_hidden_state
        for row in range(2):
            alone = model(inputs_embeds=embeds[row:row + 1],
                          attention_mask=ones[:1]).last_hidden_state
            assert torch.allclose(batch[row], alone[0], atol=1e-5)
        assert batch[0, 2:4].abs().max() == 0


def test_train_mode_dropout_is_the_hosts_and_agrees_at_tau_to_zero() -> None:
    """Attention dropout 0.5 in train(): the same random draws as the unpatched model, finite
    gradients equal to the base model's."""
    arch = zoo.Architecture("Megatron-BERT (dropout)", "megatron-bert", "encoder-only",
                            dict(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0))
    model = zoo.build(arch).train()
    inputs = zoo.example_inputs(model)

    def run(seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(seed)
        out = model(**inputs).last_hidden_state
        out.square().mean().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    out, grads = run()
    with retrofitted(model, "full-o", 1e-12, eps=1e-12):
        o_out, o_grads = run()
        assert not torch.allclose(run(seed=1)[0], o_out, atol=1e-3)      # the dropout is live
    assert ((o_out - out).abs().max() / out.abs().max()) <= 1e-4
    scale = max(g.abs().max() for g in grads)                # relative to the largest gradient
    for g, o in zip(grads, o_grads, strict=True):
        assert torch.isfinite(o).all() and (o - g).abs().max() <= 1e-4 * scale


@torch.no_grad()
def test_output_attentions_returns_the_o_weights() -> None:
    model = zoo.build(_arch("Megatron-BERT"))
    ids = torch.randint(3, 99, (1, 6), generator=torch.Generator().manual_seed(0))
    embeds = model.get_input_embeddings()(ids)
    embeds[0, 2] = 0.0
    base = model(input_ids=ids, output_attentions=True).attentions
    with retrofitted(model, "full-o", 1e-12, eps=1e-12):
        same = model(input_ids=ids, output_attentions=True).attentions
        nulled = model(inputs_embeds=embeds, output_attentions=True).attentions
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(same, base, strict=True))
    assert all((w[..., 2, :] == 0).all() and (w[..., 2] == 0).all() for w in nulled)


@pytest.mark.parametrize("arch", zoo.SOFTMAX_ROUTE[:4], ids=[a.name for a in zoo.SOFTMAX_ROUTE[:4]])
def test_state_dict_loads_strictly_both_ways(arch: zoo.Architecture) -> None:
    model, fresh = zoo.build(arch), zoo.build(arch, seed=1)
    with retrofitted(model, "full-o", 1e-6):
        fresh.load_state_dict(model.state_dict(), strict=True)
        model.load_state_dict(zoo.build(arch, seed=2).state_dict(), strict=True)
    assert agreement(fresh, zoo.example_inputs(fresh), "full-o")["relative_max_diff"] <= 1e-4
