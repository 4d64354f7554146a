"""The generic transformers host on every architecture of ``zoo`` (tiny, jittered)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from oretrofit import RetrofitError, retrofit, retrofitted  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from oretrofit.hosts.transformers.interface_route import o_attention_function  # noqa: E402
from oretrofit.hosts.transformers.contracts import agreement, null_insertion  # noqa: E402

NAMES = [a.name for a in zoo.ARCHITECTURES]


def test_the_list_covers_every_family() -> None:
    families = {a.family for a in zoo.ARCHITECTURES}
    assert len(zoo.ARCHITECTURES) >= 25
    assert families == {"decoder-only", "encoder-only", "encoder-decoder", "MoE", "vision",
                        "audio"}


@pytest.fixture(scope="module", params=zoo.ARCHITECTURES, ids=NAMES)
def tiny(request: pytest.FixtureRequest) -> tuple[zoo.Architecture, torch.nn.Module | None, dict]:
    """The tiny model, or ``None`` where the installed release does not route the architecture's
    attention through the interface (then each contract test checks the refusal instead)."""
    if zoo.expectation(request.param) != "covered":
        return request.param, None, {}
    model = zoo.build(request.param)
    return request.param, model, zoo.example_inputs(model)


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_to_zero_agrees_and_revert_is_exact(tiny: tuple, arm: str) -> None:
    arch, model, inputs = tiny
    if model is None:
        return zoo.assert_refused_in_this_release(arch)
    implementation = model.config._attn_implementation
    result = agreement(model, inputs, arm, tau=1e-12, eps=1e-12)
    assert result["relative_max_diff"] <= 1e-4
    assert result["revert_bit_identical"] and result["state_dict_keys_unchanged"]
    assert model.config._attn_implementation == implementation


def test_null_insertion_is_exact_under_full_o(tiny: tuple) -> None:
    arch, model, inputs = tiny
    if model is None:
        return zoo.assert_refused_in_this_release(arch)
    unpatched = null_insertion(model, inputs)
    with retrofitted(model, "full-o", 1e-6):
        result = null_insertion(model, inputs)
    assert result["inserted_max_abs"] == 0 and result["layers"] >= 3
    assert result["old_max_delta"] <= 1e-4
    assert unpatched["inserted_max_abs"] > 1e-2       # the zero carrier is not inert unpatched
    # at the end where positions (T5's buckets, BART's table) or windows follow the index
    assert result["where"] == arch.insertion_here()


def test_null_insertion_measures_the_final_norm_after_the_layers() -> None:
    # GPT-2's ln_f sits after the last layer: left ungated, a zero carrier leaves it as β ≠ 0
    model = zoo.build(next(a for a in zoo.ARCHITECTURES if a.name == "GPT-2"))
    inputs = zoo.example_inputs(model)
    with retrofitted(model, "full-o", 1e-6, exclude=["ln_f"], allow_partial=True):
        result = null_insertion(model, inputs)
    assert result["inserted_max_abs"] > 1e-3


@pytest.mark.parametrize("arch", zoo.REFUSED, ids=[a.name for a in zoo.REFUSED])
def test_refused_architectures_name_class_reason_and_fix(arch: zoo.Architecture) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if arch.model_type not in CONFIG_MAPPING:     # a type this release does not have yet
        with pytest.raises(ValueError, match=arch.model_type):
            zoo.build(arch)
        return
    if zoo.expectation(arch) != "covered":       # a type covered (in another form) from later:
        zoo.assert_refused_in_this_release(arch)  # this release is refused first, naming the fix
        return
    model = zoo.build(arch)
    with pytest.raises(RetrofitError) as error:
        retrofit(model, "oa")
    message = str(error.value)
    assert type(model).__name__ in message
    assert "register" in message.lower() or "no O form" in message          # how to proceed
    reasons = ("attention interface", "no layout describes", "a null token would not stay inert",
               "a null token would move its neighbours", "only partly covered",
               "gates are not defined")
    assert any(reason in message for reason in reasons), message
    assert not hasattr(model, "_oretrofit_retrofit")


def test_unknown_attention_argument_is_refused_and_output_attentions_returns_weights() -> None:
    model = zoo.build(zoo.ARCHITECTURES[6])                                     # Llama
    attention = model.layers[0].self_attn
    q = torch.randn(1, 4, 3, 8)
    with retrofitted(model, "oa", 1e-6):
        model(torch.tensor([[5, 6, 7]]))                                        # captures presences
        with pytest.raises(RetrofitError, match="score_offsets"):
            o_attention_function(attention, q, q[:, :2], q[:, :2], None,
                                 score_offsets=torch.zeros(4))
        assert o_attention_function(attention, q, q[:, :2], q[:, :2], None)[1] is None
        out, weights = o_attention_function(attention, q, q[:, :2], q[:, :2], None,
                                            output_attentions=True)
    # the O weights p_i w_ij (B, H, Nq, Nk): every token present, rows of a softmax
    assert weights.shape == (1, 4, 3, 3)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 4, 3), atol=1e-4)
    assert torch.allclose(out, torch.einsum("bhqk,bhkd->bqhd", weights,
                                            q[:, :2].repeat_interleave(2, 1)), atol=1e-6)


def _arch(name: str) -> zoo.Architecture:
    return next(a for a in zoo.ARCHITECTURES if a.name == name)


def test_softcap_and_position_bias_reach_the_operator() -> None:
    """Dropping Gemma2's softcap or T5's position bias would break τ→0 agreement far past 1e-4."""
    for name, drop in (("Gemma2 (softcap 0.5, sliding window 4)", "softcap"),
                       ("T5", "position_bias"),
                       ("GPT-OSS (attention sinks, sliding window 4)", "s_aux")):
        arch = _arch(name)
        if zoo.expectation(arch) != "covered":             # T5 before its interface release
            zoo.assert_refused_in_this_release(arch)
            continue
        model = zoo.build(arch)
        with torch.no_grad():                     # scores well past Gemma2's cap of 0.5
            for name_, parameter in model.named_parameters():
                parameter.mul_(30.0 if name_.endswith("q_proj.weight") else 1.0)
        inputs = zoo.example_inputs(model)
        from oretrofit.hosts.transformers import interface_route as ta
        original = ta.o_attention_function

        def dropping(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            kwargs.pop(drop, None)
            return original(*args, **kwargs)

        ta.register_implementation()
        from transformers import AttentionInterface
        AttentionInterface._global_mapping[ta.IMPLEMENTATION] = dropping
        try:
            assert agreement(model, inputs, "oa")["relative_max_diff"] > 1e-3
        finally:
            AttentionInterface._global_mapping[ta.IMPLEMENTATION] = original


def test_layouts_are_derived_per_family() -> None:
    expected = {
        "GPT-J": ["MLP branch, stream traced"],
        "Gemma2 (softcap 0.5, sliding window 4)": ["sandwich norms"],
        "BERT": ["intermediate/output split"], "OPT": ["fc1/fc2 inline, pre-norm"],
        "OPT (post-norm)": ["fc1/fc2 inline, post-norm"], "BART": ["fc1/fc2 inline, post-norm"],
        "T5": ["T5 sub-layers"], "GPT-NeoX (sequential)": ["MLP branch, stream traced"],
        "BLOOM (ALiBi)": ["FFN adding its own residual"]}
    covered = {name for name in expected if zoo.expectation(_arch(name)) == "covered"}
    assert {"Gemma2 (softcap 0.5, sliding window 4)", "BERT", "OPT", "BART"} <= covered
    assert {name: zoo.describe(_arch(name))["layouts"] for name in covered} == {
        name: layouts for name, layouts in expected.items() if name in covered}
    for name in expected.keys() - covered:                 # GPT-J, T5 before their release
        zoo.assert_refused_in_this_release(_arch(name))


def test_owned_is_the_whole_transformers_model_and_head_attention_is_uncovered() -> None:
    from transformers import BertConfig, BertForSequenceClassification
    from oretrofit.hosts.transformers.host import TransformersHost
    model = BertForSequenceClassification(BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64)).eval()
    host = TransformersHost()
    # the classifier head is a per-token read-out: owned with the model, not left to torch.nn
    assert host.owned(model) == [""] and host.specificity == 10
    assert host.uncovered(model) == []
    assert all(s.name.startswith("bert.") for s in host.sites(model))
    wrapper = nn.ModuleDict({"inner": model})
    assert host.owned(wrapper) == ["inner"]
    model.pool_attention = nn.MultiheadAttention(32, 4)      # attention in a head: no site
    assert host.uncovered(model) == ["pool_attention (MultiheadAttention)"]
    with pytest.raises(RetrofitError, match=r"pool_attention \(MultiheadAttention\)"):
        retrofit(model, "full-o")


@pytest.mark.parametrize("name", ["T5", "BART"])
def test_encoder_decoder_generation_with_cache_is_unchanged(name: str) -> None:
    """Cross-attention sources and cached self-attention keys keep their presences."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM
    arch = _arch(name)
    if zoo.expectation(arch) != "covered":                 # T5 before its interface release
        return zoo.assert_refused_in_this_release(arch)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(
        AutoConfig.for_model(arch.model_type, **{**zoo._COMMON, **arch.config})).eval()
    ids = torch.randint(3, 99, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model.generate(ids, max_new_tokens=6, do_sample=False)
        for arm in ("oa", "full-o"):
            with retrofitted(model, arm, 1e-12, eps=1e-12):
                assert model.generate(ids, max_new_tokens=6, do_sample=False).tolist() == \
                    reference.tolist()


def test_excluded_layers_run_the_original_implementation() -> None:
    """Gemma2 runs eager attention (softcap); a layer excluded from the retrofit still does."""
    arch = next(a for a in zoo.ARCHITECTURES if a.name.startswith("Gemma2"))
    model = zoo.build(arch)
    inputs = zoo.example_inputs(model)
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        with retrofitted(model, "oa", 1e-12, eps=1e-12, exclude=["layers.1.*"]) as r:
            assert [s for s in r.spec()["sites"]] == ["layers.0.self_attn"]
            out = model(**inputs).last_hidden_state
    assert ((out - reference).abs().max() / reference.abs().max()) <= 1e-4
