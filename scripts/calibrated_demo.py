#!/usr/bin/env python3
"""Calibrated τ on the demo host (issue 32): calibrate, run the τ grid with the calibrated specs,
run the site-family ablation, and write the generated reading with its receipt.

Writes under ``results/demo-host/calibrated/``:

    spec-oa.json, spec-full-o.json   `oretrofit calibrate` (δ = 1e-3, q = 0.01, train rows)
    run/                             `oretrofit regress`: base, OA, Full-O over the τ grid
                                     (1e-10 … 10, 1 and 3 per decade) + both specs (--tau-spec)
    ablation/                        `oretrofit regress --ablate-sites` at stress τ = 1, one
                                     invocation per O arm (a family must hold sites of its arm)
    README.md                        the reading (oretrofit.regress.calibrated_reading)
    receipt.json                     commands, their durations, environment, spec SHA-256s

Every step is a CLI command (the ones docs/calibration.md shows), run as a subprocess of this
interpreter; the run folders resume, so a re-run only fills what is missing. A script rather
than a verb: it strings verbs together for one committed study and has no options of its own.

Usage: ``python scripts/calibrated_demo.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oretrofit._files.provenance import environment, git_revision, sha256_file, write_json_atomic  # noqa: E402
from oretrofit.regress.calibrated_reading import calibrated_reading  # noqa: E402
from oretrofit.regress.store import read_cells, read_variants  # noqa: E402
from oretrofit.regress.summary import summarize  # noqa: E402

OUT = Path("results/demo-host/calibrated")
DATASETS = ("560", "44959", "sklearn:diabetes", "sklearn:friedman1")
SEEDS = (11, 23, 37)
TAUS = ",".join(f"{m}e{e}" for e in range(-10, 1) for m in (1, 3)) + ",1e1"
FAMILIES = {"oa": "fde.*,col.*,icl.*", "full-o": "fde.*,col.*,icl.*,te.*,norm,ffn,attention,inject"}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def commands() -> list[list[str]]:
    """The study's commands, in order (as typed after ``oretrofit``)."""
    common = ["--model-path", "demo", "--offline-standins"]
    regress = ["regress", *common, "--datasets", ",".join(DATASETS),
               "--seeds", ",".join(map(str, SEEDS))]
    steps = [["calibrate", *common, *(a for d in DATASETS for a in ("--dataset", d)),
              *(a for s in SEEDS for a in ("--seed", str(s))), "--arm", arm, "--delta", "1e-3",
              "--quantile", "0.01", "--out", str(OUT / f"spec-{arm}.json")]
             for arm in ("oa", "full-o")]
    steps.append([*regress, "--arms", "base,oa,full-o", "--tau", TAUS,
                  "--tau-spec", str(OUT / "spec-oa.json"), "--tau-spec",
                  str(OUT / "spec-full-o.json"), "--out", str(OUT / "run")])
    steps += [[*regress, "--arms", f"base,{arm}", "--tau", "1e-8,1", "--ablate-sites", families,
               "--stress-tau", "1", "--out", str(OUT / "ablation")]
              for arm, families in FAMILIES.items()]
    return steps


def main() -> None:
    os.chdir(ROOT)
    ran = []
    for command in commands():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-W", "ignore", "-m", "oretrofit.cli.app", *command],
                       env=ENV, check=True, stdout=subprocess.DEVNULL)
        ran.append({"command": "oretrofit " + " ".join(command),
                    "seconds": round(time.perf_counter() - start, 1)})
        print(f"{ran[-1]['seconds']:7.1f}s  {ran[-1]['command'][:110]}", file=sys.stderr)
    specs = {arm: json.loads((OUT / f"spec-{arm}.json").read_text()) for arm in ("oa", "full-o")}
    summaries = []
    for folder in (OUT / "run", OUT / "ablation"):
        _, datasets, cells = read_cells([folder])
        summaries.append(summarize(cells, datasets, read_variants([folder])))
    settings = read_cells([OUT / "run"])[0]
    env = environment()
    provenance = [
        f"* Written by `scripts/calibrated_demo.py` at commit {git_revision()} "
        f"(oretrofit {env['packages'].get('oretrofit')}, tabpfn {env['packages'].get('tabpfn')}, "
        f"torch {env['packages'].get('torch')}); checkpoint SHA-256 "
        f"`{settings['checkpoint_sha256'][:16]}…` ({settings['weights']}).",
        *(f"* Spec `spec-{arm}.json` SHA-256 `{sha256_file(OUT / f'spec-{arm}.json')[:16]}…`."
          for arm in specs),
        "* Tables, plots and every cell: `run/tables/` (τ grid and calibrated specs) and "
        "`ablation/tables/`; commands and timings: `receipt.json`."]
    (OUT / "README.md").write_text(calibrated_reading(specs, *summaries, provenance))
    write_json_atomic(OUT / "receipt.json", {
        "kind": "oretrofit.calibrated-demo", "commands": ran, "environment": env,
        "git_revision": git_revision(),
        "specs": {arm: sha256_file(OUT / f"spec-{arm}.json") for arm in specs}})


if __name__ == "__main__":
    main()
