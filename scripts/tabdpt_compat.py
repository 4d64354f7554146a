#!/usr/bin/env python3
"""Run the TabDPT host's checks on every tabdpt release, each in its own virtual environment,
and write ``results/tabdpt-compat.md`` (the table the host's version gate rests on).

Per release ``X`` the environment ``VENVS/tabdpt-X`` is the main environment (the interpreter
running this script) with ``tabdpt==X`` installed on top, and whatever that release pins
(:func:`release_envs.layered_venv`) except torch, which stays the main environment's; a release
that pins another torch (1.1.2 pins 2.7.1) is installed alone (``--no-deps``), which is enough
to import its ``TabDPTModel`` and see the host's gate refuse it. In it:

1. the release ships ``tabdpt.model.TabDPTModel`` (every release on the registry does);
2. a release the host's gate admits passes the TabDPT tests (``tests/hosts/tabdpt``);
3. a release the gate refuses: retrofitting an instance of the release's own ``TabDPTModel`` is
   refused naming the release (never a bare import error, never "no registered host matches").

Usage: ``python scripts/tabdpt_compat.py [--venvs DIR] [--releases 1.3.0,1.3.1] [--out FILE]``.
``--check`` is the in-environment steps 1 and 3 (prints one JSON line).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from release_envs import (gated_check, gated_main, gated_outcome, gated_release, layered_venv,
                          receipt, refusal_cell)

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/hosts/tabdpt"]
# every release on the registry (pip index versions tabdpt); each ships tabdpt.model.TabDPTModel
RELEASES = ["0.1.0", "1.1.2", "1.1.3", "1.1.4", "1.1.5", "1.1.6", "1.1.7", "1.1.8", "1.1.9",
            "1.1.10", "1.1.11", "1.1.12", "1.1.13", "1.1.14", "1.2.0", "1.3.0", "1.3.1"]


def check() -> dict:
    """Steps 1 and 3 inside one environment: whether the release ships the model class, and on a
    release the gate refuses, what retrofitting the class says."""
    import importlib.metadata

    import torch

    from oretrofit.hosts.tabdpt import releases
    found = {"tabdpt": importlib.metadata.version("tabdpt"), "torch": torch.__version__}
    return gated_check(found, "tabdpt.model", "TabDPTModel",
                       lambda: releases.check_release(releases.installed_version()))


def install(venv: Path, release: str) -> str | None:
    """The release's environment: with its pins but the main environment's torch, or alone
    (``--no-deps``) when it pins another torch; how, when alone: pip's word on the pin the
    environment does not meet (also for an environment built before)."""
    try:
        layered_venv(venv, "tabdpt", release, keep=("torch",))
    except RuntimeError:
        layered_venv(venv, "tabdpt", release, deps=False)
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"],
                           capture_output=True, text=True).stdout.splitlines()
    unmet = sorted((line for line in check if line.startswith(f"tabdpt {release} ")),
                   key=lambda line: "torch" not in line)
    return f"alone (--no-deps): {unmet[0]} ({len(unmet)} unmet)" if unmet else None


def run_release(venv: Path, release: str, source: Path) -> dict:
    """The checks for one release (:func:`release_envs.gated_release`)."""
    return gated_release(venv, release, source, "tabdpt", TESTS)


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    return receipt(
        "TabDPT host: tabdpt release compatibility",
        "Written by `scripts/tabdpt_compat.py`; do not edit by hand. One layered virtual "
        "environment per release (the main environment, torch 2.13.0 CPU, with `tabdpt==X` and "
        "what it pins installed on top, torch kept; a release pinning another torch is "
        "installed alone, as its `installed` cell says), running an export of the commit below. "
        "Every tabdpt release on the registry ships `tabdpt.model.TabDPTModel`. A release passes "
        f"when the TabDPT tests pass ({', '.join(f'`{t}`' for t in TESTS)}). The host's version "
        "gate admits exactly the passing releases; a release it refuses (`refused`) is not put "
        "through the tests: its row shows that retrofitting an instance of the release's own "
        "`TabDPTModel` is refused naming the release, with the `pip install` that fixes it.",
        command, commit,
        ["tabdpt", "outcome", "TabDPT tests", "refusal", "installed", "torch", "wall s"],
        [[row["release"], gated_outcome(row), row["tests"], refusal_cell(row, 120),
          row.get("install", "with its pins"), row["result"].get("torch", "-"), row["wall_s"]]
         for row in rows])


def main() -> None:
    gated_main(ROOT, __doc__.splitlines()[0], "tabdpt", RELEASES, check, run_release, render, install)


if __name__ == "__main__":
    main()
