#!/usr/bin/env python3
"""Run the generic transformers host's tests on transformers releases, each in its own layered
environment, and write ``results/transformers-compat.md`` (+ ``.json``), the table the
transformers version claim rests on.

Per release ``X`` the environment ``VENVS/transformers-X`` is the main environment (the
interpreter running this script) with ``transformers==X`` installed on top, and whatever that
release pins (huggingface-hub, tokenizers, ...) with it (:func:`release_envs.layered_venv`). The
host's tests (:data:`TESTS`: tiny random configs of every architecture in the zoo, the real
all-MiniLM-L6-v2 and SmolLM2-135M-Instruct weights, composition with the other hosts and
``oretrofit check``) run there on an export of the committed HEAD, and
``scripts/transformers_coverage.py`` probes what the host does with each architecture there. A
release passes when the tests all pass. The releases run newest first and the table (oldest
first) is rewritten after every one, so an interrupted sweep leaves the rows that bound the
supported range.

Usage: ``python scripts/transformers_compat.py [--venvs DIR] [--releases 5.0.0,5.25.0]
[--out FILE] [--min-free-gib N] [--merge OTHER.json ...]`` (two halves of a sweep may run in
parallel, each with its own ``--out``; ``--releases "" --merge A.json --merge B.json`` then
writes the table of both).
"""

from __future__ import annotations

import argparse
import ast
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
                          markdown_table, provenance_lines, pytest_failures, pytest_summary,
                          receipt_command)

ROOT = Path(__file__).resolve().parent.parent
# the host's behaviour; tests/test_docs_transformers.py (the docs' generated blocks) is not
# (the Makefile's TRANSFORMERS_TESTS: tests/test_release_envs.py keeps them equal)
TESTS = ["tests/hosts/transformers/test_architectures.py",
         "tests/hosts/transformers/test_bert.py", "tests/hosts/transformers/test_llama.py",
         "tests/hosts/transformers/test_pretrained.py",
         "tests/hosts/transformers/test_overrides.py", "tests/hosts/transformers/test_calls.py",
         "tests/_surgery/test_compose.py", "tests/cli/test_check.py"]
# the newest patch release of every minor on PyPI with the attention mask interface (4.53 on),
# and earlier patch releases users pin (4.56.1, 4.57.1, ...), oldest first; every sweep tries
# them all (5.25.0 requires kernels>=0.19.1, which did not install at first: its row said so
# until it did)
RELEASES = ["4.53.3", "4.54.1", "4.55.4", "4.56.1", "4.56.2", "4.57.1", "4.57.6", "5.0.0",
            "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1", "5.9.0",
            "5.10.4", "5.11.0", "5.12.1", "5.13.1", "5.14.1", "5.15.1", "5.16.0", "5.16.1",
            "5.17.0", "5.18.0", "5.19.0", "5.20.1", "5.20.2", "5.21.1", "5.22.1", "5.22.2",
            "5.23.0", "5.24.0", "5.25.0"]
# optional packages transformers imports when they are installed: where the main environment's
# release is outside the bound the transformers release declares for it (its
# dependency_versions_table), the layer hides it, as for a user who has not installed it (the
# main environment's kernels 0.19 needs huggingface-hub 1.x, which 4.x's layers replace by 0.x:
# transformers 4.53-4.55 then fail at import, and 4.57 asks kernels for a CUDA kernel to build
# Mamba on a CPU)
IMPORTED_OPTIONAL = ("kernels",)
_OUTSIDE_BOUND = """
import importlib.metadata as metadata, sys
from packaging.requirements import Requirement
from transformers.dependency_versions_table import deps
for name in sys.argv[1:]:
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        continue
    if name in deps and not Requirement(deps[name]).specifier.contains(installed, True):
        print(name)
"""
# the layer's .pth that hides them: a None entry in sys.modules makes importlib.util.find_spec
# answer None and an import raise ImportError, as for a package that is not installed
_HIDING_PTH = "_oretrofit_hidden.pth"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def hide_imported_optional(python: Path) -> list[str]:
    """Hide from the layer of ``python`` each package of :data:`IMPORTED_OPTIONAL` the main
    environment holds outside the bound its transformers release declares; their names."""
    pth = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                               "print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                              text=True, check=True).stdout.strip()) / _HIDING_PTH
    pth.unlink(missing_ok=True)
    hidden = subprocess.run([str(python), "-c", _OUTSIDE_BOUND, *IMPORTED_OPTIONAL],
                            capture_output=True, text=True, check=True).stdout.split()
    if hidden:
        pth.write_text("import sys; " + "; ".join(f"sys.modules[{name!r}] = None"
                                                  for name in hidden) + "\n")
    return hidden


def run_release(venv: Path, release: str, source: Path) -> dict:
    """The host's tests under ``release`` (its layer built first when missing)."""
    start = time.monotonic()
    try:
        layered_venv(venv, "transformers", release)
        hidden = hide_imported_optional(venv / "bin" / "python")
    except RuntimeError as err:
        return {"release": release, "ok": False, "tests": "install failed",
                "failures": [str(err).splitlines()[-1]], "layer": [], "torch": "-", "wall_s": 0}
    python = str(venv / "bin" / "python")
    # the export's code, not the editable checkout; the gate lifted for this release only (the
    # sweep measures releases the gate does not admit yet)
    env = {**ENV, "PYTHONPATH": str(source), "ORETROFIT_COMPAT_SWEEP_RELEASE": release}
    tests = subprocess.run([python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                            *TESTS], cwd=source, env=env, capture_output=True, text=True)
    torch = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout.strip() or "?"
    probe = subprocess.run([python, str(source / "scripts" / "transformers_coverage.py")],
                           cwd=source, env=env, capture_output=True, text=True)
    coverage = json.loads(probe.stdout)["archs"] if probe.returncode == 0 else {}
    return {"release": release, "ok": tests.returncode == 0, "test_files": TESTS,
            "tests": pytest_summary(tests.stdout), "failures": pytest_failures(tests.stdout),
            "coverage": coverage,
            "layer": [*layer_packages(venv), *(f"{name} hidden" for name in hidden)],
            "torch": torch,
            "wall_s": round(time.monotonic() - start)}


def tests_at(commit: str) -> list[str]:
    """:data:`TESTS` as this script held it at ``commit`` (what a row that does not record its
    test files ran)."""
    text = subprocess.run(["git", "show", f"{commit}:scripts/transformers_compat.py"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    return next(ast.literal_eval(node.value) for node in ast.parse(text).body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TESTS")


def test_sets(rows: list[dict]) -> dict[tuple[str, ...], str]:
    """Each distinct list of test files the rows ran -> its label (``A``, ``B``, ...)."""
    found = dict.fromkeys(tuple(row["test_files"]) for row in rows)
    return {files: chr(ord("A") + i) for i, files in enumerate(found)}


def coverage_text(row: dict) -> str:
    """The zoo in one release as the tests take it: supported architectures covered (every
    contract run), refused (covered from a later release) and absent (a later model type), and
    the refused list; ``-`` without a probe."""
    expected = [entry[1] for entry in row.get("coverage", {}).values()]
    if not expected:
        return "-"
    count = expected.count
    return (f"{count('covered')} covered, {count('refused') + count('absent')} refused "
            f"({count('absent')} absent), {count('never')} never")


def covered_from(rows: list[dict]) -> dict[str, str]:
    """model type -> the first passing release from which the raw host (no gate, no table) covers
    it in every later passing row, for those not covered in the oldest passing row (the
    COVERED_FROM entries a probe measures)."""
    probed = [row for row in rows if row.get("coverage")]
    passing = [row for row in probed if row["ok"]]
    first: dict[str, str] = {}
    for name, entry in (passing[0]["coverage"].items() if passing else ()):
        statuses = [(row["release"], row["coverage"].get(name, [None, None, None])[2])
                    for row in passing]
        if entry[1] == "never" or statuses[0][1] == "covered":
            continue
        later = [release for i, (release, _) in enumerate(statuses)
                 if all(status == "covered" for _, status in statuses[i:])]
        if later:
            first[entry[0]] = later[0]
    return first


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    sets = test_sets(rows)
    lines = [
        "# Generic transformers host: transformers release compatibility",
        "",
        "Written by `scripts/transformers_compat.py`; do not edit by hand. One layered virtual "
        "environment per release: the main environment (torch and the rest of "
        "`[all,models,test]`) underneath, `transformers==X` and the packages that release pins "
        "installed on top, and an optional package transformers imports hidden where the main "
        "environment's release of it is outside the bound that release declares (column "
        "*layer*). A release passes when the transformers host's tests of its row pass "
        "(column *test set*: "
        + "; ".join(f"{label} = {', '.join(f'`{t}`' for t in files)}"
                    for files, label in sets.items())
        + "): each architecture of "
        "`tests/hosts/transformers/zoo.py` the host covers in that release must hold every "
        "contract, each it covers only from a later release (`COVERED_FROM`) must be refused "
        "naming that release (column *zoo*: supported architectures covered, refused there "
        "(of them absent, a model type the release does not have yet), and the refused list, "
        "refused in every release; per architecture in the .json). The host's version gate "
        "(`oretrofit/hosts/transformers/releases.py`) admits the passing releases and the "
        "earlier patch releases of their minors down to the oldest passing row, and refuses "
        "every other release naming why.",
        "",
        *provenance_lines(command, ", ".join(dict.fromkeys(
            row.get("commit", commit) for row in rows)) or commit),
        "",
        *markdown_table(
            ["transformers", "outcome", "test set", "host tests", "zoo",
             "first failure (all in the .json)", "layer", "torch", "wall s", "commit"],
            [[row["release"], "pass" if row["ok"] else "FAIL", sets[tuple(row["test_files"])],
              row["tests"], coverage_text(row),
              (row["failures"] or ["-"])[0][:160], ", ".join(row["layer"]) or "none",
              row["torch"], row["wall_s"], f"`{row.get('commit', commit)}`"] for row in rows]),
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
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="the .json of another run of this commit (e.g. the other half of a "
                             "sweep run in parallel): its rows join the table, unless rerun here "
                             "or in a later --merge file")
    args = parser.parse_args()
    args.venvs.mkdir(parents=True, exist_ok=True)
    releases = [release for release in args.releases.split(",") if release]
    source = export_head(ROOT, Path(tempfile.mkdtemp(prefix="transformers-compat-")))
    commit = head_commit(ROOT)
    command = receipt_command("scripts/transformers_compat.py", sys.argv[1:],
                              {args.venvs: "VENVS", **{path: f"PART{i}.json"
                                                       for i, path in enumerate(args.merge, 1)}})
    # a release in a later --merge file replaces its row of an earlier one (a rerun)
    merged_rows = {row["release"]: {"test_files": tests_at(row["commit"]), **row}
                   for merged in args.merge for row in json.loads(merged.read_text())
                   if row["release"] not in releases}
    rows = sorted(merged_rows.values(), key=lambda row: Version(row["release"]))
    if rows and not releases:
        args.out.write_text(render(rows, command, commit))
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    for release in sorted(releases, key=Version, reverse=True):
        venv = args.venvs / f"transformers-{release}"
        row = {**run_release(venv, release, source), "commit": commit}
        print(f"{release}: {'pass' if row['ok'] else 'FAIL'} ({row['tests']}, {row['wall_s']} s)",
              flush=True)
        rows = sorted([*rows, row], key=lambda done: Version(done["release"]))
        args.out.write_text(render(rows, command, commit))
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
        if shutil.disk_usage(args.venvs).free < args.min_free_gib * 2**30:
            shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(source, ignore_errors=True)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    print("model types the probes find covered only from a release on (COVERED_FROM's "
          f"interface rows): {json.dumps(covered_from(rows))}")
    sys.exit(0 if all(row["ok"] for row in rows) else 1)


if __name__ == "__main__":
    main()
