#!/usr/bin/env python3
"""Run the Mitra host's checks on every autogluon.tabular release that ships Mitra, each in its
own virtual environment, and write ``results/autogluon-compat.md`` (the table the host's version
gate rests on).

Per release ``X`` the environment ``VENVS/autogluon-X`` is the main environment (the interpreter
running this script) with ``autogluon.tabular[mitra]==X`` installed on top, and whatever it pins
(:func:`release_envs.layered_venv`, as the Makefile's ``test-mitra``) except torch, which stays
the main environment's. A release whose ``mitra`` extra pins another torch (1.4.0: < 2.8, 1.5.0:
< 2.10) is installed without the extra, with its pins, and the extra's packages the main
environment lacks (:data:`MITRA_IMPORTS`) unpinned; the check lists every pin of the release
(``Requires-Dist``, base and ``mitra`` extra) that the environment does not meet. In it:

1. the release ships Mitra's model class (``tab2d.Tab2D``);
2. a release the host's gate admits passes the Mitra tests (``tests/hosts/mitra``);
3. a release the gate refuses: retrofitting an instance of the release's own ``Tab2D`` is
   refused naming the release (never a bare import error, never "no registered host matches"),
   and the Mitra tests are run once more with the gate widened to the release (:data:`WIDEN`;
   without the gate's own tests): whether the release would pass unchanged, the evidence for
   admitting it.

Usage: ``python scripts/autogluon_compat.py [--venvs DIR] [--releases 1.6.2,1.6.3] [--out FILE]``.
``--check`` is the in-environment steps 1 and 3's refusal (prints one JSON line).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from release_envs import (gated_check, gated_main, gated_outcome, gated_release, layered_venv,
                          pytest_summary, receipt, refusal_cell, run_in)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "autogluon.tabular"
TESTS = ["tests/hosts/mitra"]
MODEL = "autogluon.tabular.models.mitra._internal.models.tab2d"
# the releases on the registry (pip index versions autogluon.tabular) whose wheel ships
# autogluon/tabular/models/mitra/_internal/models/tab2d.py; 1.0.0 to 1.3.1 do not
RELEASES = ["1.4.0", "1.5.0", "1.6.0", "1.6.1", "1.6.2", "1.6.3"]
# what the mitra extra adds that the main environment lacks (torch, transformers and
# huggingface-hub are the main environment's)
MITRA_IMPORTS = ["loguru", "einx", "omegaconf", "einops"]
# the Mitra tests with the gate admitting the installed release too; left out: the gate's own
# tests (they assert which releases are admitted)
WIDEN = ("import sys, pytest\n"
         "from oretrofit.hosts.mitra import releases\n"
         "releases.TESTED_RELEASES += (releases.installed_version(),)\n"
         "sys.exit(pytest.main(sys.argv[1:]))")
GATE_TESTS = ["--ignore=tests/hosts/mitra/test_releases.py"]


def unmet_pins() -> list[str]:
    """The release's requirements (base and the ``mitra`` extra) this environment does not
    meet, as ``name<spec> (installed)``."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement
    unmet = []
    for line in requires(PACKAGE) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": "mitra"}):
            continue
        try:
            found = version(req.name)
        except PackageNotFoundError:
            found = None
        if found is None or not req.specifier.contains(found, prereleases=True):
            unmet.append(f"{req.name}{req.specifier} ({found or 'missing'})")
    return unmet


def check() -> dict:
    """Steps 1 and 3's refusal inside one environment: whether the release ships the model
    class, the pins it does not meet, and on a release the gate refuses, what retrofitting the
    class says."""
    import importlib.metadata

    import torch

    from oretrofit.hosts.mitra import releases
    found = {PACKAGE: importlib.metadata.version(PACKAGE), "torch": torch.__version__,
             "unmet": unmet_pins()}
    return gated_check(found, MODEL, "Tab2D",
                       lambda: releases.check_release(releases.installed_version()))


def install(venv: Path, release: str) -> None:
    """The release's environment: ``autogluon.tabular[mitra]`` with its pins but the main
    environment's torch, or (its extra pinning another torch) the release with its base pins and
    :data:`MITRA_IMPORTS` unpinned; the check reports the pins left unmet."""
    try:
        layered_venv(venv, PACKAGE, release, keep=("torch",), extras="[mitra]")
    except RuntimeError:
        layered_venv(venv, PACKAGE, release, keep=("torch",))
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", *MITRA_IMPORTS],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"pip install {' '.join(MITRA_IMPORTS)} failed:\n"
                               f"{done.stderr[-2000:]}")


def run_release(venv: Path, release: str, source: Path) -> dict:
    """The checks for one release (:func:`release_envs.gated_release`); a refused release also
    runs the tests with the gate widened to it (``widened``)."""
    start = time.monotonic()
    row = gated_release(venv, release, source, "autogluon", TESTS, distribution=PACKAGE)
    if "refused" in row["result"]:
        widened = run_in(source, [str(venv / "bin" / "python"), "-c", WIDEN, "-q", "-p",
                                  "no:cacheprovider", *TESTS, *GATE_TESTS])
        row["widened"] = pytest_summary(widened.stdout)
    return {**row, "wall_s": round(time.monotonic() - start)}


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    return receipt(
        "Mitra host: autogluon.tabular release compatibility",
        "Written by `scripts/autogluon_compat.py`; do not edit by hand. One layered virtual "
        "environment per release (the main environment, torch 2.13.0 CPU, with "
        "`autogluon.tabular[mitra]==X` and what it pins installed on top, torch kept; a release "
        "whose `mitra` extra pins another torch is installed without the extra, with its other "
        f"pins, and the extra's {', '.join(f'`{name}`' for name in MITRA_IMPORTS)} unpinned), "
        "running an export of the commit below; `unmet pins`: the release's requirements (base "
        "and `mitra` extra) the environment does not meet. The releases are those on the "
        "registry whose wheel ships Mitra's model "
        "(`autogluon/tabular/models/mitra/_internal/models/tab2d.py`; 1.0.0 to 1.3.1 do not). "
        f"A release passes when the Mitra tests pass ({', '.join(f'`{t}`' for t in TESTS)}). "
        "The host's version gate admits exactly the passing releases; a release it refuses "
        "(`refused`) is not put through the tests: its row shows that retrofitting an instance "
        "of the release's own `Tab2D` is refused naming the release, with the `pip install` "
        "that fixes it, and (`gate widened`) what the Mitra tests say with the gate admitting "
        "the release, without the gate's own tests (`tests/hosts/mitra/test_releases.py`).",
        command, commit,
        ["autogluon.tabular", "outcome", "Mitra tests", "refusal", "gate widened",
         "unmet pins", "torch", "wall s"],
        [[row["release"], gated_outcome(row), row["tests"], refusal_cell(row, 120),
          row.get("widened", "-"), "; ".join(row["result"].get("unmet", [])) or "none",
          row["result"].get("torch", "-"), row["wall_s"]] for row in rows])


def main() -> None:
    gated_main(ROOT, __doc__.splitlines()[0], "autogluon", RELEASES, check, run_release, render,
               install)


if __name__ == "__main__":
    main()
