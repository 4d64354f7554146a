"""The host's gates outside the layers (oretrofit/hosts/transformers/host.py, gates.py): a
biased projection between the embedding and the first layer, a position table added to patch
embeddings, one convolution over positions next to the layers."""

from __future__ import annotations

import gc
import os
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaModel  # noqa: E402

from oretrofit import RetrofitError, plan_retrofit, retrofit, retrofitted  # noqa: E402
from oretrofit._operators.presence import presence  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from oretrofit.hosts.transformers.contracts import strict_load  # noqa: E402


def _arch(name: str) -> zoo.Architecture:
    return next(a for a in zoo.ARCHITECTURES + zoo.REFUSED if a.name == name)


def _sites(model: torch.nn.Module) -> dict[str, str]:
    with retrofitted(model, "full-o", 1e-6) as r:
        return {row["site"]: row["kind"] for row in r.report()}


@torch.no_grad()
def test_biased_projection_emits_w_x_plus_presence_times_bias() -> None:
    model = zoo.build(_arch("ELECTRA (embedding projection)"))
    projection = model.embeddings_project
    x = torch.randn(2, 5, 16)
    x[0, 2] = 0.0
    x[1, 3] *= 1e-3                                        # a weak carrier: p well below 1
    tau = 1e-4
    assert _sites(model)["embeddings_project"] == "inject"
    with retrofitted(model, "full-o", tau):
        out = projection(x)
    expected = x @ projection.weight.T + presence(x, tau)[..., None] * projection.bias
    assert (out - expected).abs().max() <= 1e-6
    assert out[0, 2].abs().max() == 0 and projection(x)[0, 2].abs().max() > 1e-2
    assert 0.01 < presence(x, tau)[1, 3] < 0.99


@torch.no_grad()
def test_a_zero_patch_is_a_null_token_through_the_gated_position_table() -> None:
    """CLIP's patch convolution has no bias: an all-zero patch embeds to 0, and with its
    position gated by that presence it stays a zero carrier through every layer."""
    model = zoo.build(_arch("CLIP (vision)"))
    pixels = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    pixels[:, :, :4, 4:] = 0.0                             # patch 1 (token 2, after the class token)
    assert _sites(model)["embeddings.position_embedding"] == "inject"
    unpatched = model(pixel_values=pixels).last_hidden_state
    with retrofitted(model, "full-o", 1e-6):
        patched = model(pixel_values=pixels).last_hidden_state
        # another size interpolates the table from its weight, past the gate: refused
        with pytest.raises(RetrofitError, match="interpolate_pos_encoding"):
            model(pixel_values=torch.randn(1, 3, 16, 16), interpolate_pos_encoding=True)
    assert patched[0, 2].abs().max() == 0 and unpatched[0, 2].abs().max() > 1e-2
    assert patched[0, [0, 1, 3, 4]].abs().min(dim=-1).values.gt(0).all()


@torch.no_grad()
def test_one_positional_convolution_is_gated_by_its_input() -> None:
    model = zoo.build(_arch("HuBERT"))
    conv = model.encoder.pos_conv_embed
    h = torch.randn(1, 6, 32)
    h[0, 4:] = 0.0                                         # two null frames at the end
    assert _sites(model)["encoder.pos_conv_embed"] == "inject"
    assert not any(site.startswith("feature_extractor") and kind == "norm" and "parametrizations"
                   in site for site, kind in _sites(model).items())
    with retrofitted(model, "full-o", 1e-6):
        gated = conv(h)
    assert gated[0, 4:].abs().max() == 0 and conv(h)[0, 4:].abs().max() > 1e-3
    assert torch.equal(gated[0, :4], conv(h)[0, :4] * presence(h, 1e-6)[0, :4, None])


def test_stacked_positional_convolutions_are_refused_by_name() -> None:
    model = zoo.build(_arch("Data2Vec (audio, stacked positional convolutions)"))
    with pytest.raises(RetrofitError, match=r"encoder\.pos_conv_embed .*only one stride-1"):
        retrofit(model, "full-o")


@pytest.mark.parametrize("name", ["ELECTRA (embedding projection)", "CLIP (vision)", "HuBERT"])
def test_strict_load_both_ways(name: str) -> None:
    model = zoo.build(_arch(name))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert strict_load(model, "full-o")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize("after", ["plan", "retrofit", "revert"])
def test_a_dropped_model_is_freed_whatever_was_done_to_it(after: str) -> None:
    """The host's derivation cache is keyed weakly and holds only submodules: a model that is
    planned, retrofitted or retrofitted and reverted is freed once dropped (a bare backbone, as
    MiniLM's ``BertModel``, is its own backbone: the cache held it)."""
    model = LlamaModel(LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    if after == "plan":
        plan_retrofit(model, "full-o")
    else:
        done = retrofit(model, "full-o")
        model(input_ids=torch.tensor([[1, 2, 3]]))
        if after == "revert":
            done.revert()
        del done
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None
