"""Weight averaging: the mean of every float parameter, exact for equal inputs, loud on mismatches."""

import dataclasses

import pytest
import torch

from oretrofit.demo_host.average import average_checkpoints
from oretrofit.demo_host.inference import inference_config
from oretrofit.demo_host.train import build_host, save_tabpfn_checkpoint
from oretrofit.hosts.tabpfn.checkpoints import build_model, load_checkpoint

from .test_train import TINY


def _checkpoint(path, seed, host=TINY.host, preset=None):
    model = build_host(host, seed)
    meta = {"steps": 10 + seed, "elapsed_s": 5.0, "seed": seed}
    inference = inference_config(preset) if preset else None
    return save_tabpfn_checkpoint(model, host, path, meta, inference)


def test_average_is_the_parameter_mean_and_loads_in_tabpfn(tmp_path):
    a, b = _checkpoint(tmp_path / "a-v3.ckpt", 0), _checkpoint(tmp_path / "b-v3.ckpt", 1)
    out = average_checkpoints([a, b], tmp_path / "avg-v3.ckpt")
    sa, sb = load_checkpoint(a)["state_dict"], load_checkpoint(b)["state_dict"]
    avg = load_checkpoint(out)
    n_float = 0
    for name, value in avg["state_dict"].items():
        if value.is_floating_point():
            n_float += 1
            torch.testing.assert_close(value, (sa[name] + sb[name]) / 2, rtol=0, atol=1e-7)
        else:
            assert torch.equal(value, sa[name])
    assert n_float > 10
    assert any(not torch.equal(sa[k], sb[k]) for k in sa)    # the inputs do differ
    assert avg["oretrofit"]["steps"] == 21
    assert [e["oretrofit"]["seed"] for e in avg["oretrofit"]["averaged_from"]] == [0, 1]
    assert avg["config"] == load_checkpoint(a)["config"]
    build_model(avg)                                    # strict load into tabpfn's v3 class


def test_average_of_copies_is_the_checkpoint_itself(tmp_path):
    a = _checkpoint(tmp_path / "a-v3.ckpt", 3)
    out = average_checkpoints([a, a, a], tmp_path / "avg-v3.ckpt")
    sa, avg = load_checkpoint(a)["state_dict"], load_checkpoint(out)["state_dict"]
    assert all(torch.equal(avg[k], sa[k]) for k in sa)
    safetensors = load_checkpoint(average_checkpoints([a, a], tmp_path / "avg-v3.safetensors"))
    assert all(torch.equal(safetensors["state_dict"][k], sa[k]) for k in sa)


def test_mismatched_inputs_are_refused(tmp_path):
    a = _checkpoint(tmp_path / "a-v3.ckpt", 0)
    wider = dataclasses.replace(TINY.host, embed_dim=24)
    other_host = _checkpoint(tmp_path / "wide-v3.ckpt", 0, host=wider)
    with pytest.raises(ValueError, match="config"):
        average_checkpoints([a, other_host], tmp_path / "avg-v3.ckpt")
    other_preset = _checkpoint(tmp_path / "plain-v3.ckpt", 1, preset="plain")
    with pytest.raises(ValueError, match="--inference"):
        average_checkpoints([a, other_preset], tmp_path / "avg-v3.ckpt")
    with pytest.raises(ValueError, match="at least two"):
        average_checkpoints([a], tmp_path / "avg-v3.ckpt")
    with pytest.raises(ValueError, match="must contain 'v3'"):
        average_checkpoints([a, a], tmp_path / "average.ckpt")
    assert not (tmp_path / "avg-v3.ckpt").exists() and not (tmp_path / "average.ckpt").exists()


def test_cli_writes_the_average_and_reports_errors(tmp_path):
    from typer.testing import CliRunner

    from oretrofit.cli.app import app

    a, b = _checkpoint(tmp_path / "a-v3.ckpt", 0), _checkpoint(tmp_path / "b-v3.ckpt", 1)
    result = CliRunner().invoke(app, ["demo-host", "average", str(a), str(b), "--out", str(tmp_path / "avg-v3.ckpt")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "avg-v3.ckpt").exists()
    result = CliRunner().invoke(app, ["demo-host", "average", str(a), "--out", str(tmp_path / "x-v3.ckpt")])
    assert result.exit_code == 2 and "at least two" in result.output
