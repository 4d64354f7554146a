"""A retrofit notices when the model changed under it: a patched module the user replaces, or
whose class the user sets, makes the next forward refuse (naming the module, the sites it held
and the fix) and ``report()`` give those sites as changed, on every host that patches modules;
``revert()`` then leaves what the user put in place as they set it."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from oretrofit import Retrofit, RetrofitError, retrofit
from oretrofit.hosts.transformers.inputs import zero_padded_inputs
from oretrofit.hosts.transformers.measures import load_minilm

REFUSAL = r"changed after it was retrofitted: {}.*revert the retrofit.*retrofit the changed model"


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()


def _encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def _states(report: list[dict]) -> dict[str, str]:
    return {row["site"]: row["state"] for row in report}


def _reverted_quietly(r: Retrofit) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return r.revert()


def test_a_minilm_attention_replaced_after_retrofit_is_refused_and_reported():
    """The replaced attention would run unpatched (its padding no longer inert); the forward
    refuses, the report names its sites, revert keeps the user's module, and retrofitting the
    changed model again makes the padding inert again."""
    model, tokenizer = load_minilm()
    fresh = copy.deepcopy(model.encoder.layer[3].attention)
    r = retrofit(model, "full-o")
    model.encoder.layer[3].attention = fresh
    rows = [[101, 2023, 2003, 1037, 3231, 102], [101, 7592, 102]]
    with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(
            r"encoder\.layer\.3\.attention \(replaced by another BertAttention")) as refused:
        model(**zero_padded_inputs(model, rows))
    assert "encoder.layer.3.attention.self" in str(refused.value)
    changed = {site: state for site, state in _states(r.report()).items() if state != "patched"}
    assert set(changed) == {"encoder.layer.3.attention.self",
                            "encoder.layer.3.attention.output.LayerNorm"}
    assert all(state.startswith("changed: encoder.layer.3.attention (replaced")
               for state in changed.values())
    with pytest.warns(UserWarning, match=r"encoder\.layer\.3\.attention: replaced.*as you set"):
        r.revert()
    assert model.encoder.layer[3].attention is fresh and not model._forward_pre_hooks
    retrofit(model, "full-o")
    with torch.no_grad():
        batch = model(**zero_padded_inputs(model, rows)).last_hidden_state
        alone = model(**zero_padded_inputs(model, rows[1:])).last_hidden_state
    assert torch.allclose(batch[1, :3], alone[0], atol=1e-5)
    assert torch.equal(batch[1, 3:], torch.zeros_like(batch[1, 3:]))


def test_a_llama_mlp_replaced_by_a_sequential_is_refused_naming_it():
    model = _llama()
    r = retrofit(model, "full-o")
    model.model.layers[1].mlp = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 32))
    with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(
            r"model\.layers\.1\.mlp \(replaced by another Sequential.*sites model\.layers\.1\.mlp")):
        model(torch.tensor([[5, 6, 7]]))
    assert _states(r.report())["model.layers.1.mlp"].startswith("changed: model.layers.1.mlp")
    assert _states(r.report())["model.layers.0.mlp"] == "patched"


def test_a_whole_layer_replaced_is_refused_for_every_site_it_held():
    model = _llama()
    other = copy.deepcopy(model.model.layers[0])
    r = retrofit(model, "full-o")
    model.model.layers[0] = other
    with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(
            r"model\.layers\.0 \(replaced by another LlamaDecoderLayer")):
        model(torch.tensor([[5, 6, 7]]))
    changed = [site for site, state in _states(r.report()).items() if state != "patched"]
    assert changed and all(site.startswith("model.layers.0.") for site in changed)


def test_a_patched_module_whose_class_is_set_is_refused_and_revert_keeps_that_class():
    model = _llama()
    attention = model.model.layers[0].self_attn
    retrofit(model, "full-o")
    attention.__class__ = type("MyAttention", (type(attention).__bases__[-1],), {})
    with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(
            r"model\.layers\.0\.self_attn \(its class was set to MyAttention")):
        model(torch.tensor([[5, 6, 7]]))
    with pytest.warns(UserWarning, match="its class was set to MyAttention"):
        Retrofit.of(model).revert()
    assert type(attention).__name__ == "MyAttention" and "_oretrofit" not in vars(attention)


def test_a_module_put_back_as_it_was_runs_and_reverts_without_a_word():
    model = _llama()
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        before = model(ids).logits
        r = retrofit(model, "full-o")
        patched = model(ids).logits
        mlp = model.model.layers[1].mlp
        model.model.layers[1].mlp = nn.Identity()
        model.model.layers[1].mlp = mlp
        assert torch.equal(model(ids).logits, patched)
        assert set(_states(r.report()).values()) == {"patched"}
        _reverted_quietly(r)
        assert torch.equal(model(ids).logits, before)


def test_the_torch_nn_host_refuses_a_replaced_attention_and_a_reclassed_norm():
    x = torch.randn(2, 5, 16)
    model = _encoder()
    r = retrofit(model, "full-o")
    model.layers[0].self_attn = nn.MultiheadAttention(16, 2, batch_first=True)
    with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(
            r"layers\.0\.self_attn \(replaced by another MultiheadAttention")):
        model(x)
    assert _states(r.report())["layers.0.self_attn"].startswith("changed: layers.0.self_attn")
    with pytest.warns(UserWarning):
        r.revert()
    r = retrofit(model, "full-o")
    model.layers[1].norm2.__class__ = type("MyNorm", (nn.LayerNorm,), {})
    with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(
            r"layers\.1\.norm2 \(its class was set to MyNorm")):
        model(x)


def test_a_submodule_called_alone_refuses_a_change_beneath_it():
    """A call into a module on the path to patched ones (the decoder stack, one layer) tests the
    modules under it as a call of the model does; a submodule with nothing changed beneath it
    runs; revert takes every check off, the modules the user took out of the model included."""
    model = _llama()
    r = retrofit(model, "full-o")
    taken_out = model.model.layers[1]
    model.model.layers[1] = LlamaDecoderLayer(model.config, 1)
    with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(
            r"model\.layers\.1 \(replaced by another LlamaDecoderLayer")):
        model.model(torch.tensor([[5, 6, 7]]))
    changed = {site for site, state in _states(r.report()).items() if state != "patched"}
    assert changed and all(site.startswith("model.layers.1.") for site in changed)
    with pytest.warns(UserWarning, match=r"model\.layers\.1: replaced"):
        r.revert()
    assert not any(m._forward_pre_hooks for m in [*model.modules(), *taken_out.modules()])
    x = torch.randn(2, 5, 16)
    encoder = _encoder()
    retrofit(encoder, "full-o")
    encoder.layers[0].self_attn = nn.MultiheadAttention(16, 2, batch_first=True)
    with torch.no_grad():
        with pytest.raises(RetrofitError, match=REFUSAL.format(r"layers\.0\.self_attn")):
            encoder.layers[0](x)
        encoder.layers[1](x)


def test_a_copy_of_a_retrofitted_model_notices_a_change_made_to_the_copy():
    """The record travels with pickle and deepcopy: a change to the copy is refused before
    its handle was ever used, and the original runs on."""
    x = torch.randn(2, 5, 16)
    model = _encoder()
    retrofit(model, "full-o")
    for copied in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        copied.layers[1] = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        with torch.no_grad(), pytest.raises(RetrofitError, match=REFUSAL.format(r"layers\.1 ")):
            copied(x)
        with torch.no_grad():
            model(x)


def test_a_tabpfn_block_replaced_after_retrofit_is_refused(table, tmp_path, monkeypatch):
    monkeypatch.setenv("ORETROFIT_CACHE_DIR", str(tmp_path))
    from oretrofit.tabpfn import build_model, load_checkpoint, make_regressor, resolve_model_path
    x_train, y_train, x_test = table
    regressor, r = make_regressor("demo", "full-o", random_state=0, device="cpu", n_estimators=1)
    unpatched, _, _ = build_model(load_checkpoint(resolve_model_path("demo")))
    r.model.icl_blocks[1] = unpatched.icl_blocks[1]
    with pytest.raises(RetrofitError, match=REFUSAL.format(
            r"icl_blocks\.1 \(replaced by another ICLTransformerBlock.*icl\.1\.attn")):
        regressor.fit(x_train, y_train).predict(x_test)
    assert _states(r.report())["icl.1.attn"].startswith("changed: icl_blocks.1")
    assert _states(r.report())["icl.0.attn"] == "patched"


@pytest.fixture(scope="module")
def table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4))
    y = x @ rng.normal(size=4)
    return x[:30], y[:30], x[30:]
