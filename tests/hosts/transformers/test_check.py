"""The contracts and answers checked together (oretrofit/hosts/transformers/check.py): measured at the settings given or the library's, all hold on a model the host
covers, a broken one is named, and check runs to an answer (a summary, or a refusal by name) on
every architecture of the zoo and on the models it once crashed on."""

from __future__ import annotations

import inspect
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from oretrofit import RetrofitError, retrofit  # noqa: E402
from oretrofit.hosts.transformers import check as checks  # noqa: E402
from oretrofit.transformers import check, failed  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from hosts.transformers.tiny_text import tiny_causal_lm, word_tokenizer  # noqa: E402

BERT = next(a for a in zoo.ARCHITECTURES if a.model_type == "bert")
PROMPTS = ["The cat sits outside.", "A man is playing a guitar on the street."]


def test_every_contract_holds_on_a_covered_model_and_it_is_left_as_given():
    model = zoo.build(BERT)
    before, implementation = ({k: v.clone() for k, v in model.state_dict().items()},
                              model.config._attn_implementation)
    summary = check(model)
    assert summary["holds"] and summary["failed"] == [] == failed(summary), summary["failed"]
    assert [a["arm"] for a in summary["agreement"]] == ["oa", "full-o"]
    assert summary["null_insertion"]["inserted_max_abs"] == 0
    assert summary["padding_max_delta"] is not None
    assert summary["padding_max_delta"] <= checks.LIMITS["padding"]
    assert summary["answers"] is None
    assert model.config._attn_implementation == implementation
    assert not [m for m in model.modules() if type(m).__module__ == "oretrofit._surgery.patching"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_settings_measured_are_the_users_or_the_librarys_defaults():
    defaults = inspect.signature(retrofit).parameters
    model = zoo.build(BERT)
    summary = check(model, arm="full-o")
    assert summary["arms"] == ["full-o"]
    assert (summary["tau"], summary["eps"]) == (defaults["tau"].default, defaults["eps"].default)
    given = check(model, arm="full-o", tau=1e-7, eps=1e-9)["agreement"][0]
    assert (given["tau"], given["eps"]) == (1e-7, 1e-9)
    with pytest.raises(ValueError, match="either spec or arm / tau / eps"):
        check(model, spec=retrofit(zoo.build(BERT)).spec(), eps=1e-9)
    with pytest.raises(ValueError, match="pass tokenizer= too"):
        check(model, prompts=PROMPTS)


@pytest.mark.parametrize("broken, named", [
    ({"relative_max_diff": 0.5}, r"agreement \(oa: relative difference 0\.5 > 0\.0001\)"),
    ({"revert_bit_identical": False}, r"exact revert \(oa: "),
])
def test_a_broken_agreement_or_revert_is_named(monkeypatch, broken, named):
    measured = checks.agreement

    def agreement(model, inputs, arm, *args):
        found = measured(model, inputs, arm, *args)
        return {**found, **broken} if arm == "oa" else found

    monkeypatch.setattr(checks, "agreement", agreement)
    summary = check(zoo.build(BERT))
    assert not summary["holds"] and len(summary["failed"]) == 1
    assert re.match(named, summary["failed"][0]), summary["failed"]


def _tiny_seq2seq_lm() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    from oretrofit.hosts.transformers.shrink import jitter
    torch.manual_seed(0)
    return jitter(T5ForConditionalGeneration(T5Config(
        vocab_size=99, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=2)).eval(), 0)


@pytest.mark.parametrize("make", [tiny_causal_lm, _tiny_seq2seq_lm], ids=["Llama", "T5"])
def test_a_language_models_answers_are_kept_or_the_moving_sites_named(make):
    from oretrofit import plan_retrofit
    model, tokenizer = make(), word_tokenizer()
    kept = check(model, tokenizer, prompts=PROMPTS, new_tokens=5)
    answers = kept["answers"]
    assert answers["kind"] == "generate" and answers["prompts"] == 2
    assert answers["new_tokens"] == 5 and kept["holds"], kept["failed"]
    assert all(a["changed"] == [] and a["logits_max_delta"] <= 1e-3 and a["sites"] == []
               for a in answers["arms"])
    # ε far above every row's mass silences the heads: attention sites are named
    moved = check(model, tokenizer, arm="full-o", eps=1e3, prompts=PROMPTS, new_tokens=5)
    arm = moved["answers"]["arms"][0]
    attention = {s.name for s, _ in plan_retrofit(model, "full-o").entries
                 if s.kind == "attention"}
    assert arm["logits_max_delta"] > 1e-2 and arm["sites"][0]["site"] in attention
    assert any(f.startswith("answers (full-o: ") and f"logits move by up to "
               f"{arm['logits_max_delta']:.3g} (limit 0.001); moved most by "
               f"{arm['sites'][0]['site']} (" in f for f in moved["failed"]), moved["failed"]


def test_an_encoders_sentence_embeddings_are_kept():
    model, tokenizer = zoo.build(BERT), word_tokenizer()
    summary = check(model, tokenizer, prompts=PROMPTS)
    assert summary["answers"]["kind"] == "embed" and summary["holds"], summary["failed"]
    assert all(a["min_cosine"] >= 0.999999 for a in summary["answers"]["arms"])


_V = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_GEMMA3_TEXT = dict(_V, head_dim=8, vocab_size=99, num_key_value_heads=2, sliding_window=4)
ONCE_CRASHED = [
    zoo.Architecture("SigLIP (text and image towers)", "siglip", "vision",
                     dict(text_config=dict(_V, vocab_size=99),
                          vision_config=dict(_V, image_size=8, patch_size=4))),
    zoo.Architecture("Moonshine", "moonshine", "audio",
                     dict(_V, encoder_num_hidden_layers=2, decoder_num_hidden_layers=2,
                          encoder_num_attention_heads=4, decoder_num_attention_heads=4,
                          vocab_size=99)),
    # its sliding window is set on text_config: null insertion goes at the end
    zoo.Architecture("Gemma3 (text and vision)", "gemma3", "decoder-only",
                     dict(text_config=_GEMMA3_TEXT, mm_tokens_per_image=4,
                          vision_config=dict(_V, image_size=8, patch_size=4))),
]


def _answered(model: nn.Module, name: str) -> None:
    """check on ``model`` gives a summary whose contracts hold, or refuses naming its class."""
    try:
        summary = check(model)
    except RetrofitError as refusal:
        assert type(model).__name__ in str(refusal), str(refusal)
        return
    assert summary["holds"], (name, summary["failed"])


@pytest.mark.parametrize("arch", zoo.ARCHITECTURES + zoo.REFUSED + zoo.REFUSED_ON_CALL
                         + ONCE_CRASHED, ids=lambda a: a.name)
def test_check_runs_to_an_answer_on_every_architecture(arch: zoo.Architecture) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if arch.model_type not in CONFIG_MAPPING:          # a type this release does not have
        return
    model = zoo.build(arch)
    if arch in zoo.ARCHITECTURES and zoo.expectation(arch) == "covered":
        summary = check(model)
        assert summary["holds"], summary["failed"]
    elif arch in zoo.REFUSED_ON_CALL:         # retrofitted, refused at its first call by module
        with pytest.raises(RetrofitError) as refusal:
            check(model)
        expected = zoo.refusal_on_call(arch)                  # "path (Class) takes …"
        assert str(refusal.value).startswith(expected[:expected.index(")") + 1])
    else:
        _answered(model, arch.name)


def test_check_on_a_causal_lm_whose_base_model_is_itself() -> None:
    """Gemma3ForCausalLM names its backbone ``model`` while its ``base_model_prefix`` (on
    transformers 4.x) names none: base_model is the head model, which returns logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from oretrofit.hosts.transformers.shrink import jitter
    torch.manual_seed(0)
    model = jitter(AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gemma3_text", **_GEMMA3_TEXT)).eval(), 0)
    _answered(model, "Gemma3ForCausalLM")


def test_a_plain_module_around_a_model_is_refused_naming_the_model_inside() -> None:
    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **inputs):  # noqa: ANN003, ANN201
            return self.inner(**inputs)

    with pytest.raises(ValueError, match=r"Wrapper is no PreTrainedModel.*check\(model\.inner\)"):
        check(Wrapper(zoo.build(BERT)))
