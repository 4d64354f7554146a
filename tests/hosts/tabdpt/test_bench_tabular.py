"""benchmarks/bench_tabular.py --family tabdpt runs in tabdpt's environment (``make
test-tabdpt``), and its entry joins a receipt of the other families rather than replacing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KEPT = {"family": "tabicl", "version": "2.2.0", "rows": [], "load_before": [0.5, 0.5, 0.5],
        "load_after": [0.5, 0.5, 0.5], "cpus": 2}


def _bench(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "ORETROFIT_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_tabular.py"), "--quick",
                           "--rounds", "1", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


def test_the_tabdpt_family_joins_the_receipt(tmp_path: Path):
    out = tmp_path / "bench_tabular.json"
    other = {"schema_version": 1, "benchmark": "bench_tabular", "quick": True, "rounds": 1,
             "datasets": 6, "device": "cpu", "families": {"tabicl": KEPT}}
    out.write_text(json.dumps(other))
    done = _bench("--family", "tabdpt", "--out", str(out), cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr[-3000:]
    receipt = json.loads(out.read_text())
    assert receipt["families"]["tabicl"] == KEPT
    rows = receipt["families"]["tabdpt"]["rows"]
    assert [(r["task"], r["measure"]) for r in rows] == [
        ("regressor", "predict"), ("regressor", "batched"),
        ("classifier", "predict"), ("classifier", "batched")]
    assert all(r["max_rel_difference"] <= 1e-5 for r in rows if r["measure"] == "batched")
    assert receipt["families"]["tabdpt"]["version"] == "1.3.1"
