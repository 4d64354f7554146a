"""What the release-compatibility sweeps (``scripts/tabpfn_compat.py``,
``scripts/transformers_compat.py``) share: the committed HEAD exported as plain files, a layered
per-release environment, pytest's summary line and the receipts' provenance.

A layered environment (as the Makefile's ``test-tabpfn-oldest``) is a ``venv --without-pip``
whose ``.pth`` file adds the main environment's packages underneath (``site.addsitedir``); one
``pip install PACKAGE==X`` on top then installs only what differs from the main environment
(the release and the dependencies it pins), and the layer's copies shadow the main ones.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Sequence

from packaging.specifiers import SpecifierSet

__all__ = ["sweep_parser", "export_head", "head_commit", "layered_venv", "layer_packages", "pytest_summary",
           "pytest_failures", "receipt_command", "provenance_lines", "markdown_table",
           "same_release", "check_result"]

_PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def sweep_parser(description: str, package: str, releases: Sequence[str], out: Path
                 ) -> argparse.ArgumentParser:
    """The arguments every sweep takes: ``--venvs`` (its layers' folder, by default
    ``~/.cache/oretrofit/PACKAGE-venvs``), ``--releases`` (comma-separated, ``releases`` by
    default) and ``--out`` (the receipt's .md; its .json beside it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--venvs", type=Path,
                        default=Path.home() / ".cache" / "oretrofit" / f"{package}-venvs",
                        help="folder of the per-release environments (outside the checkout)")
    parser.add_argument("--releases", default=",".join(releases))
    parser.add_argument("--out", type=Path, default=out)
    return parser


def export_head(root: Path, dest: Path) -> Path:
    """The committed HEAD of ``root`` as plain files in ``dest``: edits to the checkout during a
    run (and uncommitted files) do not reach the checks, and the table names the commit it ran."""
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=root, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def head_commit(root: Path) -> str:
    """The short hash of ``root``'s HEAD."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                          text=True).stdout.strip()


def _purelib(python: Path) -> str:
    return subprocess.run([str(python), "-c", _PURELIB], capture_output=True, text=True,
                          check=True).stdout.strip()


def same_release(installed: str, release: str) -> bool:
    """Whether ``installed`` is what ``pip install PACKAGE==release`` accepts: the release or a
    local build of it (``2.13.0+cpu`` for ``2.13.0``)."""
    return SpecifierSet(f"=={release}").contains(installed)


def _has_release(python: Path, package: str, release: str) -> bool:
    probe = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return done.returncode == 0 and same_release(done.stdout.strip(), release)


def layered_venv(venv: Path, package: str, release: str) -> None:
    """Create ``venv`` on top of the running interpreter's environment with ``package==release``
    installed in the layer (skipped when it already resolves to that release).

    Raises ``RuntimeError`` with pip's last words when the install fails or the release installed
    does not shadow the main environment's."""
    python = venv / "bin" / "python"
    if python.exists() and _has_release(python, package, release):
        return
    create = [sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)]
    done = subprocess.run(create, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{shlex.join(create)} failed:\n{done.stderr[-2000:]}")
    main = sysconfig.get_paths()["purelib"]
    (Path(_purelib(python)) / "_oretrofit_main_venv.pth").write_text(
        f"import site; site.addsitedir({main!r})\n")
    install = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
               f"{package}=={release}"]
    done = subprocess.run(install, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip install {package}=={release} failed:\n{done.stderr[-2000:]}")
    if not _has_release(python, package, release):
        raise RuntimeError(f"{package} {release} installed but another release shadows it")


def check_result(done: subprocess.CompletedProcess) -> dict:
    """The JSON line a sweep's in-environment ``--check`` printed last, or ``{"error": …}``
    with the last line of its stderr."""
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}


def layer_packages(venv: Path) -> list[str]:
    """``name version`` of every distribution the layer itself holds (what differs from the main
    environment), sorted."""
    purelib = Path(_purelib(venv / "bin" / "python"))
    found = []
    for info in sorted(purelib.glob("*.dist-info")):
        name, _, version = info.name.removesuffix(".dist-info").partition("-")
        found.append(f"{name.replace('_', '-').lower()} {version}")
    return found


def pytest_summary(text: str) -> str:
    """pytest's final counts (``57 passed, 6 warnings``) from its ``-q`` output."""
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1].strip("= ").split(" in ")[0] if lines else "no summary"


def pytest_failures(text: str) -> list[str]:
    """The ``FAILED``/``ERROR`` lines of pytest's short summary (run with ``-rfE``)."""
    return [line for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def receipt_command(script: str, argv: Sequence[str], machine_local: dict[Path, str]) -> str:
    """The command line as a receipt shows it: arguments naming a machine-local path (a key of
    ``machine_local``) are replaced by its placeholder."""
    shown = [next((label for path, label in machine_local.items() if Path(arg) == path), arg)
             for arg in argv]
    return f"python {script} {shlex.join(shown)}".strip()


def provenance_lines(command: str, commit: str) -> list[str]:
    """The receipt's provenance bullets: command, commit, date, python and platform."""
    return [
        f"- command: `{command}`",
        f"- oretrofit commit: `{commit}` (the checks ran on an export of it)",
        f"- date (UTC): {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M')}",
        f"- python: {platform.python_version()}, platform: {platform.platform()}",
    ]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A markdown table's lines: the header, its rule, one line a row (``|`` in a cell escaped)."""
    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"
    return [line(header), "| " + " | ".join("---" for _ in header) + " |", *map(line, rows)]
