#!/usr/bin/env python3
"""Run the TabPFN host's checks on every tabpfn release, each in its own virtual environment,
and write ``results/tabpfn-compat.md`` (the table the version claim rests on), with a column per
TabPFN model version (``oretrofit.hosts.tabpfn.versions``).

Per release ``X`` the environment ``VENVS/tabpfn-X`` is the main environment (the interpreter
running this script) with ``tabpfn==X`` installed on top, and whatever that release pins
(:func:`release_envs.layered_venv`, as the Makefile's ``test-tabpfn-oldest``), and:

1. the TabPFN tests: ``tests/hosts/tabpfn tests/regress/test_cli.py`` (they run every model
   version the release ships: ``tests/hosts/tabpfn/test_versions.py``);
2. ``make_regressor("random", arm, 1e-8)`` fits and predicts sklearn's diabetes table for every
   arm; each arm's max |Δ| / max |base| is recorded (must be ≤ 1e-4);
3. per model version the release ships: a random model from the version's own config, both
   tasks, float64, retrofitted under oa and full-o at τ = ε = 1e-12: the largest relative
   deviation of its predictions from the unpatched model's (must be ≤ 1e-5); a refused version
   must be refused by name;
4. ``oretrofit patch --model-path demo`` must run, or refuse with a message (never a traceback);
5. ``make_regressor("demo", arm, 1e-8)`` (the shipped demo checkpoint) fits diabetes under
   full-o at tabpfn's defaults, and under base and full-o at step 2's settings, with finite
   predictions and (at step 2's settings) full-o's max |Δ| / max |base| ≤ 1e-4, or is refused
   by name (a ``RetrofitError``: an inference-config field the release can neither take nor
   express another way, ``oretrofit.hosts.tabpfn.releases.INFERENCE_FIELDS``).

A release the host's gate refuses (tabpfn 2.x to 7.x) skips 1 and 2; its row is ``refused``
when the gate, every model version the release ships and the demo command all refuse it by name.

Usage: ``python scripts/tabpfn_compat.py [--venvs DIR] [--releases 8.0.1,9.2.0] [--out FILE]
[--keep-tests]``. ``--check`` is the in-environment step 2 (prints one JSON line).
``--keep-tests`` runs steps 2 to 5 only and keeps each release's step 1 from the receipt's
earlier row, its cell marked with the commit it ran on: for filling in a check that an earlier
sweep did not have, where the tests of a release take long (a release without an earlier
passing test run gets them run).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version

from release_envs import (check_result, export_head, head_commit, layered_venv, markdown_table,
                          provenance_lines, pytest_failures, pytest_summary, receipt_command,
                          refusal, run_in)

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/hosts/tabpfn", "tests/regress/test_cli.py"]
# the documentation's consistency with the committed results, not release behaviour; and the
# calibration of random hosts (minutes a release; the same code on every release)
IGNORED = ["--ignore=tests/hosts/tabpfn/test_docs.py",
           "--ignore=tests/hosts/tabpfn/test_calibrate_versions.py"]
RELEASES = ["2.0.0", "2.2.1", "6.0.0", "6.4.1", "7.0.0", "7.1.1",       # refused by the gate
            "8.0.1", "8.0.2", "8.0.3", "8.0.4", "8.0.5", "8.0.6", "8.0.7", "8.0.8", "8.1.0",
            "8.2.0", "8.3.0", "8.4.0", "8.5.0", "9.0.0", "9.1.0", "9.2.0"]
ARMS = ("base", "oa", "full-o")
# the model versions of oretrofit.hosts.tabpfn.versions.VERSIONS, one column each (the table is
# written outside the release environments; tests/test_release_envs.py keeps them equal)
LABELS = ("v2", "v2.5", "v2.6", "v3", "v3.5", "v2 PFT")
TAU, MAX_REL = 1e-8, 1e-4
# the settings check (2) runs every release at, with float32 (tabpfn's "auto" precision is
# bfloat16 autocast on a CPU with native bfloat16, and 8.0.1 has no n_estimators="auto")
PINNED = {"n_estimators": 1, "device": "cpu"}
VERSION_TAU, VERSION_REL = 1e-12, 1e-5
SOURCE = ROOT          # where the checks run: an export of the committed HEAD (see main)


def check() -> dict:
    """Steps 2 and 3, inside one environment: diabetes through the random host for every arm,
    and each model version; on a release the host's gate refuses, the refusal instead (its
    message, and each model version the release ships refused by name)."""
    import importlib.metadata

    import torch

    from oretrofit import RetrofitError
    from oretrofit.hosts.tabpfn import releases
    found = {"tabpfn": importlib.metadata.version("tabpfn"), "torch": torch.__version__}
    try:
        releases.require_tested_release()
    except RetrofitError as err:
        return {**found, "refused": str(err), "versions": check_versions(refused=True)}
    import numpy as np
    from sklearn.datasets import load_diabetes

    from oretrofit.tabpfn import make_regressor
    x, y = load_diabetes(return_X_y=True)
    predictions = {}
    for arm in ARMS:
        regressor, _ = make_regressor("random", arm, None if arm == "base" else TAU,
                                      inference_precision=torch.float32, **PINNED)
        predictions[arm] = regressor.fit(x[:300], y[:300]).predict(x[300:])
    base = predictions["base"]
    rel = {arm: float(np.abs(p - base).max() / np.abs(base).max()) for arm, p in predictions.items()}
    return {**found, "rel": rel, "versions": check_versions(refused=False),
            "finite": bool(all(np.isfinite(p).all() for p in predictions.values())),
            "demo_fit": demo_fit(x, y)}


def demo_fit(x, y) -> dict:
    """Step 5: the shipped demo checkpoint through ``make_regressor`` on diabetes: under full-o
    at tabpfn's defaults, and under base and full-o at step 2's settings (``finite``: all three;
    full-o's ``rel`` deviation from base at step 2's settings, where every release is compared
    alike), or its refusal by name."""
    import numpy as np
    import torch

    from oretrofit import RetrofitError
    from oretrofit.tabpfn import make_regressor
    pinned = {"inference_precision": torch.float32, **PINNED}
    try:
        found = {(arm, settings): make_regressor("demo", arm, None if arm == "base" else TAU,
                                                 **kwargs)[0]
                 .fit(x[:300], y[:300]).predict(x[300:])
                 for arm, settings, kwargs in (("full-o", "defaults", {}),
                                               ("base", "pinned", pinned),
                                               ("full-o", "pinned", pinned))}
    except RetrofitError as err:
        return {"refused": str(err).replace(str(SOURCE), "<checkout>")}
    base = found["base", "pinned"]
    return {"finite": bool(all(np.isfinite(p).all() for p in found.values())),
            "rel": float(np.abs(found["full-o", "pinned"] - base).max() / np.abs(base).max())}


def _demo_fit_ok(found: dict) -> bool:
    return "refused" in found or (found.get("finite", False) and found["rel"] <= MAX_REL)


def _demo_fit_cell(row: dict) -> str:
    found = row["diabetes"].get("demo_fit")
    if found is None:
        return f"not run ({row['from_commit']})" if "from_commit" in row else "-"
    if "refused" in found:
        return "refused: " + found["refused"][:100]
    return f"{found['rel']:.2e}" if found["finite"] else "non-finite"


def _ships(module: str) -> bool:
    """Whether the installed tabpfn has ``module`` (False also when a parent package is
    missing)."""
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _refusal_cell(row, module: str, release_refused: bool) -> str:
    """``refused`` when retrofitting an instance of ``row``'s class (from ``module``; its
    weights do not matter here) raises naming the model version, or the release when the gate
    refuses it."""
    import importlib

    from oretrofit.hosts.tabpfn.releases import installed_version
    said = refusal(getattr(importlib.import_module(module), row.cls))
    # a model version the host retrofits is refused by the release; any other by its own name
    named = (f"tabpfn {installed_version()} " if release_refused and row.sites
             else f"TabPFN {row.label}")
    return "refused" if named in said else said


def check_versions(refused: bool) -> dict[str, str]:
    """Step 3: per model version of the table, ``-`` (not shipped by this release),
    ``refused`` (refused by name; every version a ``refused`` release ships), or the largest
    τ→0 relative deviation (both tasks, both arms) as ``1.2e-13``; ``error: …`` when the check
    itself fails."""
    from oretrofit.hosts.tabpfn import versions
    out: dict[str, str] = {}
    for row in versions.VERSIONS:
        module = next((name for name in row.defining_modules if _ships(name)), None)
        if module is None:
            out[row.label] = "-"
            continue
        try:
            out[row.label] = (_refusal_cell(row, module, refused) if refused or row.sites is None
                              else f"{_tau_deviation(row):.1e}")
        except Exception as err:  # noqa: BLE001  (the receipt says what failed)
            out[row.label] = f"error: {type(err).__name__}: {str(err)[:80]}"
    return out


def _tau_deviation(row) -> float:
    """The largest relative deviation of a random ``row`` model's predictions from the
    unpatched model's, both tasks, oa and full-o, float64, τ = ε = VERSION_TAU."""
    import torch
    from tabpfn.architectures.interface import PerformanceOptions

    import oretrofit
    from oretrofit.hosts.tabpfn.checkpoints import random_model
    full = PerformanceOptions(use_chunkwise_inference=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(26, 1, 4, generator=g, dtype=torch.float64)
    y = x[:20, 0] @ torch.randn(4, generator=g, dtype=torch.float64)
    worst = 0.0
    for task in ("regressor", "classifier"):
        model = random_model(row.label, "small", 0, task)[0].double()
        target = torch.bucketize(y, y.new_tensor([-0.5, 0.5])).double() \
            if task == "classifier" else y
        kw = ({"task_type": "multiclass" if task == "classifier" else "regression"}
              if row.label == "v3.5" else {})
        with torch.no_grad():
            base = model(x, target, performance_options=full, **kw)
            for arm in ("oa", "full-o"):
                with oretrofit.retrofitted(model, arm, VERSION_TAU, eps=VERSION_TAU):
                    patched = model(x, target, performance_options=full, **kw)
                worst = max(worst, float((patched - base).abs().max() / base.abs().max()))
    return worst


def _version_ok(cell: str) -> bool:
    """A model-version cell of an admitted release: not shipped, refused by name, or within
    VERSION_REL."""
    if cell in ("-", "refused"):
        return True
    try:
        return float(cell) <= VERSION_REL
    except ValueError:
        return False


def ensure_venv(venv: Path, release: str) -> None:
    """``venv``: the main environment with tabpfn ``release`` on top (kept when it has it)."""
    layered_venv(venv, "tabpfn", release)


def _tests(python: str) -> dict:
    """Step 1: the TabPFN tests' counts, exit status and failures."""
    done = run_in(SOURCE, [python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                           *TESTS, *IGNORED])
    return {"tests": pytest_summary(done.stdout), "tests_rc": done.returncode,
            "failures": pytest_failures(done.stdout)}


def _kept_tests(earlier: dict | None) -> dict | None:
    """Step 1 as ``earlier`` (the release's row of an earlier sweep) ran it, its counts marked
    with that sweep's commit (``tests_commit``); None when it has no passing test run."""
    if earlier is None or earlier.get("tests_rc") != 0:
        return None
    commit = earlier.get("tests_commit", earlier["from_commit"])
    return {"tests": f"{earlier['tests'].removesuffix(f' ({commit})')} ({commit})",
            "tests_rc": 0, "failures": [], "tests_commit": commit}


def run_release(venv: Path, release: str, earlier: dict | None = None) -> dict:
    """All five checks for one release; ``ok`` only when every one passes. A release the host's
    gate refuses (``refused``) skips the tests and the diabetes fit: it is ``ok`` when the gate,
    every model version it ships and the demo command refuse it with a message. ``earlier``
    (``--keep-tests``): the release's row of an earlier sweep, whose passing test run stands
    for step 1 (:func:`_kept_tests`)."""
    python = str(venv / "bin" / "python")
    start = time.monotonic()
    checked = run_in(SOURCE, [python, str(SOURCE / "scripts" / "tabpfn_compat.py"), "--check"])
    diabetes = check_result(checked)
    refused = "refused" in diabetes
    tests = (None if refused else _kept_tests(earlier) or _tests(python))
    # the export's command line (a layered environment has no entry points of its own)
    demo = run_in(SOURCE, [python, "-m", "oretrofit.cli.app", "patch", "--model-path", "demo",
                           "--arm", "full-o", "--tau", str(TAU), "--json"])
    traceback = "Traceback" in demo.stderr
    # the export's temporary path is this machine's; the table names the checkout instead
    refusal = (demo.stderr.strip().splitlines() or ["?"])[-1].replace(str(SOURCE), "<checkout>")
    demo_outcome = ("runs" if demo.returncode == 0 else "traceback" if traceback else
                    "refused: " + refusal[:120])
    rel = diabetes.get("rel", {})
    diabetes_ok = refused or (diabetes.get("finite", False) and rel.get("base") == 0.0
                              and all(v <= MAX_REL for v in rel.values()))
    versions_ok = bool(diabetes.get("versions")) and all(
        (cell in ("-", "refused")) if refused else _version_ok(cell)
        for cell in diabetes["versions"].values())
    tests_ok = (demo.returncode != 0) if refused else tests["tests_rc"] == 0
    demo_fit_ok = refused or _demo_fit_ok(diabetes.get("demo_fit", {}))
    ok = tests_ok and diabetes_ok and versions_ok and demo_fit_ok and not traceback
    return {"release": release, "ok": ok,
            **({"tests": "not run (refused)", "tests_rc": None, "failures": []} if refused
               else tests), "diabetes": diabetes,
            "demo": demo_outcome, "torch": diabetes.get("torch", "?"),
            "wall_s": round(time.monotonic() - start)}


def _outcome(row: dict) -> str:
    if not row["ok"]:
        return "FAIL"
    return "refused" if "refused" in row["diabetes"] else "pass"


def _version_cell(row: dict, label: str) -> str:
    if "from_commit" in row and label not in row["diabetes"].get("versions", {}):
        return f"not run ({row['from_commit']})"
    return row["diabetes"].get("versions", {}).get(label, "?")


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    def rel(row: dict, arm: str) -> str:
        value = row["diabetes"].get("rel", {}).get(arm)
        return "-" if value is None else f"{value:.2e}"

    lines = [
        "# TabPFN host: tabpfn release compatibility, per model version",
        "",
        "Written by `scripts/tabpfn_compat.py`; do not edit by hand. One layered virtual "
        "environment per release (the main environment, torch 2.13.0 CPU, with `tabpfn==X` "
        "installed on top), running an export of the commit below. A release passes when (1) "
        f"the TabPFN tests pass ({', '.join(f'`{t}`' for t in TESTS)}, without the "
        "documentation's `tests/hosts/tabpfn/test_docs.py` and the random hosts' calibration "
        "`tests/hosts/tabpfn/test_calibrate_versions.py`; they test every model version the "
        "release ships), (2) `make_regressor(\"random\", arm, "
        f"{TAU:g})` fits sklearn's diabetes table (300 train rows, 142 test rows) under every arm "
        f"with finite predictions, base exact and max|Δ|/max|base| ≤ {MAX_REL:g} for oa and full-o, "
        "(3) every model version the release ships (one column each) is retrofitted with its "
        f"τ→0 deviation ≤ {VERSION_REL:g} (the cell: the largest relative deviation of a random "
        "model's predictions from the unpatched model's, both tasks, oa and full-o, float64, "
        f"τ = ε = {VERSION_TAU:g}) or refused by name (`refused`); `-`: the release does not "
        "ship it, (4) `oretrofit patch --model-path demo` runs or refuses with a message, "
        "never a traceback, and (5) `make_regressor(\"demo\", arm, "
        f"{TAU:g})` (the shipped demo checkpoint) fits diabetes under full-o at tabpfn's "
        "defaults and under base and full-o at (2)'s settings with finite predictions, "
        f"full-o's max|Δ|/max|base| ≤ {MAX_REL:g} at (2)'s settings (the `demo fit` cell; "
        "before tabpfn 9.1.0 the vendor moves each of its default ensemble's bucket "
        "probabilities onto the target's borders as fp32 CDF differences, which cancel), or is "
        "refused by name (an inference-config field the release can neither take nor express "
        "another way). The "
        "host's version gate admits exactly the passing releases. A "
        "release the gate refuses (`refused`: tabpfn 2.x to 7.x, whose `PerFeatureTransformer` "
        "the host does not retrofit) is not put through (1) and (2): its row shows that the gate, "
        "every model version it ships (`refused`) and the demo command refuse it by name, "
        "with the `pip install` that fixes it, and never with a bare import error.",
        "",
        *provenance_lines(command, commit),
        *([f"- an outcome followed by `(COMMIT)` is an earlier sweep's row, on that commit: this "
           "sweep did not run that release; a cell that reads `not run (COMMIT)` is a check that "
           "sweep did not have"]
          if any(row.get("from_commit", commit) != commit for row in rows) else []),
        *(["- a TabPFN tests cell followed by `(COMMIT)` ran on that commit (an earlier sweep's "
           "test run, kept by `--keep-tests`); the row's other checks ran on this sweep's"]
          if any("tests_commit" in row for row in rows) else []),
        "",
        *markdown_table(
            ["tabpfn", "outcome", "TabPFN tests", "diabetes oa Δ", "diabetes full-o Δ",
             *LABELS, "demo", "demo fit full-o Δ", "torch", "wall s"],
            [[row["release"], _outcome(row) + (f" ({row['from_commit']})" if row.get(
                "from_commit", commit) != commit else ""), row["tests"], rel(row, "oa"),
              rel(row, "full-o"),
              *(_version_cell(row, label) for label in LABELS),
              row["demo"], _demo_fit_cell(row), row["torch"], row["wall_s"]] for row in rows]),
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
    parser.add_argument("--keep-tests", action="store_true",
                        help="run checks 2-5 only, keeping each release's earlier passing test "
                             "run (marked with its commit)")
    args = parser.parse_args()
    if args.check:
        print(json.dumps(check()))
        return
    global SOURCE
    SOURCE = export_head(ROOT, Path(tempfile.mkdtemp(prefix="tabpfn-compat-")))
    commit = head_commit(ROOT)
    rows = []
    # where the environments lived is this machine's business, not the receipt's
    command = receipt_command("scripts/tabpfn_compat.py", sys.argv[1:], {args.venvs: "VENVS"})
    json_path = args.out.with_suffix(".json")
    earlier = _earlier_rows(args.out, json_path)
    kept = {row["release"]: row for row in earlier} if args.keep_tests else {}
    for release in args.releases.split(","):
        venv = args.venvs / f"tabpfn-{release}"
        try:
            ensure_venv(venv, release)
            rows.append(run_release(venv, release, kept.get(release)))
        except RuntimeError as err:
            rows.append({"release": release, "ok": False, "tests": f"install failed: {err}"[:200],
                         "tests_rc": -1, "diabetes": {}, "demo": "-", "torch": "-", "wall_s": 0})
        print(f"{release}: {_outcome(rows[-1])} ({rows[-1]['tests']})",
              flush=True)
        # rewritten after every release: an interrupted sweep keeps the rows it has, and the
        # releases it has not reached keep their earlier rows, marked with their commit
        ran = {row["release"] for row in rows}
        shown = sorted([*rows, *(row for row in earlier if row["release"] not in ran)],
                       key=lambda row: Version(row["release"]))
        args.out.write_text(render(shown, command, commit))
        json_path.write_text(json.dumps(shown, indent=1) + "\n")
    print(f"wrote {args.out} and {json_path}")
    sys.exit(0 if all(row["ok"] for row in rows) else 1)


def _earlier_rows(table: Path, json_path: Path) -> list[dict]:
    """The rows of the receipt already there, each marked with the commit it ran on
    (``from_commit``), for the releases this sweep does not run (again)."""
    if not (table.exists() and json_path.exists()):
        return []
    found = re.search(r"oretrofit commit: `([0-9a-f]+)`", table.read_text())
    previous = found.group(1) if found else "?"
    return [{**row, "from_commit": row.get("from_commit", previous)}
            for row in json.loads(json_path.read_text())]


if __name__ == "__main__":
    main()
