"""Reliability, round 4, checkpoints: an architecture config is checked against the weights
before any model is built, an unknown config key is refused by name, a FIFO or device is
refused without opening it, and bytes that are no checkpoint are called so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oretrofit._surgery.registry import RetrofitError
from oretrofit.hosts.tabpfn.checkpoints import load_checkpoint, resolve_model_path


def _edited(small_ckpt: Path, folder: Path, **config) -> Path:
    checkpoint = torch.load(small_ckpt, weights_only=True)
    checkpoint["config"].update(config)
    path = folder / "tabpfn-v3-edited.ckpt"
    torch.save(checkpoint, path)
    return path


def test_an_unknown_architecture_key_is_refused_by_name(small_ckpt, tmp_path):
    path = _edited(small_ckpt, tmp_path, emb_dim=64)
    with pytest.raises(RetrofitError, match=r"tabpfn-v3-edited.ckpt: the architecture config "
                                            r"has keys TabPFN v3 \(tabpfn .*\) does not know: "
                                            r"emb_dim; they would be ignored"):
        load_checkpoint(path)


def test_a_config_larger_than_its_weights_is_refused_before_any_model_is_built(small_ckpt,
                                                                               tmp_path):
    """embed_dim 512 × nlayers 8 would allocate about 1 GiB; load_checkpoint builds nothing
    (only a meta-device model) and names the first tensor that differs."""
    path = _edited(small_ckpt, tmp_path, embed_dim=512, nlayers=8)
    with pytest.raises(RetrofitError, match=r"its architecture config does not describe its "
                                            r"weights: tensor 'col_y_encoder.bias' has shape "
                                            r"\(32,\), the config asks for \(512,\); "
                                            r"re-download"):
        load_checkpoint(path)


def test_non_finite_weights_are_named_each_with_their_count(small_ckpt, tmp_path):
    """Only the first NaN tensor was named, without how many of its values."""
    checkpoint = torch.load(small_ckpt, weights_only=True)
    state = checkpoint["state_dict"]
    state["col_y_encoder.bias"][:3] = float("nan")
    state["col_y_encoder.weight"].view(-1)[0] = float("inf")
    path = tmp_path / "tabpfn-v3-nan.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(RetrofitError, match=r"tabpfn-v3-nan.ckpt: 2 tensor\(s\) hold NaN or "
                                            r"infinite values: 'col_y_encoder.weight' \(1 of "
                                            r"\d+ values\), 'col_y_encoder.bias' \(3 of 32 "
                                            r"values\); re-download"):
        load_checkpoint(path)


def test_a_special_file_as_checkpoint_is_refused_without_reading_it(special_file):
    path, what = special_file
    with pytest.raises(RetrofitError, match=rf"checkpoint {path} is {what}, not a regular file; "
                                            r"pass a TabPFN .ckpt or .safetensors file"):
        resolve_model_path(path)


def test_random_bytes_are_no_checkpoint_not_pickled_objects(tmp_path):
    path = tmp_path / "tabpfn-v3-noise.ckpt"
    path.write_bytes(bytes(range(256)) * 16)
    with pytest.raises(RetrofitError, match=r"is not a checkpoint: neither a torch file nor "
                                            r"safetensors .*re-download or re-create it"):
        load_checkpoint(path)
