"""Presences that live in transformers' KV cache (oretrofit/hosts/transformers/cache.py): every
cache kind generates the unpatched tokens at τ→0, null carriers stay excluded after the cache
is written, crop / reorder / batch selection / deepcopy / pickle move the presences with the
keys, and a cache holding keys written without presences is refused."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy  # noqa: E402
import inspect  # noqa: E402
import pickle  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (DynamicCache, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          MistralConfig, MistralForCausalLM, StaticCache)

from hosts.transformers import zoo  # noqa: E402
from oretrofit import RetrofitError, retrofitted  # noqa: E402
from oretrofit.hosts.transformers.measures import EPS, PROMPTS, TAU, load_smollm2  # noqa: E402

# the KV cache argument: ``cache`` from transformers 5.24, ``past_key_values`` before
CACHE = ("cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
         else "past_key_values")
_SHAPE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
# a window of 4 keys: the 7-token prompts below overflow it (the sliding layers roll)
KINDS = {"llama": lambda: LlamaForCausalLM(LlamaConfig(**_SHAPE)).eval(),
         "sliding": lambda: MistralForCausalLM(MistralConfig(**_SHAPE, sliding_window=4)).eval()}


def _cache(kind: str, model: torch.nn.Module) -> object:
    return (StaticCache(config=model.config, max_cache_len=16) if kind == "static"
            else DynamicCache(config=model.config))


def _generate(model: torch.nn.Module, ids: torch.Tensor, **kwargs: object) -> list[list[int]]:
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                          do_sample=False, pad_token_id=0, **kwargs).tolist()


@pytest.mark.parametrize("options", [{}, {"cache_implementation": "static"}, {"num_beams": 3}],
                         ids=["dynamic", "static", "beams"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_every_cache_kind_generates_the_unpatched_tokens(kind: str, options: dict,
                                                         arm: str) -> None:
    """A static cache hands attention all its slots (16 keys, 7 filled) and was refused as 'a
    layer that runs more than once per forward'; beam search reorders the cache every step."""
    model = KINDS[kind]()
    ids = torch.randint(1, 100, (2, 7))
    reference = _generate(model, ids, **options)
    with retrofitted(model, arm, TAU, eps=EPS):
        assert _generate(model, ids, **options) == reference


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_null_carriers_stay_excluded_in_every_cache_slot(kind: str, cache_kind: str) -> None:
    """Decoding token by token after a prompt with null carriers equals recomputing the whole
    sequence: the cached keys keep their presences in the slots they were written to (a static
    cache's slot positions, a sliding window's roll)."""
    model = KINDS[kind]()
    embeds = model.get_input_embeddings()(torch.randint(1, 100, (2, 9)))
    embeds[0, 2:4] = 0
    embeds[1, 5] = 0
    with torch.no_grad(), retrofitted(model, "full-o", TAU, eps=EPS):
        whole = model(inputs_embeds=embeds).logits
        cache = _cache(cache_kind, model)
        steps = [_last_logits(model, cache, inputs_embeds=embeds[:, :6])]
        for at in range(6, 9):
            steps.append(_last_logits(model, cache, inputs_embeds=embeds[:, at:at + 1]))
    torch.testing.assert_close(torch.stack(steps, 1), whole[:, 5:], atol=1e-5, rtol=1e-5)


def _last_logits(model: torch.nn.Module, cache: object, **inputs: torch.Tensor) -> torch.Tensor:
    """The last position's logits of one call that writes ``cache``."""
    return model(**inputs, **{CACHE: cache}, use_cache=True).logits[:, -1]


@pytest.mark.parametrize("name", ["GPT-2", "GPT-NeoX (parallel residual)",
                                  "GPT-BigCode (multi-query)", "Mixtral"])
def test_zoo_models_generate_the_unpatched_tokens(name: str) -> None:
    """GPT-2's block takes the cache positionally, GPT-NeoX's as ``layer_past=`` (the presences
    were not followed: refused as 'a layer that runs more than once'); MoE layers pass
    ``output_router_logits`` to the attention function (refused as an unknown argument)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING
    arch = next(a for a in zoo.ARCHITECTURES if a.name == name)
    config = zoo.build(arch).config
    model = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config).eval()
    with torch.no_grad():       # the padding id's zero embedding is a null token when generated
        model.get_input_embeddings().weight[0].normal_()
    ids = torch.randint(1, min(config.vocab_size, 100), (1, 6))
    reference = _generate(model, ids)
    with retrofitted(model, "full-o", 1e-12, eps=1e-12):           # as the zoo's tests run
        assert _generate(model, ids) == reference


def _filled(model: torch.nn.Module, cache: object, **inputs: torch.Tensor) -> object:
    _last_logits(model, cache, **inputs)
    return cache


@pytest.mark.parametrize("move", ["reorder", "select", "crop", "deepcopy", "pickle"])
def test_cache_operations_move_the_presences_with_the_keys(move: str) -> None:
    """Rows 0 and 1 of the prompt hold null carriers at different places; after the cache is
    reordered / narrowed / cropped / copied, the next step equals the recomputed sequence of the
    rows (and tokens) the cache now holds."""
    model = KINDS["llama"]()
    embeds = model.get_input_embeddings()(torch.randint(1, 100, (2, 7)))
    embeds[0, 1:3] = 0
    embeds[1, 4] = 0
    with torch.no_grad(), retrofitted(model, "full-o", TAU, eps=EPS):
        cache = _filled(model, DynamicCache(config=model.config), inputs_embeds=embeds[:, :6])
        rows, length = [0, 1], 6
        if move == "reorder":
            rows = [1, 0]
            cache.reorder_cache(torch.tensor(rows))
        elif move == "select":
            rows = [1]
            cache.batch_select_indices(torch.tensor(rows))
        elif move == "crop":
            length = 4
            cache.crop(-2)
        elif move == "deepcopy":
            cache = copy.deepcopy(cache)
        else:
            cache = pickle.loads(pickle.dumps(cache))
        sequence = torch.cat([embeds[rows, :length], embeds[rows, 6:7]], dim=1)
        step = _last_logits(model, cache, inputs_embeds=embeds[rows, 6:7])
        whole = model(inputs_embeds=sequence).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-5)


def test_a_static_cache_is_reset_and_refilled() -> None:
    model = KINDS["llama"]()
    ids = torch.randint(1, 100, (1, 7))
    with torch.no_grad(), retrofitted(model, "full-o", TAU, eps=EPS):
        cache = StaticCache(config=model.config, max_cache_len=16)
        first = _last_logits(model, cache, input_ids=ids)
        cache.reset()
        again = _last_logits(model, cache, input_ids=ids)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_a_cache_written_without_presences_is_refused(cache_kind: str) -> None:
    """Keys the unpatched model wrote (before the retrofit, or after it was taken off, into a
    cache the retrofit had filled) have no presences: refused, naming the fix."""
    model = KINDS["llama"]()
    ids = torch.randint(1, 100, (1, 6))
    with torch.no_grad():
        before = _filled(model, _cache(cache_kind, model), input_ids=ids[:, :4])
        with retrofitted(model, "oa", TAU, eps=EPS):
            during = _filled(model, _cache(cache_kind, model), input_ids=ids[:, :4])
        _filled(model, during, input_ids=ids[:, 4:5])
        with retrofitted(model, "oa", TAU, eps=EPS):
            for cache in (before, during):
                with pytest.raises(RetrofitError, match="never saw.*fresh cache"):
                    _filled(model, cache, input_ids=ids[:, 5:])


@pytest.fixture(scope="module")
def smollm2() -> tuple[torch.nn.Module, object]:
    return load_smollm2()


def test_smollm2_static_cache_and_prefix_cache_recipe(smollm2: tuple) -> None:
    """transformers' prefix-caching recipe: run a prefix once, then generate several questions
    from deep copies of its cache; and a static cache. Same tokens as the unpatched model."""
    model, tokenizer = smollm2
    prefix = tokenizer(PROMPTS[2], return_tensors="pt")["input_ids"]
    questions = [torch.cat([prefix, tokenizer(t, return_tensors="pt")["input_ids"]], dim=1)
                 for t in (" went to", " said")]

    def run() -> list[list[list[int]]]:
        with torch.no_grad():
            cache = _filled(model, DynamicCache(config=model.config), input_ids=prefix)
            reused = [_generate(model, q, **{CACHE: copy.deepcopy(cache)}) for q in questions]
        return [*reused, _generate(model, questions[0], cache_implementation="static")]

    reference = run()
    with retrofitted(model, "full-o", TAU, eps=EPS):
        assert run() == reference


def test_a_dynamic_presence_layer_appends_as_its_update_does() -> None:
    """A decode step's presence write on a dynamic layer is one concatenation kept as keys and
    values (cache._append); it leaves the layer as the layer's own ``update`` would, and any
    other layer kind (a sliding window's roll) is written by its ``update``."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from oretrofit.hosts.transformers.cache import _append
    first, column = torch.rand(2, 1, 5, 1), torch.rand(2, 1, 1, 1)
    for make in (DynamicLayer, lambda: DynamicSlidingWindowLayer(sliding_window=4)):
        own, appended = make(), make()
        for layer in (own, appended):
            layer.update(first, first)
        expected = own.update(column, column)
        got = _append(appended, column, (), {})
        assert torch.equal(got, expected[0])
        assert torch.equal(appended.keys, own.keys) and torch.equal(appended.values, own.values)
        assert appended.get_seq_length() == own.get_seq_length()
