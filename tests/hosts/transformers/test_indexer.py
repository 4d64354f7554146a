"""Top-k sparse attention (DeepSeek sparse attention's indexer) in the O form
(oretrofit/hosts/transformers/indexer.py), on tiny models whose indexer keeps 3 keys of up to 9,
so the top-k really drops live keys (the census' default configs keep 2048, which selects
nothing at 7 tokens); and the variants the host refuses."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from oretrofit import RetrofitError, retrofitted  # noqa: E402
from oretrofit._surgery.registry import plan_retrofit  # noqa: E402
from oretrofit.hosts.transformers import interface_route as attention_module  # noqa: E402
from oretrofit.hosts.transformers import indexer  # noqa: E402
from oretrofit.hosts.transformers.contracts import (agreement, hidden_states,  # noqa: E402
                                                    null_insertion, relative_max_diff,
                                                    strict_load)
from hosts.transformers import zoo  # noqa: E402

K = 3
_DSA = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
            v_head_dim=8, head_dim=8, num_key_value_heads=4, n_group=1, topk_group=1,
            index_topk=K, index_n_heads=4, index_head_dim=8)
DSA = ["deepseek_v32", "glm_moe_dsa", "axk2", "mistral_large4_text"]


def _arch(model_type: str, **config: object) -> zoo.Architecture:
    return zoo.Architecture(model_type, model_type, "MoE", {**_DSA, **config})


def _build(model_type: str, **config: object) -> torch.nn.Module:
    return zoo.build(_arch(model_type, **config))


# Before the release the indexer was measured on, test_covered_from_the_measured_release checks
# the refusal instead.
covered_here = pytest.mark.skipif(zoo.expectation(_arch("deepseek_v32")) != "covered",
                                  reason="DSA models are covered from transformers 5.24.0")


@pytest.mark.parametrize("model_type", DSA)
def test_covered_from_the_measured_release(model_type: str) -> None:
    if zoo.expectation(_arch(model_type)) != "covered":
        zoo.assert_refused_in_this_release(_arch(model_type))
        return
    assert plan_retrofit(_build(model_type), "full-o").entries


@pytest.fixture
def spy_selection(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(mask, indices)`` of every call that reaches the attention function with top-k
    indices."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    fold = attention_module.selected_keys

    def spy(mask, indices, *args):
        calls.append((mask, indices))
        return fold(mask, indices, *args)
    monkeypatch.setattr(attention_module, "selected_keys", spy)
    return calls


@covered_here
@pytest.mark.parametrize("model_type", DSA)
def test_every_contract_holds_while_the_top_k_drops_live_keys(
        model_type: str, spy_selection: list) -> None:
    model = _build(model_type)
    inputs = zoo.example_inputs(model)
    for arm in ("oa", "full-o"):
        result = agreement(model, inputs, arm, tau=1e-12, eps=1e-30)
        assert result["relative_max_diff"] <= 1e-4, (arm, result)
        assert result["revert_bit_identical"] and result["state_dict_keys_unchanged"]
    # the indices reached the attention function, and they dropped visible keys
    assert spy_selection
    mask, indices = spy_selection[-1]
    assert indices.shape[-1] == K and (mask.sum(-1) > K).any()
    unpatched = null_insertion(model, inputs)
    with retrofitted(model, "full-o", 1e-6):
        result = null_insertion(model, inputs)
    assert result["where"] == "middle" and result["inserted_max_abs"] == 0
    assert result["old_max_delta"] <= 1e-4, result
    assert unpatched["old_max_delta"] > 1e-2           # the host's nulls move old tokens
    assert strict_load(model, "full-o")


@covered_here
def test_a_null_key_ranked_by_its_score_alone_displaces_a_live_key(
        monkeypatch: pytest.MonkeyPatch, spy_selection: list) -> None:
    """The null's index key is the indexer's k_norm bias, not 0: ranked by s_ij (the host's
    topk) it takes a live key's place and moves old outputs; by s_ij + log p_j it never does."""
    model = _build("deepseek_v32")
    inputs = zoo.example_inputs(model)
    with retrofitted(model, "full-o", 1e-6):
        exact = null_insertion(model, inputs)
        spy_selection.clear()
        monkeypatch.setattr(indexer, "o_top_k",
                            lambda scores, p, k, sorted=True: torch.topk(scores, k, sorted=sorted))
        moved = null_insertion(model, inputs)
    assert exact["old_max_delta"] <= 1e-4
    assert moved["old_max_delta"] > 1e-2, moved
    # null_insertion puts 2 nulls at 3 and 4 of 9: a later old query, with at least 3 live keys
    # visible, chose one in some layer
    chosen = torch.cat([i[0, 5:] for _, i in spy_selection if i.shape[1] == 9])
    assert ((chosen == 3) | (chosen == 4)).any()


def test_o_top_k_is_the_hosts_top_k_over_the_live_keys_ties_included() -> None:
    row = torch.tensor([0., 1., 0., 0., 2., 0., 0., 0.])      # ties: topk's own order decides
    host = torch.topk(row[None, None], 4)
    with_nulls = torch.cat([row[:2], torch.tensor([5., 5.]), row[2:]])[None, None]
    p = torch.ones(1, 10)
    p[0, 2:4] = 0
    live = torch.tensor([0, 1, 4, 5, 6, 7, 8, 9])
    chosen = indexer.o_top_k(with_nulls, p, 4)
    assert torch.equal(chosen.indices, live[host.indices])
    # more places than live keys: all live ones, then nulls (no mass in OAttention)
    few = indexer.o_top_k(with_nulls[..., :5], p[:, :5], 4)
    assert sorted(few.indices[0, 0, :3].tolist()) == [0, 1, 4]
    assert set(few.indices[0, 0, 3:].tolist()) <= {2, 3}
    # without nulls it is the host's call
    assert torch.equal(indexer.o_top_k(row[None, None], torch.ones(1, 8), 4).indices,
                       host.indices)


@covered_here
def test_an_excluded_attention_attends_only_to_its_top_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module left unpatched runs the implementation the config had, which ignores
    ``indices``: the attention function folds them into its mask first."""
    model = _build("deepseek_v32")
    inputs = zoo.example_inputs(model)
    call = lambda: model(**inputs)                                             # noqa: E731
    reference = hidden_states(model, call)
    with retrofitted(model, "oa", 1e-12, eps=1e-30, exclude=["layers.0.self_attn"]):
        folded = hidden_states(model, call)
        monkeypatch.setattr(attention_module, "selected_keys", lambda mask, *args: mask)
        dense = hidden_states(model, call)
    assert relative_max_diff(folded, reference) <= 1e-4
    assert relative_max_diff(dense, reference) > 1e-2


@covered_here
@torch.no_grad()
def test_decoding_ranks_cached_keys_by_their_presences() -> None:
    """A prompt's null tokens stay out of the top-k of every later query: their presences are
    kept next to the KV cache, which also holds the indexer's keys."""
    model = _build("deepseek_v32")
    embed = model.get_input_embeddings()
    ids = zoo.example_inputs(model)["input_ids"][:1]
    prompt, last = embed(ids[:, :-1]), embed(ids[:, -1:])
    n = prompt.shape[1]
    with_nulls = torch.cat([prompt[:, :3], prompt.new_zeros(1, 2, 32), prompt[:, 3:]], dim=1)
    null_positions = torch.cat([torch.arange(3), torch.tensor([2, 2]), torch.arange(3, n)])[None]

    def decode(embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = model(inputs_embeds=embeds, position_ids=positions, use_cache=True)
        step = model(inputs_embeds=last, position_ids=torch.tensor([[n]]), cache=out.cache)
        return step.last_hidden_state

    host = decode(prompt, torch.arange(n)[None])
    with retrofitted(model, "full-o", 1e-12, eps=1e-30):
        assert relative_max_diff({"s": decode(prompt, torch.arange(n)[None])}, {"s": host}) <= 1e-4
    with retrofitted(model, "full-o", 1e-6):
        plain = decode(prompt, torch.arange(n)[None])
        nulls = decode(with_nulls, null_positions)
    assert relative_max_diff({"s": nulls}, {"s": plain}) <= 1e-4


@covered_here
def test_an_indexer_that_rewrites_its_indices_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _build("deepseek_v32")
    inputs = zoo.example_inputs(model)
    own = type(model.layers[0].self_attn.indexer).forward
    # DeepSeek-V4's indexer marks future entries -1 after its top-k
    monkeypatch.setattr(type(model.layers[0].self_attn.indexer), "forward",
                        lambda self, *a, **kw: own(self, *a, **kw).clamp(max=0) - 1)
    with retrofitted(model, "oa", 1e-6):
        with pytest.raises(RetrofitError, match="layers.0.self_attn .its indexer. returned other"):
            model(**inputs)


def test_indices_that_are_not_key_positions_are_refused() -> None:
    mask = torch.ones(1, 1, 2, 4, dtype=torch.bool)
    with pytest.raises(RetrofitError, match="not top-k key positions"):
        indexer.selected_keys(mask, torch.tensor([[[0, -1], [1, 2]]]), 2, 4, "SomeAttention")
    with pytest.raises(RetrofitError, match="without an attention mask"):
        indexer.selected_keys(None, torch.tensor([[[0, 1], [1, 2]]]), 2, 4, "SomeAttention")


@covered_here
@pytest.mark.parametrize("model_type, config, layout", [
    ("deepseek_v4", dict(layer_types=["sliding_attention", "compressed_sparse_attention"]),
     "compressed sparse attention"),
    ("minimax_m3_vl_text", dict(layer_types=["minimax_m3_sparse", "full_attention"],
                                index_block_size=2, index_topk_blocks=2),
     "block top-k sparse attention"),
    ("hy_v4", {}, "hyper-connection streams"),
])
def test_selection_no_presence_describes_is_refused_by_layout(
        model_type: str, config: dict, layout: str) -> None:
    model = _build(model_type, **config)
    with pytest.raises(RetrofitError) as error:
        plan_retrofit(model, "full-o")
    message = str(error.value)
    assert type(model).__name__ in message and f"(layout {layout!r})" in message, message
    assert "no O form" in message
