"""How a result was made: versions, device, git revision, command line; atomic JSON writes.

Every receipt oretrofit writes embeds :func:`environment` so a number can be traced back.
A receipt names files the way :func:`portable` writes them, never by a path that holds only
on the machine that wrote it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as _md
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from .atomic import atomic_file
from .json_numbers import encode_non_finite

__all__ = ["cache_dir", "environment", "package_version", "oretrofit_version", "portable", "sha256_file", "weights_digest", "write_json_atomic",
           "git_revision"]

_PACKAGES = ("oretrofit", "torch", "numpy", "tabpfn", "transformers", "scikit-learn", "openml")
_REPOSITORY = Path(__file__).resolve().parents[2]
# An absolute path inside a text: it starts the text or a line, or follows a space, a quote, a
# backtick, `=`, `(`, `[` or `,` (so a URL's `//` and `a/b` or `|x|/y` are not paths).
_ABSOLUTE = re.compile(r"(?:^|(?<=[\s\"'`=(\[,]))/[\w.+@%~-]+(?:/[\w.+@%~-]+)*", re.M)
_PACKAGE_FOLDERS = ("site-packages", "dist-packages")


def cache_dir() -> Path:
    """Where oretrofit caches generated hosts: ``$ORETROFIT_CACHE_DIR``, else the user cache."""
    if os.environ.get("ORETROFIT_CACHE_DIR", "").strip():
        return Path(os.environ["ORETROFIT_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache"
    return Path(base) / "oretrofit"


def portable(value: str | os.PathLike[str], *, checkouts: Iterable[str | os.PathLike[str]] = ()) -> str:
    """A path (``os.PathLike``) or a text such as a command line (``str``, each absolute path in
    it) as a receipt records it, free of what holds only on this machine. A path, first rule
    that fits:

    * inside a ``site-packages`` or ``dist-packages`` folder: ``<site-packages>/<rest>``;
    * inside oretrofit's cache (:func:`cache_dir`): ``<cache>/<rest>``;
    * inside this repository (or one of ``checkouts``, other checkouts of it): relative to its
      root (``.`` for the root itself);
    * inside the temp folder (``tempfile.gettempdir()`` or ``/tmp``): ``<tmp>/<folder>/<name>``;
    * inside the home directory: ``~/<rest>``;
    * ``/dev/...``: as it is (the same on every machine);
    * anywhere else: ``<abs>/<folder>/<name>``.

    Outside every named root only the file's folder and name are kept: run folders name their
    files alike (``tabpfn-v3-demo.ckpt``), so the folder tells them apart; a file's checksum,
    recorded beside it, is what identifies its bytes. A relative path is taken from the working
    directory; in a text, relative paths stay as written (which words are paths is not known)
    and a path ends at a space. What this returns holds no absolute path, so it returns itself.
    """
    roots = [_REPOSITORY, *map(Path, checkouts)]
    if isinstance(value, os.PathLike):
        return _portable_path(os.path.abspath(value), roots)
    return _ABSOLUTE.sub(lambda found: _portable_path(found.group(), roots), value)


def _portable_path(path: str, checkouts: list[Path]) -> str:
    """One absolute path by the rules of :func:`portable`."""
    parts = Path(path).parts
    packages = [i for i, part in enumerate(parts) if part in _PACKAGE_FOLDERS]
    if packages:
        return "/".join(["<site-packages>", *parts[packages[-1] + 1:]])
    if (rest := _inside(path, [cache_dir()])) is not None:
        return f"<cache>/{rest}".removesuffix("/.")
    if (rest := _inside(path, checkouts)) is not None:
        return rest
    if (rest := _inside(path, [Path(tempfile.gettempdir()), Path("/tmp")])) is not None:
        return "/".join(["<tmp>", *Path(rest).parts[-2:]])
    if Path.home() != Path("/") and (rest := _inside(path, [Path.home()])) is not None:
        return f"~/{rest}".removesuffix("/.")
    if parts[1:2] == ("dev",):
        return path
    return "/".join(["<abs>", *parts[1:][-2:]])


def _inside(path: str, folders: list[Path]) -> str | None:
    """``path`` relative to the first of ``folders`` (as given or with links resolved) that holds
    it, as POSIX text (``.`` for the folder itself); None when none holds it."""
    for folder in folders:
        for root in dict.fromkeys([Path(os.path.abspath(folder)), folder.resolve()]):
            if Path(path).is_relative_to(root):
                return Path(path).relative_to(root).as_posix()
    return None


def git_revision() -> str | None:
    """The checkout's commit (with ``+dirty`` when it has uncommitted changes), or None."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPOSITORY, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPOSITORY,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None when it is not installed."""
    try:
        return _md.version(name)
    except _md.PackageNotFoundError:
        return None


def oretrofit_version() -> str:
    """This installed oretrofit's version (pyproject.toml's), ``0+unknown`` in a source tree that
    was never installed."""
    return package_version("oretrofit") or "0+unknown"


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
        "packages": {p: v for p in _PACKAGES if (v := package_version(p)) is not None},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": str(device),
        "device_name": name or platform.machine(),
        "numpy_simd": _numpy_simd(),
        "torch_threads": torch.get_num_threads(),
        "git_revision": git_revision(),
        "command": portable(" ".join([Path(sys.argv[0]).name, *sys.argv[1:]])),
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
    """Write JSON whole or not at all, never through a symbolic link (:mod:`oretrofit._files.atomic`);
    a non-finite float is written as its name (``"NaN"``: :mod:`oretrofit._files.json_numbers`), never
    as a bare ``NaN`` that strict JSON parsers refuse."""
    with atomic_file(path, "w") as fh:
        json.dump(encode_non_finite(obj), fh, indent=2, sort_keys=False, default=str,
                  allow_nan=False)
        fh.write("\n")
    return Path(path)
