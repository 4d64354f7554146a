import hashlib
import importlib.util
import json
import math
import re
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from oretrofit._files.provenance import (_ABSOLUTE, _numpy_simd, environment, portable, sha256_file,
                                   write_json_atomic)

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A cache folder and a home directory of their own (the cache inside the temp folder, as
    ORETROFIT_CACHE_DIR may put it)."""
    monkeypatch.setenv("ORETROFIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", "/home/someone")
    return tmp_path


def test_portable_names_each_kind_of_place(places):
    site = Path(sys.prefix, "lib", "python3.11", "site-packages", "gt_model", "model.safetensors")
    assert portable(site) == "<site-packages>/gt_model/model.safetensors"
    assert portable(Path("/usr/lib/python3/dist-packages/x/y.gguf")) == "<site-packages>/x/y.gguf"
    assert portable(places / "cache" / "host.ckpt") == "<cache>/host.ckpt"
    assert portable(ROOT / "oretrofit" / "data" / "tabpfn-v3-demo.ckpt") == "oretrofit/data/tabpfn-v3-demo.ckpt"
    assert portable(ROOT) == "."
    assert portable(Path(tempfile.gettempdir(), "a", "b", "run.json")) == "<tmp>/b/run.json"
    assert portable(Path("/tmp/cli.py")) == "<tmp>/cli.py"
    assert portable(Path("/home/someone/notes/plan.md")) == "~/notes/plan.md"
    assert portable(Path("/work/runs/demo-v4/tabpfn-v3-demo.ckpt")) == "<abs>/demo-v4/tabpfn-v3-demo.ckpt"
    assert portable(Path("/dev/null")) == "/dev/null"


def test_portable_takes_a_relative_path_from_the_working_directory(places, monkeypatch):
    monkeypatch.chdir(ROOT / "results")
    assert portable(Path("hosts.json")) == "results/hosts.json"


def test_portable_rewrites_each_absolute_path_of_a_text_and_nothing_else(places):
    other = Path("/somewhere/wt9")
    command = (f"bench.py --out {places}/b/r.json --model-path={other}/oretrofit/data/x.ckpt "
               "--out results/x.json see https://example.org/a/b, |x|/max and /home/someone/n.md")
    expected = ("bench.py --out <tmp>/b/r.json --model-path=oretrofit/data/x.ckpt "
                "--out results/x.json see https://example.org/a/b, |x|/max and ~/n.md")
    assert portable(command, checkouts=[other]) == expected
    assert portable(expected, checkouts=[other]) == expected           # idempotent


def test_the_environment_records_a_portable_command(places, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / ".venv/bin/oretrofit"), "regress", "--model-path",
                                      str(places / "cache" / "h.ckpt"), f"--out={ROOT}/results/r"])
    assert environment()["command"] == "oretrofit regress --model-path <cache>/h.ckpt --out=results/r"


def _committed_texts() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("portable_receipts", ROOT / "scripts/portable_receipts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.committed_texts(ROOT)


def test_no_committed_receipt_or_document_names_a_machine_local_path():
    # results/, docs/, oretrofit/data/ and README.md name files as portable() does; a failure is
    # mended by `python scripts/portable_receipts.py`
    local = [re.escape(str(p)) for p in {ROOT, Path.home()} if p != Path("/")]
    pattern = re.compile("|".join([*local, r"(?<!<)\b(?:site|dist)-packages\b"]))
    texts = _committed_texts()
    assert len(texts) > 1000 and "README.md" in texts and "results/hosts.json" in texts
    found = [(name, path) for name, text in texts.items()
             for path in [*_ABSOLUTE.findall(text), *pattern.findall(text)]
             if not path.startswith("/dev/")]
    assert not found, found


def test_non_finite_numbers_are_written_by_name_not_as_bare_nan(tmp_path):
    """write_json_atomic wrote a bare NaN (a constant target's R²), which strict JSON parsers
    refuse; it is written as "NaN", as --json prints it, and read back by name."""
    from oretrofit._files.json_numbers import decode_number
    from oretrofit.cli.output import json_text
    value = {"r2": float("nan"), "rows": [(float("inf"), -float("inf"))], "rmse": 0.5}
    path = write_json_atomic(tmp_path / "cell.json", value)
    stored = json.loads(path.read_text(), parse_constant=lambda token: pytest.fail(token))
    assert stored == {"r2": "NaN", "rows": [["Infinity", "-Infinity"]], "rmse": 0.5}
    assert stored == json.loads(json_text(value))
    assert math.isnan(decode_number(stored["r2"])) and decode_number("NaN x") == "NaN x"
    assert [decode_number(v) for v in stored["rows"][0]] == [math.inf, -math.inf]
