"""The softmax route's ways to an eager softmax (an SDPA subclass's eager base class, a config
that picks the kernel at each call), a bias the attention returns for its layer to add, and the
layouts that refuse streams the presences cannot be placed on."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from oretrofit import RetrofitError, retrofit, retrofitted  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from oretrofit.hosts.transformers.layouts import (calls_attention_interface,  # noqa: E402
                                                  eager_class)


def _arch(name: str) -> zoo.Architecture:
    return next(a for a in zoo.ARCHITECTURES if a.name == name)


def test_an_sdpa_subclass_runs_its_eager_base_class_while_retrofitted() -> None:
    from transformers.models.data2vec import modeling_data2vec_vision as d2v
    sdpa, eager = d2v.Data2VecVisionSdpaSelfAttention, d2v.Data2VecVisionSelfAttention
    assert eager_class(sdpa) is eager and eager_class(eager) is eager
    assert eager_class(torch.nn.Linear) is None
    model = zoo.build(_arch("Data2Vec (vision, SDPA module)"))
    inputs = zoo.example_inputs(model)
    attention = model.encoder.layer[0].attention.attention
    assert type(attention) is sdpa
    calls = []
    original = d2v.Data2VecVisionSelfAttention.forward
    d2v.Data2VecVisionSelfAttention.forward = lambda self, *a, **k: (calls.append(1),
                                                                      original(self, *a, **k))[1]
    try:
        with retrofitted(model, "oa", 1e-6), torch.no_grad():
            model(**inputs)
    finally:
        d2v.Data2VecVisionSelfAttention.forward = original
    assert len(calls) == len(model.encoder.layer)          # the eager forward ran, once a layer
    assert type(attention) is sdpa                         # and the SDPA class is back


def test_a_config_picked_kernel_is_eager_while_retrofitted_and_restored() -> None:
    model = zoo.build(_arch("Falcon (SDPA)"))
    assert model.config._attn_implementation == "sdpa"
    # Falcon's attention picks its kernel from the config at each call until transformers 5.25,
    # where it calls the attention interface instead: the interface route sets the host's own
    # attention function there
    routed = calls_attention_interface(model.h[0].self_attention)
    with retrofitted(model, "full-o", 1e-6):
        assert model.config._attn_implementation == ("oretrofit" if routed else "eager")
        with torch.no_grad():
            model(**zoo.example_inputs(model))               # one softmax per call: not refused
    assert model.config._attn_implementation == "sdpa"


def test_a_returned_attention_bias_is_gated_by_the_receivers_presence() -> None:
    model = zoo.build(_arch("GPT-NeoX-Japanese (returned attention bias)"))
    attention = model.layers[-1].attention
    assert attention.dense_bias is not None                # only the last layer has one
    with torch.no_grad():
        attention.dense_bias.fill_(3.0)
    seen: list[torch.Tensor] = []
    attention.register_forward_hook(lambda m, args, out: seen.append(out[2]))
    ids = torch.tensor([[5, 6, 7, 8]])
    embeddings = model.get_input_embeddings()(ids)
    embeddings[0, 1] = 0.0                                   # a null token
    with retrofitted(model, "full-o", 1e-6), torch.no_grad():
        model(inputs_embeds=embeddings)
    bias = seen[-1]                                          # (1, 4, d): p_i · b
    assert bias.shape == (1, 4, 32)
    assert torch.equal(bias[0, 1], torch.zeros(32))
    assert torch.allclose(bias[0, [0, 2, 3]], torch.full((3, 32), 3.0), rtol=1e-5)


def test_time_first_xlnet_is_refused_by_its_layout() -> None:
    from transformers import XLNetConfig, XLNetModel
    model = XLNetModel(XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4,
                                   d_inner=64)).eval()
    with pytest.raises(RetrofitError, match="time-first"):
        retrofit(model, "oa")
    assert not hasattr(model, "_oretrofit_retrofit")
