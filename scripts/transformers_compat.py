#!/usr/bin/env python3
"""Run the generic transformers host's tests on transformers releases, each in its own layered
environment, and write ``results/transformers-compat.md`` (+ ``.json``), the table the
transformers version claim rests on.

Per release ``X`` the environment ``VENVS/transformers-X`` is the main environment (the
interpreter running this script) with ``transformers==X`` installed on top, and whatever that
release pins (huggingface-hub, tokenizers, ...) with it (:func:`release_envs.layered_venv`). The
host's tests (:data:`TESTS`: tiny random configs of every architecture in the zoo, the real
all-MiniLM-L6-v2 and SmolLM2-135M-Instruct weights, composition with the other hosts and
``oretrofit check``) run there on an export of the committed HEAD. A release passes when they all
pass. The releases run newest first and the table (oldest first) is rewritten after every
one, so an interrupted sweep leaves the rows that bound the supported range.

Usage: ``python scripts/transformers_compat.py [--venvs DIR] [--releases 5.0.0,5.25.0]
[--out FILE] [--min-free-gib N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version
from release_envs import (export_head, head_commit, layer_packages, layered_venv,
                          markdown_table, provenance_lines, pytest_summary, receipt_command)

ROOT = Path(__file__).resolve().parent.parent
# the host's behaviour; tests/test_docs_transformers.py (the docs' generated blocks) is not
TESTS = ["tests/hosts/transformers/test_architectures.py",
         "tests/hosts/transformers/test_bert.py", "tests/hosts/transformers/test_llama.py",
         "tests/hosts/test_compose.py", "tests/cli/test_check.py"]
# the newest patch release of every 5.x minor on PyPI, oldest first
RELEASES = ["5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1",
            "5.9.0", "5.10.4", "5.11.0", "5.12.1", "5.13.1", "5.14.1", "5.15.1", "5.16.1",
            "5.17.0", "5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0",
            "5.25.0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _failures(output: str) -> list[str]:
    """The ``FAILED``/``ERROR`` lines of pytest's short summary (``-rfE``)."""
    return [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def run_release(venv: Path, release: str, source: Path) -> dict:
    """The host's tests under ``release`` (its layer built first when missing)."""
    start = time.monotonic()
    try:
        layered_venv(venv, "transformers", release)
    except RuntimeError as err:
        return {"release": release, "ok": False, "tests": "install failed",
                "failures": [str(err).splitlines()[-1]], "layer": [], "torch": "-", "wall_s": 0}
    python = str(venv / "bin" / "python")
    env = {**ENV, "PYTHONPATH": str(source)}       # the export's code, not the editable checkout
    tests = subprocess.run([python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                            *TESTS], cwd=source, env=env, capture_output=True, text=True)
    torch = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout.strip() or "?"
    return {"release": release, "ok": tests.returncode == 0,
            "tests": pytest_summary(tests.stdout), "failures": _failures(tests.stdout),
            "layer": layer_packages(venv), "torch": torch,
            "wall_s": round(time.monotonic() - start)}


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    lines = [
        "# Generic transformers host: transformers release compatibility",
        "",
        "Written by `scripts/transformers_compat.py`; do not edit by hand. One layered virtual "
        "environment per release: the main environment (torch and the rest of "
        "`[all,models,test]`) underneath, `transformers==X` and the packages that release pins "
        "installed on top (column *layer*). A release passes when the transformers host's tests "
        f"pass ({', '.join(f'`{t}`' for t in TESTS)}). The host's version gate "
        "(`oretrofit/hosts/transformers/releases.py`) admits the passing releases and the later "
        "patch releases of their minors, and refuses every other release.",
        "",
        *provenance_lines(command, commit),
        "",
        *markdown_table(
            ["transformers", "outcome", "host tests", "first failure (all in the .json)", "layer",
             "torch", "wall s"],
            [[row["release"], "pass" if row["ok"] else "FAIL", row["tests"],
              (row["failures"] or ["-"])[0][:160], ", ".join(row["layer"]) or "none",
              row["torch"], row["wall_s"]] for row in rows]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venvs", type=Path,
                        default=Path.home() / ".cache" / "oretrofit" / "transformers-venvs",
                        help="folder of the per-release environments (outside the checkout)")
    parser.add_argument("--releases", default=",".join(RELEASES))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "transformers-compat.md")
    parser.add_argument("--min-free-gib", type=float, default=10.0,
                        help="remove each release's environment after its row when the disk "
                             "holding VENVS has less free space than this")
    args = parser.parse_args()
    args.venvs.mkdir(parents=True, exist_ok=True)
    source = export_head(ROOT, Path(tempfile.mkdtemp(prefix="transformers-compat-")))
    commit = head_commit(ROOT)
    command = receipt_command("scripts/transformers_compat.py", sys.argv[1:],
                              {args.venvs: "VENVS"})
    rows: list[dict] = []
    for release in sorted(args.releases.split(","), key=Version, reverse=True):
        venv = args.venvs / f"transformers-{release}"
        row = run_release(venv, release, source)
        print(f"{release}: {'pass' if row['ok'] else 'FAIL'} ({row['tests']}, {row['wall_s']} s)",
              flush=True)
        rows = sorted([*rows, row], key=lambda done: Version(done["release"]))
        args.out.write_text(render(rows, command, commit))
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
        if shutil.disk_usage(args.venvs).free < args.min_free_gib * 2**30:
            shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(source, ignore_errors=True)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    sys.exit(0 if all(row["ok"] for row in rows) else 1)


if __name__ == "__main__":
    main()
