"""Shared fixtures: every test starts from a fixed seed; complete calibration records; a pickle
payload that proves code ran; a path that is no regular file; a release sweep's script as a
module; any script as a module, and its --help text."""

import contextlib
import importlib.util
import io
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

# Triton's interpreter runs the fused OAttention kernels on CPU tensors (tests/_kernels/test_triton.py).
# Triton reads this when it is first imported, so it is set before any test module can import it;
# nothing else changes: the CPU takes the Triton route only where a test enables it.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch

from oretrofit._surgery.serialize import calibrated_weights_digest

# The TabDPT host's tests run in an environment of their own, with tabdpt (`make test-tabdpt`:
# tabdpt pins huggingface-hub<2.0, below what this environment's transformers needs). A run over
# tests/ leaves their directory out; a run naming it (`pytest tests/hosts/tabdpt`) collects it.
# The tabpfn-time-series example's tests likewise (`make test-tabpfn-time-series`: the package
# pins pandas < 3 and huggingface-hub < 2 through its dependencies).
# The Mitra host's tests likewise (`make test-mitra`: autogluon.tabular pins pandas<2.4).
collect_ignore = ["hosts/tabdpt", "hosts/mitra", "examples"]


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


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def sweep_script() -> Callable[[str], ModuleType]:
    """``load(name)``: ``scripts/NAME.py`` as a module, with ``scripts/`` importable while it
    loads (the release sweeps import their shared ``release_envs`` from beside them)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"

    def load(name: str) -> ModuleType:
        sys.path.insert(0, str(scripts))
        try:
            return _module(scripts / f"{name}.py")
        finally:
            sys.path.remove(str(scripts))
    return load


@pytest.fixture(scope="session")
def script_module() -> Callable[[str], ModuleType]:
    """``load(path)``: the script at ``path`` (relative to the checkout) as a module, so a test
    can run its ``main()`` in this process, without an interpreter's start-up (the smoke runs
    start each script as a command)."""
    root = Path(__file__).resolve().parents[1]
    return lambda path: _module(root / path)


@pytest.fixture(scope="session")
def script_help(script_module: Callable[[str], ModuleType]) -> Callable[[str], str]:
    """``help_text(path)``: what the script at ``path`` prints for ``--help``, its ``main()``
    run in this process."""

    def help_text(path: str) -> str:
        out, argv = io.StringIO(), sys.argv
        sys.argv = [path, "--help"]
        try:
            with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
                script_module(path).main()
        finally:
            sys.argv = argv
        assert exit_.value.code == 0, f"{path} --help exited {exit_.value.code}"
        return out.getvalue()
    return help_text
