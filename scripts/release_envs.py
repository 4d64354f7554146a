"""What the release-compatibility sweeps (``scripts/tabpfn_compat.py``, ``tabicl_compat.py``,
``tabdpt_compat.py``, ``transformers_compat.py``, ``torch_compat.py``) share: the committed HEAD
exported as plain files, a layered per-release environment, the checks run in it, the loop that
writes a receipt after every release, pytest's summary line and the receipts' provenance.

A layered environment (as the Makefile's ``test-tabpfn-oldest``) is a ``venv --without-pip``
whose ``.pth`` file adds the main environment's packages underneath (``site.addsitedir``); one
``pip install PACKAGE==X`` on top then installs only what differs from the main environment
(the release and the dependencies it pins), and the layer's copies shadow the main ones.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = ["sweep_parser", "export_head", "head_commit", "layered_venv", "layer_packages",
           "pytest_summary", "pytest_failures", "receipt_command", "provenance_lines",
           "markdown_table", "same_release", "check_result", "run_in", "refusal", "gated_check",
           "gated_release",
           "gated_outcome", "refusal_cell", "receipt", "sweep", "gated_main"]

# how every check runs: one thread, no model hub
OFFLINE = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}

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


def _version_of(python: Path, package: str) -> str | None:
    probe = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _has_release(python: Path, package: str, release: str) -> bool:
    installed = _version_of(python, package)
    return installed is not None and same_release(installed, release)


def layered_venv(venv: Path, package: str, release: str, *, keep: Sequence[str] = (),
                 deps: bool = True, extras: str = "") -> None:
    """Create ``venv`` on top of the running interpreter's environment with ``package==release``
    installed in the layer (skipped when it already resolves to that release). ``keep``: packages
    whose main-environment release the layer must not replace (a release pinning another one
    fails to install rather than pulling it); ``deps=False`` installs the release alone;
    ``extras`` (``"[mitra]"``) installs ``package[extras]==release``.

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
               f"{package}{extras}=={release}", *([] if deps else ["--no-deps"])]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("".join(f"{name}=={_version_of(Path(sys.executable), name)}\n"
                                  for name in keep))
        constraints.flush()
        done = subprocess.run([*install, *(["-c", constraints.name] if keep else [])],
                              capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip install {package}{extras}=={release} failed:\n{done.stderr[-2000:]}")
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


def run_in(source: Path, cmd: Sequence[str]) -> subprocess.CompletedProcess:
    """``cmd`` run in ``source`` (an export of HEAD), its code first on the path (not an editable
    checkout's), on one thread and offline; output captured."""
    env = {**OFFLINE, "PYTHONPATH": str(source)}
    return subprocess.run(list(cmd), cwd=source, env=env, capture_output=True, text=True)


def refusal(cls: type) -> str:
    """What retrofitting an instance of the vendor's ``cls`` says: the ``RetrofitError``'s
    message, or ``NOT refused``. The instance is built without its constructor (a host's release
    gate refuses by class, before reading any weight), so it works whatever a release's
    constructor takes."""
    import torch

    import oretrofit
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    try:
        oretrofit.retrofit(model, "oa")
    except oretrofit.RetrofitError as err:
        return str(err)
    return "NOT refused"


def gated_check(found: dict, module: str, name: str, gate: Callable[[], None]) -> dict:
    """A gated host's in-environment check: ``found`` (what is installed), with ``error`` when
    the release does not ship the model class ``module.name``, or with ``refused`` (what
    retrofitting an instance of the class says, :func:`refusal`) when ``gate()`` refuses the
    release."""
    import importlib

    import oretrofit
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        return {**found, "error": f"no {module}.{name}: {type(err).__name__}: {err}"}
    try:
        gate()
    except oretrofit.RetrofitError:
        return {**found, "refused": refusal(cls)}
    return found


def gated_release(venv: Path, release: str, source: Path, package: str, tests: Sequence[str],
                  checks_pass: Callable[[dict], bool] = lambda result: True,
                  distribution: str | None = None) -> dict:
    """One release's row for a host that gates releases: the in-environment ``--check`` of
    ``scripts/PACKAGE_compat.py`` (its JSON as ``result``); a release it reports ``refused`` is
    ``ok`` when the refusal names the release (``DISTRIBUTION X is not supported``; the
    distribution is ``package`` unless named) and is not put through the tests; any other is
    ``ok`` when ``tests`` pass, the check reported no error and ``checks_pass(result)``."""
    python = str(venv / "bin" / "python")
    start = time.monotonic()
    script = source / "scripts" / f"{package}_compat.py"
    result = check_result(run_in(source, [python, str(script), "--check"]))
    if "refused" in result:
        ok = f"{distribution or package} {release} is not supported" in result["refused"]
        summary = "not run (refused)"
    else:
        run = run_in(source, [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests])
        summary = pytest_summary(run.stdout)
        ok = run.returncode == 0 and "error" not in result and checks_pass(result)
    return {"release": release, "ok": ok, "tests": summary, "result": result,
            "wall_s": round(time.monotonic() - start)}


def gated_outcome(row: dict) -> str:
    """A :func:`gated_release` row's outcome: ``pass``, ``refused`` (by name) or ``FAIL``."""
    if not row["ok"]:
        return "FAIL"
    return "refused" if "refused" in row["result"] else "pass"


def refusal_cell(row: dict, width: int) -> str:
    """A :func:`gated_release` row's refusal (or the check's error), cut to ``width``; ``-``."""
    return str(row["result"].get("refused", row["result"].get("error", "-")))[:width]


def receipt(title: str, about: str, command: str, commit: str, header: Sequence[str],
            rows: Sequence[Sequence[object]]) -> str:
    """A receipt's markdown: its ``title``, what it checks (``about``), its provenance and its
    table."""
    lines = [f"# {title}", "", about, "", *provenance_lines(command, commit), "",
             *markdown_table(header, rows)]
    return "\n".join(lines) + "\n"


def sweep(root: Path, script: str, package: str, args: argparse.Namespace,
          run_release: Callable[[Path, str, Path], dict],
          render: Callable[[list[dict], str, str], str],
          install: Callable[[Path, str], str | None] | None = None) -> None:
    """Every release of ``args.releases`` in its layered environment ``args.venvs/PACKAGE-X``,
    checked by ``run_release(venv, release, source)`` on an export of ``root``'s HEAD; the receipt
    (``args.out`` and its .json) rewritten after every release, so an interrupted sweep keeps the
    rows it has. ``install(venv, release)`` builds an environment (by default
    :func:`layered_venv`); what it returns is kept in the row as ``install``. Exits 1 unless
    every row is ``ok``."""
    source = export_head(root, Path(tempfile.mkdtemp(prefix=f"{package}-compat-")))
    command = receipt_command(script, sys.argv[1:], {args.venvs: "VENVS"})
    commit = head_commit(root)
    rows = []
    for release in args.releases.split(","):
        venv = args.venvs / f"{package}-{release}"
        try:
            how = (install or (lambda v, r: layered_venv(v, package, r)))(venv, release)
            rows.append({**run_release(venv, release, source), **({"install": how} if how else {})})
        except RuntimeError as err:
            rows.append({"release": release, "ok": False, "tests": f"install failed: {err}"[:200],
                         "result": {}, "wall_s": 0})
        print(f"{release}: {gated_outcome(rows[-1])} ({rows[-1]['tests']})", flush=True)
        rows.sort(key=lambda row: Version(row["release"]))
        args.out.write_text(render(rows, command, commit))
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    shutil.rmtree(source, ignore_errors=True)
    print(f"wrote {args.out}")
    sys.exit(0 if all(row["ok"] for row in rows) else 1)


def gated_main(root: Path, description: str, package: str, releases: Sequence[str],
               check: Callable[[], dict], run_release: Callable[[Path, str, Path], dict],
               render: Callable[[list[dict], str, str], str],
               install: Callable[[Path, str], str | None] | None = None) -> None:
    """The command line of ``scripts/PACKAGE_compat.py``: with ``--check`` (inside a release's
    environment) ``check()``'s JSON line, else the :func:`sweep` writing
    ``results/PACKAGE-compat.md``."""
    parser = sweep_parser(description, package, releases,
                          root / "results" / f"{package}-compat.md")
    parser.add_argument("--check", action="store_true", help="in-environment check")
    args = parser.parse_args()
    if args.check:
        print(json.dumps(check()))
    else:
        sweep(root, f"scripts/{package}_compat.py", package, args, run_release, render, install)
