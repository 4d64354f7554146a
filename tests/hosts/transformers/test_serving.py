"""Serving a retrofitted transformers model: switching its attention implementation after the
retrofit is followed, on both routes (revert restores the user's latest choice); save_pretrained keeps the
retrofit's spec beside the weights and oretrofit.from_pretrained restores it."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import FalconConfig, FalconForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402,E501

import oretrofit  # noqa: E402
from oretrofit import Retrofit, RetrofitError, retrofit, retrofitted  # noqa: E402
from oretrofit.hosts.transformers.layouts import calls_attention_interface  # noqa: E402
from oretrofit.hosts.transformers.models import load_model  # noqa: E402
from oretrofit.hosts.transformers.pretrained import MARKER, SPEC_FILE  # noqa: E402
from oretrofit.hosts.transformers.measures import EPS, TAU, null_insertion  # noqa: E402
from oretrofit.hosts.transformers.inputs import zero_padded_inputs  # noqa: E402

_SHAPE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _tiny(implementation: str) -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(**_SHAPE, attn_implementation=implementation)).eval()


def _mask_free_padding_delta(model: torch.nn.Module) -> float:
    """Largest logit difference of a left-padded row without a mask from the row alone."""
    rows = [[5, 6, 7, 8, 9], [10, 11]]
    with torch.no_grad():
        batch = model(**zero_padded_inputs(model, rows, side="left")).logits
        alone = model(torch.tensor([rows[1]])).logits
    return (batch[1, -2:] - alone[0]).abs().max().item()


@pytest.mark.parametrize("before, after", [("sdpa", "eager"), ("eager", "sdpa")])
def test_set_attn_implementation_after_retrofit_is_followed(before: str, after: str) -> None:
    """The switch used to leave the retrofit silently (mask-free padding off by 27.6 on SmolLM2,
    ``Retrofit.of`` still active) and ``revert`` reset the user's choice."""
    model = _tiny(before)
    handle = retrofit(model, "full-o", TAU, eps=EPS)
    model.set_attn_implementation(after)
    assert Retrofit.of(model) is handle and model.config._attn_implementation == "oretrofit"
    assert _mask_free_padding_delta(model) < 1e-5
    assert null_insertion(model, torch.randint(1, 100, (1, 6)), 3)["inserted_max_abs"] == 0
    handle.revert()
    assert model.config._attn_implementation == after
    assert _mask_free_padding_delta(model) > 1e-2           # the unpatched model needs its mask


@pytest.mark.parametrize("after", ["sdpa", "eager"])
def test_the_softmax_routes_eager_switch_follows_a_later_implementation(after: str) -> None:
    """Falcon picks its kernel from the config at every call and shows its softmax only on the
    eager branch: an implementation set after the retrofit (its config's own attribute; its
    ``set_attn_implementation`` refuses non-interface models) is recorded, the module stays on
    the eager branch (it was refused at the next call for an SDPA one), and ``revert`` restores
    that choice (it restored the one before the retrofit). From transformers 5.25 Falcon calls the
    attention interface, whose route keeps the retrofit's own implementation the same way."""
    torch.manual_seed(0)
    model = FalconForCausalLM(FalconConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        attn_implementation="sdpa" if after == "eager" else "eager")).eval()
    routed = calls_attention_interface(model.transformer.h[0].self_attention)
    handle = retrofit(model, "full-o", TAU, eps=EPS)
    model.config._attn_implementation = after
    assert model.config._attn_implementation == ("oretrofit" if routed else "eager")
    assert null_insertion(model, torch.randint(1, 100, (1, 6)), 3)["inserted_max_abs"] == 0
    handle.revert()
    assert model.config._attn_implementation == after
    assert type(model.config) is FalconConfig


def _padded_logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**zero_padded_inputs(model, [[5, 6, 7, 8, 9], [10, 11]], side="left")).logits


def test_save_pretrained_writes_the_spec_and_from_pretrained_restores_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The folder of a retrofitted model holds its spec: ``oretrofit.from_pretrained`` restores
    the retrofit exactly (mask-free padding as before saving); transformers' own loader gives
    the unpatched model and says so in its load report (the reload was off by 20 silently)."""
    model = _tiny("sdpa")
    handle = retrofit(model, "full-o", TAU, eps=EPS)
    expected = _padded_logits(model)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / SPEC_FILE).read_text()) == json.loads(json.dumps(handle.spec()))
    caplog.clear()
    restored = oretrofit.from_pretrained(tmp_path)
    assert Retrofit.of(restored).spec()["sites"] == handle.spec()["sites"]
    assert MARKER not in caplog.text
    torch.testing.assert_close(_padded_logits(restored), expected, atol=0, rtol=0)
    assert _mask_free_padding_delta(restored) < 1e-5
    plain = LlamaForCausalLM.from_pretrained(tmp_path)
    assert MARKER in caplog.text and Retrofit.of(plain) is None
    assert _mask_free_padding_delta(plain) > 1e-2
    handle.revert()
    model.save_pretrained(tmp_path / "unpatched")
    assert not (tmp_path / "unpatched" / SPEC_FILE).exists()


def test_the_cli_loader_says_a_folder_was_saved_retrofitted(tmp_path: Path) -> None:
    model = _tiny("sdpa")
    with retrofitted(model, "oa", TAU, eps=EPS):
        model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=f"retrofitted model.*{SPEC_FILE}.*loaded here unpatched"):
        loaded = load_model(str(tmp_path))
    assert Retrofit.of(loaded) is None


def test_from_pretrained_refuses_a_folder_without_a_spec(tmp_path: Path) -> None:
    _tiny("sdpa").save_pretrained(tmp_path)
    with pytest.raises(RetrofitError, match=f"holds no {SPEC_FILE}.*not saved from a retrofitted"):
        oretrofit.from_pretrained(tmp_path)
