"""A classifier starts from a regressor's weights: shared tensors copied, class embeddings from its target encoders."""

import dataclasses

import pytest
import torch

from oretrofit.demo_host.train import HostConfig, build_host
from oretrofit.demo_host.warm_start import ENCODERS, class_values, regressor_weights, warm_start

from .test_train import TINY


def test_class_values_spread_the_first_classes_apart():
    assert class_values(5).tolist() == [-2.0, 0.0, -1.0, 1.0, -1.5]
    assert len(set(class_values(10).tolist())) == 10


def test_shared_tensors_are_copied_and_class_embeddings_come_from_the_target_encoders():
    regressor = build_host(TINY.host, seed=1).state_dict()
    classifier = build_host(TINY.host, seed=2, task="classifier")
    before = {k: v.clone() for k, v in classifier.state_dict().items()}
    info = warm_start(classifier, regressor)
    after = classifier.state_dict()
    assert info["fresh"] == sorted(k for k in after if k.startswith("many_class_decoder."))
    for key, value in after.items():
        if key in regressor and regressor[key].shape == value.shape:
            assert torch.equal(value, regressor[key]), key
        elif key.startswith("many_class_decoder."):
            assert torch.equal(value, before[key]), key          # the read-out keeps its initialisation
    for encoder in ENCODERS:
        table = after[f"{encoder}.embedding.weight"]
        expected = class_values(table.shape[0])[:, None] * regressor[f"{encoder}.weight"][:, 0] \
            + regressor[f"{encoder}.bias"]
        torch.testing.assert_close(table, expected, rtol=0, atol=0)


def test_a_regressor_of_another_size_is_refused():
    other = dataclasses.replace(TINY.host, embed_dim=8)
    with pytest.raises(ValueError, match="same size"):
        warm_start(build_host(TINY.host, 0, "classifier"), build_host(other, 0).state_dict())


def test_a_classifier_checkpoint_is_not_a_warm_start(tmp_path):
    from oretrofit.demo_host.train import save_tabpfn_checkpoint

    path = save_tabpfn_checkpoint(build_host(TINY.host, 0, "classifier"), TINY.host,
                                  tmp_path / "tabpfn-v3-c.ckpt", {})
    with pytest.raises(ValueError, match="classifier checkpoint"):
        regressor_weights(path)
