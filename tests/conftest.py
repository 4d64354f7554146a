"""Shared fixtures: every test starts from a fixed seed; complete calibration records; a pickle
payload that proves code ran; a path that is no regular file; a release sweep's script as a
module."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

# Triton's interpreter runs the fused OAttention kernels on CPU tensors (tests/test_attention_triton.py).
# Triton reads this when it is first imported, so it is set before any test module can import it;
# nothing else changes: the CPU takes the Triton route only where a test enables it.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch

from oretrofit._serialize import calibrated_weights_digest


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture()
def calibration_record() -> Callable[..., dict[str, Any]]:
    """``make(model, **data)``: a calibration record as ``oretrofit.calibrate`` writes one (every
    entry present, the weights digest of ``model``), its ``data`` object holding ``data``."""
    def make(model: torch.nn.Module, **data: Any) -> dict[str, Any]:
        return {"delta": 1e-3, "quantile": 0.01, "probe_tau": 1e-30, "data": data,
                "weights_sha256": calibrated_weights_digest(model), "sites": {},
                "rule": "tau_site = delta/(1-delta) * quantile_q(|h|^2)"}
    return make


class CodePayload:
    """Unpickling this writes ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.write_text, (self.marker, "ran"))


@pytest.fixture()
def code_payload(tmp_path: Path) -> CodePayload:
    """A :class:`CodePayload` whose marker is ``tmp_path / "payload-ran"`` (absent until run)."""
    return CodePayload(tmp_path / "payload-ran")


@pytest.fixture(params=["fifo", "folder", "device"])
def special_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """``(path, what)``: a path that is no regular file (a FIFO named ``x.ckpt`` with no writer,
    a folder, or ``/dev/null``) and, as a regex, what oretrofit's refusal calls it."""
    path = tmp_path / "tabpfn-v3-x.ckpt"
    if request.param == "fifo":
        os.mkfifo(path)
        return path, r"a named pipe \(FIFO\)"
    if request.param == "folder":
        path.mkdir()
        return path, "a folder"
    return Path("/dev/null"), "a character device"


@pytest.fixture(scope="session")
def sweep_script() -> Callable[[str], ModuleType]:
    """``load(name)``: ``scripts/NAME.py`` as a module, with ``scripts/`` importable while it
    loads (the release sweeps import their shared ``release_envs`` from beside them)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(scripts))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(scripts))
        return module
    return load
