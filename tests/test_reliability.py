"""Issue 33's fault catalogue through the Python API: each case gives a correct result or a
clear error that names the fix. (The CLI cases: tests/cli/test_reliability.py; run folders:
tests/regress/test_reliability.py.)"""

from __future__ import annotations

import copy
import importlib
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import joblib
import numpy as np
import pytest
import torch

import oretrofit
from oretrofit import Retrofit, RetrofitError, apply_spec, retrofit
from oretrofit.tabpfn import (build_model, load_checkpoint, load_patched_regressor,
                              make_regressor, read_patch_spec, resolve_model_path,
                              write_patched_artifact)
from oretrofit.hosts.tabpfn.artifact import ARTIFACT_KEY
from oretrofit.hosts.tabpfn.checkpoints import save_atomic
from oretrofit.hosts.torch_nn import register_module_site, unregister_module_site

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def host() -> torch.nn.Module:
    model, _, _ = build_model(load_checkpoint(resolve_model_path("demo")))
    return model


def _out(model: torch.nn.Module) -> torch.Tensor:
    """The host's output on a fixed small table (train 12 rows, test 4)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 1, 3, generator=g)                               # (rows, batch, features)
    y = torch.randn(12, 1, generator=g)
    with torch.no_grad():
        return model(x, y)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    return X, X[:, 0] - 0.5 * X[:, 1] + 0.1 * rng.normal(size=30)


# --- serialising patched models --------------------------------------------------------------

@pytest.mark.parametrize("dump", ["pickle", "torch.save", "joblib"])
def test_a_patched_module_round_trips_and_its_loaded_handle_acts_on_the_copy(host, dump):
    base = _out(host)
    r = retrofit(host, "full-o", 1.0)
    patched = _out(host)
    assert not torch.equal(patched, base)
    buffer = io.BytesIO()
    {"pickle": lambda: pickle.dump(host, buffer), "torch.save": lambda: torch.save(host, buffer),
     "joblib": lambda: joblib.dump(host, buffer)}[dump]()
    buffer.seek(0)
    loaded = {"pickle": pickle.load, "joblib": joblib.load,
              "torch.save": lambda b: torch.load(b, weights_only=False)}[dump](buffer)
    assert torch.equal(_out(loaded), patched)                        # identical outputs
    handle = Retrofit.of(loaded)
    assert handle is not r and handle.spec()["sites"] == r.spec()["sites"]
    handle.revert()
    assert torch.equal(_out(loaded), base)                           # the copy reverts ...
    assert torch.equal(_out(host), patched) and not r.reverted       # ... the original stays


def test_torch_nn_hosts_round_trip_even_when_the_root_itself_is_patched():
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    models = [torch.nn.TransformerEncoder(layer, 2).eval(),
              torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()]
    x = torch.randn(2, 5, 16)

    def run(model: torch.nn.Module) -> torch.Tensor:
        return model(x) if isinstance(model, torch.nn.TransformerEncoder) else model(x, x, x)[0]

    for model in models:
        base = run(model)
        retrofit(model, "full-o", 1.0)
        patched = run(model)
        loaded = pickle.loads(pickle.dumps(model))
        assert torch.equal(run(loaded), patched) and not torch.equal(patched, base)
        Retrofit.of(loaded).revert()
        assert torch.equal(run(loaded), base) and torch.equal(run(model), patched)


def test_a_pickle_written_before_the_hosts_moved_still_loads():
    # the host modules were oretrofit.patches.* before oretrofit/hosts/; a pickled patched module
    # names its O-class's mixin by module path, so the old paths keep loading (moved.MOVED)
    from oretrofit._surgery.moved import MOVED
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model, x = torch.nn.TransformerEncoder(layer, 2).eval(), torch.randn(2, 5, 16)
    retrofit(model, "full-o", 1.0)
    patched = model(x)
    hexed = lambda name: name.encode().hex().encode()                   # noqa: E731
    data = pickle.dumps(model, protocol=0)          # protocol 0: class names are lines of text
    assert hexed("oretrofit.hosts.torch_nn:") in data
    old = data.replace(hexed("oretrofit.hosts.torch_nn:"), hexed("oretrofit.patches.torch_nn:"))
    assert torch.equal(pickle.loads(old)(x), patched)
    for moved in MOVED.values():
        importlib.import_module(moved)


def test_a_fitted_patched_regressor_round_trips_through_pickle_and_joblib():
    X, y = _data()
    regressor, _ = make_regressor("demo", "full-o", 1.0, device="cpu", n_estimators=1)
    regressor.fit(X[:20], y[:20])
    expected = regressor.predict(X[20:])
    base, _ = make_regressor("demo", "base", device="cpu", n_estimators=1)
    assert not np.allclose(base.fit(X[:20], y[:20]).predict(X[20:]), expected, atol=1e-4)
    buffer = io.BytesIO()
    joblib.dump(regressor, buffer)
    buffer.seek(0)
    for loaded in (pickle.loads(pickle.dumps(regressor)), joblib.load(buffer)):
        np.testing.assert_array_equal(loaded.predict(X[20:]), expected)


def test_deepcopy_is_independent_revertible_and_re_retrofittable(host):
    base = _out(host)
    r = retrofit(host, "oa", 1.0)
    patched = _out(host)
    twin = copy.deepcopy(host)
    twin_handle = Retrofit.of(twin)
    assert twin_handle is not r
    twin_handle.revert()
    assert torch.equal(_out(twin), base) and torch.equal(_out(host), patched)
    again = retrofit(twin, "full-o", 1e-3)                      # the copy can be patched anew
    assert again.plan.arm == "full-o" and torch.equal(_out(host), patched)
    again.revert()
    r.revert()
    assert torch.equal(_out(host), base)
    copied = copy.deepcopy(retrofit(host, "oa", 1.0))            # copying the handle copies
    assert copied.model is not host                              # its model with it
    copied.revert()
    assert Retrofit.of(host) is not None and torch.equal(_out(host), patched)


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel
    return BertModel(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=32)).eval()


def _bert_out(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(14).reshape(2, 7) % 60
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("dump", ["pickle", "torch.save", "deepcopy"])
def test_a_hooked_transformers_retrofit_round_trips_and_reverts_on_the_copy(dump):
    model = _bert()
    base = _bert_out(model)
    r = retrofit(model, "full-o", 1.0)
    patched = _bert_out(model)
    assert not torch.equal(patched, base)
    buffer = io.BytesIO()
    if dump == "deepcopy":
        loaded = copy.deepcopy(model)
    elif dump == "pickle":
        loaded = pickle.loads(pickle.dumps(model))
    else:
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(_bert_out(loaded), patched)               # runs retrofitted as loaded
    handle = Retrofit.of(loaded)
    assert handle.spec()["sites"] == r.spec()["sites"] and len(handle.report()) == len(r.report())
    assert torch.equal(_bert_out(loaded), patched)               # re-applied: same outputs
    handle.revert()
    assert torch.equal(_bert_out(loaded), base)
    assert loaded.config._attn_implementation == "sdpa"          # the model's own again
    assert torch.equal(_bert_out(model), patched) and not r.reverted   # the original stays


def test_a_transformers_retrofit_pickled_while_releases_py_held_the_hooks_still_loads():
    # the presence capture and the gates were in hosts/transformers/releases.py before issue 54;
    # a model pickled then names them there (plainly, and hex-encoded in its O-classes' names)
    model = _bert()
    retrofit(model, "full-o", 1.0)
    patched = _bert_out(model)
    data = pickle.dumps(model, protocol=0)          # protocol 0: class names are lines of text
    old, package = data, "oretrofit.hosts.transformers"
    for name, home in (("CarrierPresence", "capture"), ("_BranchGate", "gates"),
                       ("_TableGate", "gates"), ("OGatedBias", "gates")):
        plain, hexed = f"{package}.{home}\n{name}\n".encode(), \
            f"{package}.{home}:{name}".encode().hex().encode()
        assert plain in data or hexed in data, name
        old = old.replace(plain, f"{package}.releases\n{name}\n".encode()).replace(
            hexed, f"{package}.releases:{name}".encode().hex().encode())
    assert f"{package}.releases".encode() in old and f"{package}.capture".encode() not in old
    loaded = pickle.loads(old)
    assert torch.equal(_bert_out(loaded), patched)
    Retrofit.of(loaded).revert()
    assert loaded.config._attn_implementation != "oretrofit"


def test_a_saved_transformers_retrofit_loads_in_a_fresh_process(tmp_path):
    model = _bert()
    retrofit(model, "full-o", 1.0)
    oretrofit.save(model, tmp_path / "model.pt")
    torch.save(_bert_out(model), tmp_path / "expected.pt")
    code = textwrap.dedent(f"""
        import torch
        from oretrofit import Retrofit
        model = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=False)
        ids = torch.arange(14).reshape(2, 7) % 60
        with torch.no_grad():
            out = model(input_ids=ids).last_hidden_state
        assert torch.equal(out, torch.load({str(tmp_path / 'expected.pt')!r})), "outputs differ"
        Retrofit.of(model).revert()
        assert model.config._attn_implementation != "oretrofit"
        print("ok")""")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_retrofit_whose_undos_are_closures_refuses_to_be_copied_with_the_fix():
    class Mixer(torch.nn.Linear):                               # a user's token mixer
        pass

    def apply(module: torch.nn.Module, config) -> Callable[[], None]:
        handle = module.register_forward_hook(lambda m, a, out: out * 1.0)
        return lambda: handle.remove()

    register_module_site(Mixer, "attention", apply)
    try:
        model = torch.nn.Module()
        model.mix = Mixer(4, 4)
        retrofit(model, "full-o", 1.0)
        for dump in (copy.deepcopy, pickle.dumps):
            with pytest.raises(RetrofitError, match=r"cannot be pickled or copied.*apply_spec"):
                dump(model)
    finally:
        unregister_module_site(Mixer)


def test_save_leaves_a_good_file_whole_when_pickling_fails(tmp_path):
    path = tmp_path / "model.pt"
    oretrofit.save({"w": torch.ones(3)}, path)
    good = path.read_bytes()
    with pytest.raises(AttributeError, match="Can't pickle local object"):
        oretrofit.save({"f": lambda: None}, path)
    assert path.read_bytes() == good and sorted(tmp_path.iterdir()) == [path]


# --- specs and requests that cannot be carried out -------------------------------------------

def test_apply_spec_checks_the_spec_against_the_model(host):
    spec = retrofit(host, "full-o", 1.0).spec()
    Retrofit.of(host).revert()
    cases = {"sites": (spec["sites"][:-3], "site list"), "host": ("torch-nn", "host")}
    for key, (value, what) in cases.items():
        with pytest.raises(RetrofitError, match=f"its {what} is .*Re-create the spec"):
            apply_spec(host, {**spec, key: value})
        assert Retrofit.of(host) is None                         # left unpatched
    no_arm = {k: v for k, v in spec.items() if k != "arm"}
    with pytest.raises(RetrofitError, match=r"lacks arm \(every entry is checked .*re-create"):
        apply_spec(host, no_arm)
    with pytest.raises(RetrofitError, match=r"'re:icl\.\(' is not a valid regular expression"):
        apply_spec(host, {**spec, "targets": ["re:icl.("]})


def test_requests_that_cannot_be_carried_out_are_refused_by_name(host):
    with pytest.raises(RetrofitError, match="needs a torch nn.Module .* got object"):
        retrofit(object())
    with pytest.raises(RetrofitError, match=r"'re:\[' is not a valid regular expression"):
        retrofit(host, "oa", site_tau={"re:[": 1e-3})
    with pytest.raises(RetrofitError, match="arm 'base' patches no site.*choose arm 'oa'"):
        oretrofit.plan_retrofit(host, "base", site_tau={"icl.*": 1e-3})
    with pytest.raises(ValueError, match=r"tau must be a positive finite number, got True \(a"):
        retrofit(host, "oa", tau=True)
    assert Retrofit.of(host) is None


# --- artifacts and checkpoints ---------------------------------------------------------------

def _artifact(tmp_path, host) -> tuple:
    source = resolve_model_path("demo")
    from oretrofit.tabpfn import checkpoint_sha256
    spec = {**retrofit(host, "oa", 1.0).spec(), "source_checkpoint_sha256":
            checkpoint_sha256(source)}
    return source, spec, write_patched_artifact(tmp_path / "patched-v3.ckpt", source, spec)


def test_a_patched_artifact_loads_only_as_written(tmp_path, host):
    source, spec, path = _artifact(tmp_path, host)
    regressor, handle = load_patched_regressor(path)
    assert handle.spec()["sites"] == spec["sites"]
    checkpoint = dict(load_checkpoint(path))
    edits = {"spec": lambda c: c.__setitem__(ARTIFACT_KEY, json.dumps(
                 {**spec, "source_checkpoint_sha256": "0" * 64}, sort_keys=True)),
             "weights": lambda c: c.__setitem__("state_dict", {
                 k: (v + 1e-3 if i == 0 else v) for i, (k, v) in enumerate(
                     c["state_dict"].items())})}
    for name, edit in edits.items():
        tampered = dict(checkpoint)
        edit(tampered)
        bad = save_atomic(tampered, tmp_path / f"tampered-{name}-v3.ckpt")
        with pytest.raises(RetrofitError, match="was modified after it was written.*re-create"):
            read_patch_spec(bad)
    with pytest.raises(RetrofitError, match="names source checkpoint SHA-256 000000000000"):
        write_patched_artifact(tmp_path / "x-v3.ckpt", source,
                               {**spec, "source_checkpoint_sha256": "0" * 64})
    cut = write_patched_artifact(tmp_path / "cut-v3.ckpt", source,
                                 {**spec, "sites": spec["sites"][:2]})
    with pytest.raises(RetrofitError, match="cut-v3.ckpt: the patch spec does not fit"):
        load_patched_regressor(cut)
    # the release it was written under is provenance: another admitted one loads it
    versions = write_patched_artifact(tmp_path / "ver-v3.ckpt", source,
                                      {**spec, "host_versions": {"tabpfn": "8.0.1"}})
    assert load_patched_regressor(versions)[1].spec()["host_versions"] == spec["host_versions"]


def test_a_nan_weight_is_refused_with_the_file_and_tensor(tmp_path):
    checkpoint = dict(load_checkpoint(resolve_model_path("demo")))
    state = dict(checkpoint["state_dict"])
    name = next(k for k, v in state.items() if v.is_floating_point())
    poisoned = state[name].clone()
    poisoned.view(-1)[0] = float("nan")
    state[name] = poisoned
    path = save_atomic({**checkpoint, "state_dict": state}, tmp_path / "nan-v3.ckpt")
    with pytest.raises(RetrofitError, match=rf"nan-v3.ckpt: 1 tensor\(s\) hold NaN or infinite "
                                            rf"values: '{name}' \(1 of "):
        resolve_model_path(str(path))


# --- round 3: every spec entry checked, nothing ignored --------------------------------------

@pytest.mark.parametrize("key", ["sites", "calibration", "host", "host_versions", "exclude"])
def test_a_spec_with_an_entry_deleted_is_refused_not_partly_checked(host, key):
    spec = retrofit(host, "full-o", 1.0).spec()
    Retrofit.of(host).revert()
    with pytest.raises(RetrofitError, match=f"the patch spec lacks {key} .*re-create the spec"):
        apply_spec(host, {k: v for k, v in spec.items() if k != key})
    assert Retrofit.of(host) is None


def test_a_calibrated_spec_with_its_weights_record_deleted_is_refused(host, calibration_record):
    spec = {**retrofit(host, "oa", 1.0).spec(), "calibration": calibration_record(host)}
    Retrofit.of(host).revert()
    assert apply_spec(host, spec).revert() is host                     # complete: applies
    del spec["calibration"]["weights_sha256"]
    with pytest.raises(RetrofitError, match=r"calibration record names no weights its τ were "
                                            r"read from \(weights_sha256, or data.checkpoint"):
        apply_spec(host, spec)


def test_a_spec_edited_to_arm_base_is_refused_by_make_regressor(host):
    spec = retrofit(host, "full-o", 1.0).spec()
    with pytest.raises(RetrofitError, match=r"arm is 'base', which patches nothing, but it "
                                            r"names \d+ site\(s\), site records \(an edited "
                                            r"arm\?\)"):
        make_regressor("demo", spec={**spec, "arm": "base"})


@pytest.mark.parametrize("given", [dict(tau=1e-3), dict(site_tau={"icl.*": 1e-3}),
                                   dict(eps=1e-3)])
def test_arm_base_with_a_tau_is_refused_not_ignored(given):
    with pytest.raises(RetrofitError, match=f"arm 'base' patches no site, so {next(iter(given))} "
                                            "would be ignored"):
        make_regressor("demo", "base", **given)


def test_a_reordered_spec_is_refused_naming_the_order(host):
    spec = retrofit(host, "full-o", 1.0).spec()
    Retrofit.of(host).revert()
    sites = spec["sites"]
    with pytest.raises(RetrofitError, match=r"the same sites in another order .*order they are "
                                            "applied in"):
        apply_spec(host, {**spec, "sites": [sites[1], sites[0], *sites[2:]]})


@pytest.mark.parametrize("option", ["exclude", "targets"])
def test_a_pattern_that_matches_no_site_is_refused(host, option):
    with pytest.raises(RetrofitError, match=f"{option} pattern 'icl.99.*' matches no site of "
                                            "host 'tabpfn-v3'"):
        retrofit(host, "full-o", 1.0, **{option: ["icl.99.*"]})
    spec = retrofit(host, "full-o", 1.0, exclude=["icl.0.*"]).spec()
    Retrofit.of(host).revert()
    with pytest.raises(RetrofitError, match="exclude pattern 'icl.9.*' matches no site"):
        apply_spec(host, {**spec, "exclude": ["icl.9.*"]})
    assert Retrofit.of(host) is None


# --- round 3: loaders never unpickle code, and say so ----------------------------------------

def test_a_saved_model_passed_as_a_checkpoint_is_refused_without_running_it(host, tmp_path,
                                                                         code_payload):
    retrofit(host, "oa", 1.0)
    path = oretrofit.save({"model": host, "payload": code_payload}, tmp_path / "saved-v3.ckpt")
    with pytest.raises(RetrofitError, match=r"saved-v3.ckpt holds pickled Python objects, not "
                                            r"a weights-only checkpoint .*torch.load\(path, weights_only=False\)"):
        load_checkpoint(path)
    assert not code_payload.marker.exists()


def test_a_transformers_folder_holding_a_pickle_is_refused_by_name(tmp_path, code_payload):
    from oretrofit.hosts.transformers.models import load_model
    model = _bert()
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "payload": code_payload}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=f"{tmp_path} holds its weights as a pickle .*re-save "
                                         "the model as safetensors"):
        load_model(str(tmp_path))
    assert not code_payload.marker.exists()
