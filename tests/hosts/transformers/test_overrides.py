"""A transformers class subclassed with methods of its own (oretrofit/hosts/transformers/
overrides.py) is not trusted by its base class's name: on the installed (tested) release and on
an untested newer one alike, a subclass that redefines a method a forward runs goes through the
self-check (admitted with a notice when a tiny copy holds the contracts, else refused naming the
class, the method and the contract); one that redefines none is trusted as its base is. Runs on
the oldest and the newest admitted transformers (the Makefile's TRANSFORMERS_TESTS)."""

from __future__ import annotations

import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import LlamaModel  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer  # noqa: E402

from oretrofit import RetrofitError, retrofit, retrofitted  # noqa: E402
from oretrofit.hosts.transformers.contracts import null_insertion  # noqa: E402
from oretrofit.hosts.transformers.overrides import overrides  # noqa: E402
from oretrofit.hosts.transformers.selfcheck import (SubclassCheckedWarning,  # noqa: E402
                                                    UntestedReleaseWarning)
from hosts.transformers import zoo  # noqa: E402

LLAMA = next(a for a in zoo.ARCHITECTURES if a.name == "Llama")


class BiasedLlama(LlamaModel):
    """A learned bias added to every token's embedding: a zero token is no zero carrier."""

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(config)
        self.token_bias = nn.Parameter(torch.zeros(config.hidden_size))

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        return super().forward(inputs_embeds=inputs_embeds + self.token_bias, **kwargs)


class CountingLlama(LlamaModel):
    """Its own forward, which changes nothing the contracts measure."""

    calls = 0

    def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        type(self).calls += 1
        return super().forward(*args, **kwargs)


class HelperLlama(LlamaModel):
    """Its own constructor and a helper method: no method a forward runs is redefined."""

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(config)
        self.label = "helper"

    def widths(self) -> list[int]:
        return [layer.mlp.up_proj.out_features for layer in self.layers]


class BiasedLayer(LlamaDecoderLayer):
    def forward(self, hidden_states, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        return super().forward(hidden_states + 0.5, *args, **kwargs)


def _built(cls: type) -> nn.Module:
    """``cls`` with the jittered weights of the zoo's tiny Llama (its own parameters random)."""
    base = zoo.build(LLAMA)
    model = cls._from_config(base.config).eval()
    model.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name == "token_bias":
                parameter.normal_(0, 1, generator=torch.Generator().manual_seed(0))
    return model


def _refusal(model: nn.Module) -> str:
    """The RetrofitError message of retrofitting ``model``, which is left unpatched."""
    with pytest.raises(RetrofitError) as error:
        retrofit(model)
    assert not [m for m in model.modules() if type(m).__module__ == "oretrofit._surgery.patching"]
    return str(error.value)


def _inserted_max_abs(model: nn.Module) -> float:
    with retrofitted(model):
        return null_insertion(model, zoo.example_inputs(model))["inserted_max_abs"]


def test_overriding_classes_are_found_with_the_methods_they_redefine() -> None:
    found = overrides(_built(BiasedLlama))
    assert [(o.path, o.cls, o.known, o.methods) for o in found] == [
        ("", BiasedLlama, LlamaModel, ("forward",))]
    assert found[0].describe() == ("BiasedLlama (the model itself, a subclass of transformers' "
                                   "LlamaModel) overrides forward")
    assert overrides(_built(HelperLlama)) == [] and overrides(zoo.build(LLAMA)) == []


def test_a_bias_adding_forward_is_refused_naming_class_method_and_contract(fresh) -> None:
    model = _built(BiasedLlama)
    message = _refusal(model)
    assert message.startswith("BiasedLlama (the model itself, a subclass of transformers' "
                              "LlamaModel) overrides forward, which the host relies on")
    assert "BiasedLlama fails the self-check: on a tiny random BiasedLlama of its config, " \
           "null insertion (inserted states not exactly 0" in message
    assert message.endswith("make the override keep the contracts, or retrofit the model "
                            "without it")
    assert not hasattr(model, "_oretrofit_retrofit")


def test_a_forward_that_keeps_the_contracts_is_admitted_after_the_self_check(fresh) -> None:
    model = _built(CountingLlama)
    with pytest.warns(SubclassCheckedWarning, match=r"CountingLlama \(the model itself, a "
                      r"subclass of transformers' LlamaModel\) overrides forward; CountingLlama "
                      r"passed the self-check on a tiny random copy"):
        assert _inserted_max_abs(model) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # noticed once, measured once
        assert _inserted_max_abs(model) == 0
    [record] = (fresh / "selfcheck").glob("CountingLlama-*.json")
    assert record.name.count("-") == 4                       # ... -oretrofitX-<code digest>.json


def test_a_subclass_redefining_no_forward_method_is_trusted_without_a_self_check(fresh) -> None:
    model = _built(HelperLlama)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _inserted_max_abs(model) == 0
    assert not (fresh / "selfcheck").exists()


def test_an_overriding_layer_put_in_after_construction_is_refused_by_name(fresh) -> None:
    model = zoo.build(LLAMA)
    layer = BiasedLayer(model.config, layer_idx=1).eval()
    layer.load_state_dict(model.layers[1].state_dict())
    model.layers[1] = layer
    message = _refusal(model)
    assert message.startswith("BiasedLayer (at layers.1, a subclass of transformers' "
                              "LlamaDecoderLayer) overrides forward, which the host relies on")
    assert "the self-check cannot measure BiasedLayer: a tiny LlamaModel built from its " \
           "config holds none" in message


def test_a_newer_release_refuses_the_bias_adding_forward_too(monkeypatch, fresh) -> None:
    model = _built(BiasedLlama)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.99.0")
    with pytest.raises(RetrofitError, match=r"^transformers 5\.99\.0 is newer than every release "
                       r".*, BiasedLlama \(the model itself.*overrides forward.* BiasedLlama "
                       r"fails the self-check there: .*null insertion"):
        retrofit(model)
    with pytest.warns(UntestedReleaseWarning):
        retrofit(_built(HelperLlama), "oa").revert()
