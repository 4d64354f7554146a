import hashlib
import json
import stat

import pytest

from oretrofit._provenance import _numpy_simd, environment, sha256_file, write_json_atomic


def test_environment_names_versions_device_and_revision():
    env = environment("cpu")
    assert env["packages"]["torch"] and env["packages"]["oretrofit"]
    assert env["device"] == "cpu" and env["torch_threads"] >= 1
    assert {"python", "platform", "git_revision", "command", "created_utc"} <= set(env)
    # numpy >= 1.26 reports a list (possibly empty) of the feature groups it dispatches to
    assert isinstance(env["numpy_simd"], list) and all(isinstance(f, str) for f in env["numpy_simd"])


def test_numpy_simd_is_none_where_numpy_hides_its_dispatch_table(monkeypatch):
    try:
        from numpy._core import _multiarray_umath as umath   # numpy 2
    except ImportError:
        from numpy.core import _multiarray_umath as umath    # numpy 1.26

    found = _numpy_simd()
    assert found is not None and set(found) <= set(umath.__cpu_dispatch__)
    monkeypatch.delattr(umath, "__cpu_dispatch__")
    assert _numpy_simd() is None


def test_sha256_file_matches_hashlib(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"oretrofit" * 300_000)           # larger than one read chunk
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_write_json_atomic_is_readable_and_leaves_no_temporaries(tmp_path):
    path = write_json_atomic(tmp_path / "sub" / "receipt.json", {"rmse": 1.5})
    assert json.loads(path.read_text()) == {"rmse": 1.5}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["receipt.json"]


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = write_json_atomic(tmp_path / "receipt.json", {"cells": 1})
    circular: dict = {}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular"):
        write_json_atomic(path, circular)
    assert json.loads(path.read_text()) == {"cells": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["receipt.json"]
