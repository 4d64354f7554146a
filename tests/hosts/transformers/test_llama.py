"""transformers Llama host: tiny GQA configs for breadth, SmolLM2-135M for the real claims."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import inspect  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (AttentionInterface, DynamicCache, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM, LlamaModel)

from oretrofit import RetrofitError, retrofit, retrofitted  # noqa: E402
from oretrofit.hosts.transformers.report import (  # noqa: E402
    CHAT_PROMPTS, EPS, PAPER_EPS, PROMPTS, TAU, chat_text, greedy_and_logits, load_smollm2,
    logits_readout, null_insertion, padding_deltas)

# the KV cache argument: ``cache`` from transformers 5.24, ``past_key_values`` before
CACHE = ("cache" if "cache" in inspect.signature(LlamaModel.forward).parameters
         else "past_key_values")


def _dynamic_cache(config: LlamaConfig) -> DynamicCache:
    """A dynamic cache for ``config``'s model, its layers made from the config up front where
    transformers' ``DynamicCache(config=...)`` works (4.56 on: ``layer_class_to_replicate``);
    before, grown as the model writes it (4.53's takes no config, 4.54-4.55's hands each
    ``DynamicLayer`` a ``max_cache_len`` it does not take)."""
    return (DynamicCache(config=config) if hasattr(DynamicCache(), "layer_class_to_replicate")
            else DynamicCache())


def _tiny_llama(**overrides: object) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         **overrides)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def smollm2() -> tuple[torch.nn.Module, object]:
    return load_smollm2()


def test_sites_and_state_dict() -> None:
    model = _tiny_llama()
    keys = list(model.state_dict())
    with retrofitted(model, "full-o", TAU) as r:
        sites = [row["site"] for row in r.report()]
        assert list(model.state_dict()) == keys
    assert sites[:4] == ["model.layers.0.self_attn", "model.layers.0.mlp",
                         "model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm"]
    assert sites[-1] == "model.norm" and len(sites) == 2 * 4 + 1
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("attention_bias", [False, True])
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_to_zero_with_padding_mask(arm: str, attention_bias: bool) -> None:
    model = _tiny_llama(attention_bias=attention_bias)
    ids = torch.randint(0, 100, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0                                             # left padding
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
        with retrofitted(model, arm, TAU):
            out = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(out[real], reference[real], atol=1e-5, rtol=1e-5)


def test_without_the_mask_function_a_custom_implementation_gets_no_mask() -> None:
    """Why both interfaces are registered: transformers builds masks only for known names."""
    model = _tiny_llama().model
    seen: list[object] = []

    def probe(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN202
        seen.append(attention_mask)
        return torch.zeros_like(query).transpose(1, 2), None

    AttentionInterface.register("oretrofit-probe", probe)
    model.config._attn_implementation_internal = "oretrofit-probe"
    mask = torch.tensor([[1, 1, 1, 0]])
    try:
        with torch.no_grad():
            model(torch.tensor([[5, 6, 7, 8]]), attention_mask=mask)
    finally:
        AttentionInterface._global_mapping.pop("oretrofit-probe")
        model.config._attn_implementation_internal = "sdpa"
    assert seen and all(m is None for m in seen)            # padding and causality silently lost
    handle = model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True)
    seen.clear()
    try:
        with torch.no_grad(), retrofitted(model, "oa", TAU):
            model(torch.tensor([[5, 6, 7, 8]]), attention_mask=mask)
    finally:
        handle.remove()
    assert seen[0].dtype == torch.bool                       # the relation, padding and causality
    assert seen[0][0, 0].tolist() == [[True, False, False, False], [True, True, False, False],
                                      [True, True, True, False], [True, True, True, False]]


def test_null_insertion_with_biases_and_mask_free_padding() -> None:
    model = _tiny_llama(attention_bias=True, mlp_bias=True)
    ids = torch.randint(0, 100, (1, 6))
    with retrofitted(model, "full-o", TAU):
        for at in (6, 3):
            result = null_insertion(model, ids, at)
            assert result["inserted_max_abs"] == 0 and result["old_max_delta"] < 1e-5
        deltas = padding_deltas(model, [[5, 6, 7, 8], [9, 10]], "left", logits_readout)
    assert max(deltas) < 1e-5


def test_kv_cache_keeps_null_presences() -> None:
    """Decoding after a prompt with null carriers equals recomputing the whole sequence."""
    model = _tiny_llama()
    embeds = model.get_input_embeddings()(torch.randint(0, 100, (1, 6)))
    embeds[:, 2:4] = 0
    full_mask = torch.ones(1, 6, dtype=torch.long)
    with torch.no_grad(), retrofitted(model, "full-o", TAU):
        whole = model(inputs_embeds=embeds, attention_mask=full_mask).logits[:, -1]
        cache = _dynamic_cache(model.config)
        model(inputs_embeds=embeds[:, :5], attention_mask=full_mask[:, :5], **{CACHE: cache},
              use_cache=True)
        step = model(inputs_embeds=embeds[:, 5:], attention_mask=full_mask, **{CACHE: cache},
                     use_cache=True).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-5)


def test_cache_filled_before_patching_is_refused() -> None:
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, 5))
    cache = _dynamic_cache(model.config)
    with torch.no_grad():
        model(ids[:, :4], **{CACHE: cache}, use_cache=True)
        with retrofitted(model, "oa", TAU), pytest.raises(RetrofitError, match="fresh cache"):
            model(ids[:, 4:], **{CACHE: cache}, use_cache=True)


def test_smollm2_defaults_keep_chat_answers(smollm2: tuple) -> None:
    """No τ or ε given: the answers of the real chat model, asked through its chat template, are
    the unpatched model's (the paper's ε = 1e-6 moves its logits: some heads go silent)."""
    model, tokenizer = smollm2
    assert model.config.num_attention_heads == 9 and model.config.num_key_value_heads == 3
    texts = [PROMPTS[0]] + [chat_text(tokenizer, p) for p in CHAT_PROMPTS[:3]]
    reference = [greedy_and_logits(model, tokenizer, t, 8) for t in texts]
    for arm in ("oa", "full-o"):
        with retrofitted(model, arm):
            patched = [greedy_and_logits(model, tokenizer, t, 8) for t in texts]
        for (tokens, logits), (patched_tokens, patched_logits) in zip(reference, patched):
            assert patched_tokens == tokens
            torch.testing.assert_close(patched_logits, logits, atol=1e-3, rtol=0)
    with retrofitted(model, "oa", eps=PAPER_EPS):                       # the same check fails
        _, logits = greedy_and_logits(model, tokenizer, texts[1], 8)
    assert (logits - reference[1][1]).abs().max() > 1e-3


def test_smollm2_null_insertion_and_padding(smollm2: tuple) -> None:
    model, tokenizer = smollm2
    ids = tokenizer(PROMPTS[2], return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    unpatched_middle = null_insertion(model, ids, n // 2)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    with retrofitted(model, "full-o", TAU, eps=EPS):
        for at in (n, n // 2):
            result = null_insertion(model, ids, at)
            assert result["inserted_max_abs"] == 0
            assert result["old_max_delta"] < 1e-3
        assert max(padding_deltas(model, prompts, "left", logits_readout)) < 1e-3
    assert unpatched_middle["old_max_delta"] > 1e-1
