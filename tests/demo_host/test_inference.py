"""Inference presets: what each one sets, that tabpfn runs a host with it, and how checkpoints carry one."""

import numpy as np
import pytest
import torch
import typer

from oretrofit.demo_host.evaluate import SUITES, evaluate, host_inference
from oretrofit.demo_host.inference import (DEFAULT_PRESET, PRESETS, inference_config, inference_overrides,
                                           preset_of)
from oretrofit.tabpfn import write_random_checkpoint
from oretrofit.hosts.tabpfn.checkpoints import default_inference_config


def test_the_default_preset_is_what_checkpoints_carried_so_far():
    assert DEFAULT_PRESET == "v2.5"
    assert inference_config("v2.5") == default_inference_config()
    assert preset_of(default_inference_config()) == "v2.5"
    assert preset_of({"FINGERPRINT_FEATURE": True}) is None


def test_each_preset_is_distinct_and_round_trips():
    configs = {name: inference_config(name) for name in PRESETS}
    assert len({repr(c) for c in configs.values()}) == len(PRESETS)
    assert all(preset_of(config) == name for name, config in configs.items())


def test_the_plain_presets_show_the_host_only_what_its_prior_showed():
    for name in ("plain", "plain-quantile", "v2.5-no-fingerprint"):
        assert inference_config(name)["FINGERPRINT_FEATURE"] is False
    assert inference_config("v2.5")["FINGERPRINT_FEATURE"] is True
    plain = inference_config("plain")["PREPROCESS_TRANSFORMS"]
    assert [m["name"] for m in plain] == ["none"] and plain[0]["append_original"] is False
    members = inference_config("plain-quantile")["PREPROCESS_TRANSFORMS"]
    assert [m["name"] for m in members] == ["none", "quantile_uni_coarse"]
    assert not any(m["append_original"] for m in members)
    # Everything a preset does not name stays at the v2.5 default.
    v25, plain_all = inference_config("v2.5"), inference_config("plain")
    assert {k for k in v25 if v25[k] != plain_all[k]} == {"FINGERPRINT_FEATURE", "PREPROCESS_TRANSFORMS"}


def test_no_ypower_presets_keep_only_the_raw_target_member():
    assert inference_config("v2.5")["REGRESSION_Y_PREPROCESS_TRANSFORMS"] == (None, "safepower")
    for name in PRESETS:
        if name.endswith("-no-ypower"):
            config, base = inference_config(name), inference_config(name.removesuffix("-no-ypower"))
            assert config["REGRESSION_Y_PREPROCESS_TRANSFORMS"] == (None,)
            assert {k for k in config if config[k] != base[k]} == {"REGRESSION_Y_PREPROCESS_TRANSFORMS"}


def test_an_unknown_preset_is_refused_with_the_choices():
    for call in (inference_config, inference_overrides):
        with pytest.raises(ValueError, match="unknown inference preset 'fancy'; choose from v2.5, "):
            call("fancy")


def test_tabpfn_runs_the_host_with_the_preset(tmp_path):
    from tabpfn import TabPFNRegressor

    host = write_random_checkpoint(tmp_path / "tabpfn-v3-host.ckpt", "small", seed=0)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = X[:, 0] + 0.1 * rng.normal(size=40)
    model = TabPFNRegressor(model_path=str(host), device="cpu", n_estimators=2, random_state=0,
                            inference_config=inference_overrides("plain"))
    pred = model.fit(X[:30], y[:30]).predict(X[30:])
    assert pred.shape == (10,) and np.isfinite(pred).all()
    used = model.get_inference_config()
    assert used.FINGERPRINT_FEATURE is False
    assert [m.name for m in used.PREPROCESS_TRANSFORMS] == ["none"]


def test_receipts_record_each_hosts_preset(tmp_path):
    host = write_random_checkpoint(tmp_path / "tabpfn-v3-host.ckpt", "small", seed=0)
    assert host_inference(host, None) == "v2.5"
    assert host_inference(host, "plain") == "plain"
    with pytest.raises(ValueError, match="unknown inference preset"):
        host_inference(host, "fancy")
    receipt = evaluate({"host": host}, ["sklearn:friedman3"], n_seeds=1, max_train_rows=40,
                       inference="plain-quantile", log=lambda _: None)
    assert receipt["hosts"]["host"]["inference"] == "plain-quantile"


def test_export_writes_the_chosen_preset_and_the_cli_names_the_suites(tmp_path):
    import dataclasses

    from typer.testing import CliRunner

    from oretrofit.cli.demo_host import register
    from oretrofit.demo_host.train import export_checkpoint, train

    from .test_train import TINY

    train(tmp_path / "run", dataclasses.replace(TINY, max_steps=1), progress=False)
    out = export_checkpoint(tmp_path / "run", tmp_path / "tabpfn-v3-plain.ckpt", "plain")
    checkpoint = torch.load(out, weights_only=True)
    assert preset_of(checkpoint["inference_config"]) == "plain"
    assert checkpoint["oretrofit"]["inference"] == "plain"
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["demo-host", "export", "--run", str(tmp_path / "run"), "--out",
                                      str(tmp_path / "tabpfn-v3-x.ckpt"), "--inference", "fancy"])
    output = " ".join(result.output.replace("│", " ").split())      # the usage error's box
    assert result.exit_code == 2 and "unknown inference preset 'fancy'; choose from v2.5" in output
    assert not (tmp_path / "tabpfn-v3-x.ckpt").exists()
    assert set(SUITES["validation"]).isdisjoint(SUITES["evaluation"])


def test_the_random_reference_runs_with_the_trained_checkpoints_preset(tmp_path, monkeypatch):
    import dataclasses

    from oretrofit.demo_host.evaluate import random_reference_host
    from oretrofit.demo_host.train import export_checkpoint, train

    from .test_train import TINY

    monkeypatch.setenv("ORETROFIT_CACHE_DIR", str(tmp_path / "cache"))
    train(tmp_path / "run", dataclasses.replace(TINY, max_steps=1), progress=False)
    trained = export_checkpoint(tmp_path / "run", tmp_path / "tabpfn-v3-plain.ckpt", "plain-no-ypower")
    reference = random_reference_host(trained)
    assert reference.parent == tmp_path / "cache"
    assert host_inference(reference, None) == host_inference(trained, None) == "plain-no-ypower"


def test_a_preset_name_can_fix_the_ensemble_size():
    sized, base = inference_config("v2-no-ypower-x16"), inference_config("v2-no-ypower")
    assert base["N_ESTIMATORS"] == "auto" and sized["N_ESTIMATORS"] == 16
    assert {k for k in sized if sized[k] != base[k]} == {"N_ESTIMATORS"}
    assert preset_of(sized) == "v2-no-ypower-x16" and preset_of(base) == "v2-no-ypower"
    assert preset_of({**sized, "N_ESTIMATORS": 0}) is None
    for name in ("v2-no-ypower-x0", "v2-no-ypower-x", "fancy-x16", "v2-no-ypower-x16-x2"):
        with pytest.raises(ValueError, match="unknown inference preset .*-xN for N ensemble members"):
            inference_overrides(name)


def test_a_checkpoints_ensemble_size_is_tabpfns_default_and_an_explicit_count_wins(tmp_path):
    from tabpfn import TabPFNRegressor

    from oretrofit.tabpfn import make_regressor

    path = write_random_checkpoint(tmp_path / "tabpfn-v3-host.ckpt", "small", seed=0)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["inference_config"] = inference_config("plain-no-ypower-x3")
    torch.save(checkpoint, path)
    assert host_inference(path, None) == "plain-no-ypower-x3"
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 2)), rng.normal(size=40)
    carried = TabPFNRegressor(model_path=str(path), device="cpu", random_state=0).fit(X[:30], y[:30])
    explicit, _ = make_regressor(path, "base", n_estimators=1)            # oretrofit's runners pass a count
    explicit.fit(X[:30], y[:30])
    assert carried.n_estimators_ == 3 and explicit.n_estimators_ == 1
    assert np.isfinite(carried.predict(X[30:])).all() and np.isfinite(explicit.predict(X[30:])).all()
