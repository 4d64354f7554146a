#!/usr/bin/env python3
"""Run the TabPFN v3 host's checks on every tabpfn release, each in its own virtual environment,
and write ``results/tabpfn-compat.md`` (the table the version claim rests on).

Per release ``X`` the environment ``VENVS/tabpfn-X`` is created when missing (``torch==2.13.0``
first, a CPU build; then this checkout ``-e .[regress,datasets,test]`` and ``tabpfn==X``) and:

1. the TabPFN tests: ``tests/hosts/tabpfn tests/regress/test_cli.py``;
2. ``make_regressor("random", arm, 1e-8)`` fits and predicts sklearn's diabetes table for every
   arm; each arm's max |Δ| / max |base| is recorded (must be ≤ 1e-4);
3. ``oretrofit patch --model-path demo`` must run, or refuse with a message (never a traceback).

Usage: ``python scripts/tabpfn_compat.py [--venvs DIR] [--releases 8.0.1,9.2.0] [--out FILE]``.
``--check`` is the in-environment step 2 (prints one JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from release_envs import (export_head, head_commit, markdown_table, provenance_lines,
                          pytest_summary, receipt_command)

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/hosts/tabpfn", "tests/regress/test_cli.py"]
# the documentation's consistency with the committed results, not release behaviour
IGNORED = ["--ignore=tests/hosts/tabpfn/test_docs.py"]
RELEASES = ["8.0.1", "8.0.2", "8.0.3", "8.0.4", "8.0.5", "8.0.6", "8.0.7", "8.0.8", "8.1.0",
            "8.2.0", "8.3.0", "8.4.0", "8.5.0", "9.0.0", "9.1.0", "9.2.0"]
ARMS = ("base", "oa", "full-o")
TAU, MAX_REL = 1e-8, 1e-4
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SOURCE = ROOT          # where the checks run: an export of the committed HEAD (see main)


def check() -> dict:
    """Step 2, inside one environment: diabetes through the random host for every arm."""
    import importlib.metadata

    import numpy as np
    import torch
    from sklearn.datasets import load_diabetes

    from oretrofit.tabpfn import make_regressor
    x, y = load_diabetes(return_X_y=True)
    predictions = {}
    for arm in ARMS:
        regressor, _ = make_regressor("random", arm, TAU)
        predictions[arm] = regressor.fit(x[:300], y[:300]).predict(x[300:])
    base = predictions["base"]
    rel = {arm: float(np.abs(p - base).max() / np.abs(base).max()) for arm, p in predictions.items()}
    return {"tabpfn": importlib.metadata.version("tabpfn"),
            "torch": torch.__version__, "rel": rel,
            "finite": bool(all(np.isfinite(p).all() for p in predictions.values()))}


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**ENV, "PYTHONPATH": str(SOURCE)}      # the export's code, not the editable checkout
    return subprocess.run(cmd, cwd=SOURCE, env=env, capture_output=True, text=True, **kwargs)


def ensure_venv(venv: Path, release: str) -> None:
    """Create ``venv`` with tabpfn ``release`` and this checkout (skipped when it has them)."""
    python = venv / "bin" / "python"
    if python.exists() and _run([str(python), "-c", f"import importlib.metadata as m; "
                                 f"assert m.version('tabpfn') == '{release}'; import oretrofit"]
                                ).returncode == 0:
        return
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", "torch==2.13.0"],
             [str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[regress,datasets,test]",
              f"tabpfn=={release}"]]
    for step in steps:
        done = _run(step)
        if done.returncode:
            raise RuntimeError(f"{shlex.join(step)} failed:\n{done.stderr[-2000:]}")


def run_release(venv: Path, release: str) -> dict:
    """All three checks for one release; ``ok`` only when every one passes."""
    python = str(venv / "bin" / "python")
    start = time.monotonic()
    tests = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *IGNORED])
    checked = _run([python, str(SOURCE / "scripts" / "tabpfn_compat.py"), "--check"])
    try:
        diabetes = json.loads(checked.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        diabetes = {"error": (checked.stderr.strip().splitlines() or ["no output"])[-1]}
    demo = _run([str(venv / "bin" / "oretrofit"), "patch", "--model-path", "demo", "--arm",
                 "full-o", "--tau", str(TAU), "--json"])
    traceback = "Traceback" in demo.stderr
    # the export's temporary path is this machine's; the table names the checkout instead
    refusal = (demo.stderr.strip().splitlines() or ["?"])[-1].replace(str(SOURCE), "<checkout>")
    demo_outcome = ("runs" if demo.returncode == 0 else "traceback" if traceback else
                    "refused: " + refusal[:120])
    rel = diabetes.get("rel", {})
    diabetes_ok = (diabetes.get("finite", False) and rel.get("base") == 0.0
                   and all(v <= MAX_REL for v in rel.values()))
    ok = tests.returncode == 0 and diabetes_ok and not traceback
    return {"release": release, "ok": ok, "tests": pytest_summary(tests.stdout),
            "tests_rc": tests.returncode, "diabetes": diabetes, "demo": demo_outcome,
            "torch": diabetes.get("torch", "?"), "wall_s": round(time.monotonic() - start)}


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    def rel(row: dict, arm: str) -> str:
        value = row["diabetes"].get("rel", {}).get(arm)
        return "-" if value is None else f"{value:.2e}"

    lines = [
        "# TabPFN v3 host: tabpfn release compatibility",
        "",
        "Written by `scripts/tabpfn_compat.py`; do not edit by hand. One fresh virtual "
        "environment per release (torch 2.13.0 CPU, then this checkout with "
        "`[regress,datasets,test]` and `tabpfn==X`). A release passes when (1) the TabPFN "
        f"tests pass ({', '.join(f'`{t}`' for t in TESTS)}, without the documentation's "
        "`tests/hosts/tabpfn/test_docs.py`), (2) `make_regressor(\"random\", arm, "
        f"{TAU:g})` fits sklearn's diabetes table (300 train rows, 142 test rows) under every arm "
        f"with finite predictions, base exact and max|Δ|/max|base| ≤ {MAX_REL:g} for oa and full-o, "
        "and (3) `oretrofit patch --model-path demo` runs or refuses with a message, never a "
        "traceback. The host's version gate admits exactly the passing releases.",
        "",
        *provenance_lines(command, commit),
        "",
        *markdown_table(
            ["tabpfn", "outcome", "TabPFN tests", "diabetes oa Δ", "diabetes full-o Δ", "demo",
             "torch", "wall s"],
            [[row["release"], "pass" if row["ok"] else "FAIL", row["tests"], rel(row, "oa"),
              rel(row, "full-o"), row["demo"], row["torch"], row["wall_s"]] for row in rows]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="in-environment diabetes check")
    parser.add_argument("--venvs", type=Path,
                        default=Path.home() / ".cache" / "oretrofit" / "tabpfn-venvs",
                        help="folder of the per-release environments (outside the checkout)")
    parser.add_argument("--releases", default=",".join(RELEASES))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "tabpfn-compat.md")
    args = parser.parse_args()
    if args.check:
        print(json.dumps(check()))
        return
    global SOURCE
    SOURCE = export_head(ROOT, Path(tempfile.mkdtemp(prefix="tabpfn-compat-")))
    commit = head_commit(ROOT)
    rows = []
    for release in args.releases.split(","):
        venv = args.venvs / f"tabpfn-{release}"
        try:
            ensure_venv(venv, release)
            rows.append(run_release(venv, release))
        except RuntimeError as err:
            rows.append({"release": release, "ok": False, "tests": f"install failed: {err}"[:200],
                         "tests_rc": -1, "diabetes": {}, "demo": "-", "torch": "-", "wall_s": 0})
        print(f"{release}: {'pass' if rows[-1]['ok'] else 'FAIL'} ({rows[-1]['tests']})",
              flush=True)
    # where the environments lived is this machine's business, not the receipt's
    command = receipt_command("scripts/tabpfn_compat.py", sys.argv[1:], {args.venvs: "VENVS"})
    args.out.write_text(render(rows, command, commit))
    json_path = args.out.with_suffix(".json")
    json_path.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {args.out} and {json_path}")
    sys.exit(0 if all(row["ok"] for row in rows) else 1)


if __name__ == "__main__":
    main()
