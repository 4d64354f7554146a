"""How a result was made: versions, device, git revision, command line; atomic JSON writes.

Every receipt oretrofit writes embeds :func:`environment` so a number can be traced back.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as _md
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import torch

from ._atomic import atomic_file

__all__ = ["environment", "sha256_file", "weights_digest", "write_json_atomic", "git_revision"]

_PACKAGES = ("oretrofit", "torch", "numpy", "tabpfn", "transformers", "scikit-learn", "openml")


def git_revision() -> str | None:
    """The checkout's commit (with ``+dirty`` when it has uncommitted changes), or None."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def _version(name: str) -> str | None:
    try:
        return _md.version(name)
    except _md.PackageNotFoundError:
        return None


def _numpy_simd() -> list[str] | None:
    """The SIMD feature groups numpy dispatches to on this CPU (what ``numpy.show_runtime`` calls
    "found"). Elementwise kernels such as ``np.arctan`` round differently in the last bit under
    different groups, so generated data can differ between CPUs; None where numpy hides this."""
    try:
        from numpy._core import _multiarray_umath as umath             # numpy 2
    except ImportError:
        try:
            from numpy.core import _multiarray_umath as umath          # numpy 1.26
        except ImportError:
            return None
    features, dispatch = getattr(umath, "__cpu_features__", None), getattr(umath, "__cpu_dispatch__", None)
    if features is None or dispatch is None:
        return None
    return [f for f in dispatch if features.get(f)]


def environment(device: str | torch.device = "cpu") -> dict[str, Any]:
    """Package versions, Python, platform, device name, numpy's SIMD features, threads, git
    revision, command, time."""
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "packages": {p: v for p in _PACKAGES if (v := _version(p)) is not None},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": str(device),
        "device_name": name or platform.machine(),
        "numpy_simd": _numpy_simd(),
        "torch_threads": torch.get_num_threads(),
        "git_revision": git_revision(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def weights_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the sorted state_dict: each tensor's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return h.hexdigest()


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write JSON whole or not at all, never through a symbolic link (:mod:`oretrofit._atomic`)."""
    with atomic_file(path, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=False, default=str)
        fh.write("\n")
    return Path(path)
