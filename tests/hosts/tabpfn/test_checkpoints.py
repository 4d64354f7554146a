"""Checkpoint files: random hosts in tabpfn's format, path resolution and validation."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil

import numpy as np
import pytest
import numpy as np
import torch

from oretrofit import RetrofitError
from oretrofit.tabpfn import (build_model, checkpoint_sha256, load_checkpoint, resolve_model_path,
                              weights_label, write_random_checkpoint)
from oretrofit.hosts.tabpfn import checkpoints, releases

from . import FAST


def test_random_checkpoint_is_a_tabpfn_checkpoint(small_ckpt):
    from tabpfn.model_loading import load_model
    model, _, config, _ = load_model(path=small_ckpt, **releases.load_model_kwargs("regressor"))
    n_params = sum(p.numel() for p in model.parameters())
    assert 1.0e6 < n_params < 2.5e6 and config.nlayers == 4
    state = model.state_dict()
    rerandomised = [k for k in state if k.endswith(checkpoints._ZERO_INIT_SUFFIXES)]
    assert len(rerandomised) > 20 and all(state[k].abs().sum() > 0 for k in rerandomised)
    assert weights_label(load_checkpoint(small_ckpt)) == "random weights (size small, seed 0)"


def test_random_checkpoint_is_deterministic_in_seed(small_ckpt, tmp_path):
    again = write_random_checkpoint(tmp_path / "tabpfn-v3-a.ckpt", "small", seed=0)
    other = write_random_checkpoint(tmp_path / "tabpfn-v3-b.ckpt", "small", seed=1)
    ref, same, diff = (load_checkpoint(p)["state_dict"] for p in (small_ckpt, again, other))
    assert all(torch.equal(ref[k], same[k]) for k in ref)
    assert not all(torch.equal(ref[k], diff[k]) for k in ref)


def test_safetensors_checkpoint(tmp_path):
    target = tmp_path / "tabpfn-v3-s.safetensors"
    if importlib.util.find_spec("tabpfn.checkpoint") is None:      # e.g. tabpfn 8.0.1: .ckpt only
        with pytest.raises(RetrofitError, match=rf"{releases.installed_version()} neither reads "
                                                r"nor writes \.safetensors.*write a \.ckpt"):
            write_random_checkpoint(target, "small", seed=0)
        assert list(tmp_path.iterdir()) == []                       # no temporary file left
        return
    path = write_random_checkpoint(target, "small", seed=0)
    assert resolve_model_path(path) == path
    assert load_checkpoint(path)["architecture_name"] == "tabpfn_v3"


def test_random_and_demo_hosts(monkeypatch, caplog, small_ckpt, tmp_path):
    random_path = resolve_model_path("random")
    assert "v3" in random_path.name and "random" in random_path.name
    assert random_path.parent == checkpoints.cache_dir()
    monkeypatch.setattr(checkpoints, "DEMO_CHECKPOINT", tmp_path / "tabpfn-v3-demo.ckpt")
    assert resolve_model_path("demo") == random_path
    assert [r.levelname for r in caplog.records] == ["WARNING"]       # a notice, not a result
    assert "RANDOM-WEIGHTS" in caplog.text
    shutil.copy(small_ckpt, tmp_path / "tabpfn-v3-demo.ckpt")
    assert resolve_model_path("demo") == tmp_path / "tabpfn-v3-demo.ckpt"


def test_no_downloaded_checkpoint_says_how_to_get_one(monkeypatch, tmp_path, small_ckpt):
    import tabpfn.model_loading as ml
    monkeypatch.setattr(ml, "get_cache_dir", lambda: tmp_path)
    with pytest.raises(RetrofitError, match=r"(?s)Prior-Labs/tabpfn_3.*--model-path"):
        resolve_model_path(None)
    shutil.copy(small_ckpt, tmp_path / checkpoints.DEFAULT_CHECKPOINT_NAME)
    assert resolve_model_path(None) == tmp_path / checkpoints.DEFAULT_CHECKPOINT_NAME
    assert resolve_model_path(checkpoints.DEFAULT_CHECKPOINT_NAME) == \
        tmp_path / checkpoints.DEFAULT_CHECKPOINT_NAME


def test_bad_paths_get_clear_errors(tmp_path, small_ckpt):
    with pytest.raises(RetrofitError, match="does not exist"):
        resolve_model_path(tmp_path / "tabpfn-v3-missing.ckpt")
    shutil.copy(small_ckpt, tmp_path / "model.ckpt")
    with pytest.raises(RetrofitError, match="must contain 'v3'"):
        resolve_model_path(tmp_path / "model.ckpt")
    shutil.copy(small_ckpt, tmp_path / "tabpfn-v3.5-x.ckpt")
    with pytest.raises(RetrofitError, match="v3.5"):
        resolve_model_path(tmp_path / "tabpfn-v3.5-x.ckpt")
    (tmp_path / "tabpfn-v3-corrupt.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(RetrofitError, match="corrupt"):
        resolve_model_path(tmp_path / "tabpfn-v3-corrupt.ckpt")
    torch.save({"state_dict": {}, "config": {}, "code": RetrofitError("x")},
               tmp_path / "tabpfn-v3-pickle.ckpt")
    with pytest.raises(RetrofitError, match="weights-only"):
        resolve_model_path(tmp_path / "tabpfn-v3-pickle.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "tabpfn-v3-partial.ckpt")
    with pytest.raises(RetrofitError, match="lacks one of"):
        resolve_model_path(tmp_path / "tabpfn-v3-partial.ckpt")
    # a config written by a newer tabpfn (a field this one lacks) is refused before tabpfn
    # would fail on it with a bare TypeError
    newer = dict(torch.load(small_ckpt, weights_only=True))
    newer["inference_config"] = {**newer["inference_config"], "A_FUTURE_FIELD": 1}
    torch.save(newer, tmp_path / "tabpfn-v3-newer.ckpt")
    with pytest.raises(RetrofitError, match=r"tabpfn-v3-newer\.ckpt: .*cannot express another "
                                            r"way \(A_FUTURE_FIELD=1\).*pip install -U 'tabpfn"):
        resolve_model_path(tmp_path / "tabpfn-v3-newer.ckpt")


def test_checkpoint_sha256(small_ckpt):
    assert checkpoint_sha256(small_ckpt) == hashlib.sha256(small_ckpt.read_bytes()).hexdigest()


def test_same_weights_give_identical_bytes(small_ckpt, tmp_path):
    checkpoint = dict(load_checkpoint(small_ckpt))
    first = checkpoints.save_atomic(checkpoint, tmp_path / "tabpfn-v3-first.ckpt")
    second = checkpoints.save_atomic(checkpoint, tmp_path / "tabpfn-v3-second.ckpt")
    assert first.read_bytes() == second.read_bytes()
    assert checkpoint_sha256(first) == checkpoint_sha256(small_ckpt)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _with_config(small_ckpt, path, **config):
    checkpoint = torch.load(small_ckpt, weights_only=True)
    checkpoint["config"].update(config)
    torch.save(checkpoint, path)
    return path


def test_another_releases_chunking_keys_at_their_defaults_load_and_other_values_are_refused(
        small_ckpt, tmp_path):
    """Whatever release is installed, it lacks the chunking keys of some other release (8.0.1 to
    9.0.0: inference_row_chunk_size; 9.1.0 on: inference_chunk_cells and the batch budgets);
    a checkpoint carrying all of them at their defaults loads, one at another value does not."""
    from oretrofit.hosts.tabpfn.versions import CHUNKING_KEYS
    loaded = load_checkpoint(_with_config(small_ckpt, tmp_path / "tabpfn-v3-defaults.ckpt",
                                           **CHUNKING_KEYS))
    model = build_model(loaded)[0]
    assert sum(p.numel() for p in model.parameters()) > 0
    known = set(torch.load(small_ckpt, weights_only=True)["config"])
    foreign = sorted(set(CHUNKING_KEYS) - known)
    assert foreign, "every release lacks some other release's chunking key"
    changed = {foreign[0]: CHUNKING_KEYS[foreign[0]] * 2}
    with pytest.raises(RetrofitError, match=rf"does not know: {foreign[0]}; they would be "
                                            "ignored"):
        load_checkpoint(_with_config(small_ckpt, tmp_path / "tabpfn-v3-changed.ckpt", **changed))


def test_the_shipped_demo_host_runs_its_own_inference_settings_on_this_release():
    """The demo checkpoint (its inference config written by tabpfn 9.2.0) fits sklearn's
    diabetes on every admitted release with the ensemble it asks for: its N_ESTIMATORS and
    SOFTMAX_TEMPERATURE are the estimator's (tabpfn 8.x: by the arguments of those names),
    and full-o is base within scripts/tabpfn_compat.py's bound (1e-4 relative, one estimator,
    float32). tabpfn loads a file whose inference config holds only fields it knows."""
    from dataclasses import fields

    from sklearn.datasets import load_diabetes
    from tabpfn.inference_config import InferenceConfig

    from oretrofit.tabpfn import make_regressor
    stored = torch.load(checkpoints.DEMO_CHECKPOINT, weights_only=True)["inference_config"]
    x, y = load_diabetes(return_X_y=True)
    regressor, applied = make_regressor("demo", "full-o", 1e-8, random_state=0, device="cpu")
    prediction = regressor.fit(x[:300], y[:300]).predict(x[300:])
    assert prediction.shape == (142,) and np.isfinite(prediction).all()
    assert len(applied.report()) > 0
    temperature = getattr(regressor, "softmax_temperature_", regressor.softmax_temperature)
    assert (regressor.n_estimators_, temperature) == (stored["N_ESTIMATORS"],
                                                     stored["SOFTMAX_TEMPERATURE"])
    loaded = torch.load(regressor.model_path, weights_only=True)["inference_config"]
    assert set(loaded) <= {f.name for f in fields(InferenceConfig)}
    pinned = {"inference_precision": torch.float32, "random_state": 0, **FAST}
    base = make_regressor("demo", "base", **pinned)[0].fit(x[:300], y[:300]).predict(x[300:])
    full_o = (make_regressor("demo", "full-o", 1e-8, **pinned)[0].fit(x[:300], y[:300])
              .predict(x[300:]))
    assert np.abs(full_o - base).max() / np.abs(base).max() <= 1e-4


def test_a_release_copy_is_written_once_per_checkpoint_and_dropped_fields(small_ckpt, tmp_path):
    """A checkpoint carrying tabpfn 9's fields that this release lacks loads through a copy
    without them, named by the source's SHA-256 and the fields
    dropped: the same file again for the same source, the weights unchanged."""
    from dataclasses import fields

    from tabpfn.inference_config import InferenceConfig
    known = {f.name for f in fields(InferenceConfig)}
    checkpoint = torch.load(small_ckpt, weights_only=True)
    extra = {"N_ESTIMATORS": 3, "TRANSFORM_DATES": False}
    foreign = {k: v for k, v in extra.items() if k not in known}
    checkpoint["inference_config"].update(extra)
    source = tmp_path / "tabpfn-v3-nine.ckpt"
    torch.save(checkpoint, source)
    path, arguments = checkpoints.release_checkpoint(source)
    assert checkpoints.release_checkpoint(source) == (path, arguments)
    if not foreign:                                   # tabpfn 9: the file itself
        assert (path, arguments) == (source, {})
    else:
        assert path.name == source.name and path.parent.parent.name == "tabpfn-release"
        assert arguments == {"n_estimators": 3}
        copy = torch.load(path, weights_only=True)
        assert set(copy["inference_config"]) == set(checkpoint["inference_config"]) - set(foreign)
        assert all(torch.equal(copy["state_dict"][k], v)
                   for k, v in checkpoint["state_dict"].items())


def test_the_demo_classifier_is_the_shipped_trained_one_and_full_o_keeps_its_forward(caplog, classes):
    """"demo" gives the trained classifier shipped beside the demo regressor (its architecture
    with a 10-class read-out), without a random-weights warning; full-o at τ = 1e-8 predicts
    its probabilities within 1e-5 of the unpatched classifier, both in fp64 as the other
    classifier contracts (test_classifier.py): in fp32 tabpfn's own pipeline moves these
    probabilities by ~1e-2 between precisions, so any reordering of fp32 sums does too. Its
    inference config was written by tabpfn 9.2.0: tabpfn 8.x runs it as the regressor's
    (test_the_shipped_demo_host_runs_its_own_inference_settings_on_this_release)."""
    from dataclasses import asdict

    from oretrofit.demo_host.train import HostConfig
    from oretrofit.tabpfn import make_classifier
    path = resolve_model_path("demo", "classifier")
    assert path == checkpoints.DEMO_CLASSIFIER_CHECKPOINT and "RANDOM" not in caplog.text
    checkpoint = load_checkpoint(path)
    assert weights_label(checkpoint).startswith("demo classifier (prior-fitted, ")
    assert checkpoints.checkpoint_task(checkpoint) == "classifier"
    config = checkpoint["config"]
    assert {k: config[k] for k in asdict(HostConfig())} == asdict(HostConfig())
    assert config["max_num_classes"] == checkpoints.RANDOM_CLASSIFIER_CLASSES
    x_train, y_train, x_test = classes
    fp64 = {"inference_precision": torch.float64, "random_state": 0}
    base, _ = make_classifier("demo", arm="base", **fp64, **FAST)
    patched, applied = make_classifier("demo", arm="full-o", tau=1e-8, **fp64, **FAST)
    expected = base.fit(x_train, y_train).predict_proba(x_test)
    np.testing.assert_allclose(patched.fit(x_train, y_train).predict_proba(x_test), expected, rtol=0, atol=1e-5)
    assert len(applied.report()) > 0 and "RANDOM" not in caplog.text


def test_a_missing_demo_classifier_falls_back_to_the_random_host_with_a_warning(caplog, monkeypatch,
                                                                                tmp_path):
    monkeypatch.setattr(checkpoints, "DEMO_CLASSIFIER_CHECKPOINT", tmp_path / "tabpfn-v3-demo-classifier.ckpt")
    path = resolve_model_path("demo", "classifier")
    assert "RANDOM-WEIGHTS" in caplog.text and path == resolve_model_path("random", "classifier")


def test_a_killed_safetensors_write_leaves_a_scratch_folder_the_next_write_sweeps(
        small_ckpt, tmp_path, monkeypatch):
    """The scratch folder is named for this host and its process: a dead process's is swept by
    the next write, a live one's is kept."""
    import os
    import tempfile

    from oretrofit._files.atomic import TEMP_SUFFIX
    from oretrofit.hosts.tabpfn.checkpoints import save_atomic
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = os.uname().nodename.replace(".", "-")
    dead = tmp_path / f"oretrofit-safetensors.{host}.999999999.abcd{TEMP_SUFFIX}"
    live = tmp_path / f"oretrofit-safetensors.{host}.{os.getppid()}.abcd{TEMP_SUFFIX}"
    for folder in (dead, live):
        folder.mkdir()
    if importlib.util.find_spec("tabpfn.checkpoint") is None:      # e.g. tabpfn 8.0.1: .ckpt only
        with pytest.raises(RetrofitError, match=r"neither reads nor writes \.safetensors"):
            save_atomic(load_checkpoint(small_ckpt), tmp_path / "out" / "tabpfn-v3.safetensors")
        assert {p.name for p in tmp_path.glob("oretrofit-safetensors.*")} <= {dead.name, live.name}
        return
    out = save_atomic(load_checkpoint(small_ckpt), tmp_path / "out" / "tabpfn-v3.safetensors")
    assert out.stat().st_size > 0
    assert not dead.exists() and live.exists()
    assert [p.name for p in tmp_path.glob("oretrofit-safetensors.*")] == [live.name]
