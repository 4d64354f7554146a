"""Checkpoints in tabdpt's format: the vendor's estimators load what the tests write."""

from __future__ import annotations

import pytest
import torch

from oretrofit.tabdpt import TINY, checkpoint_config, random_model


def test_the_vendor_loads_the_random_checkpoint_weight_for_weight(checkpoint):
    from tabdpt import TabDPTClassifier
    loaded = TabDPTClassifier(model_weight_path=str(checkpoint), device="cpu").model
    written = random_model(checkpoint_config(), seed=0)
    assert loaded.state_dict().keys() == written.state_dict().keys()
    assert all(torch.equal(v, written.state_dict()[k]) for k, v in loaded.state_dict().items())
    assert (loaded.num_features, loaded.n_out, loaded.n_thinking_rows) == (
        TINY["max_num_features"], TINY["max_num_classes"], TINY["n_thinking_rows"])


def test_every_branch_the_vendor_zero_initialises_has_weights(model):
    for layer in model.transformer_encoder:
        for linear in (layer.out_proj, layer.q_gate, layer.ff.down):
            assert linear.weight.abs().min() > 0
        assert not torch.equal(layer.attn_norm.bias, torch.zeros_like(layer.attn_norm.bias))


def test_seeds_give_different_models_and_the_same_seed_the_same():
    a, b, c = (random_model(checkpoint_config(), seed=s).state_dict() for s in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_an_unknown_config_entry_is_refused_by_name():
    assert checkpoint_config(nlayers=3)["model"]["nlayers"] == 3
    with pytest.raises(ValueError, match=r"unknown TabDPT config entries \['n_layers'\]"):
        checkpoint_config(n_layers=3)
