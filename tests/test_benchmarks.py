"""Benchmark scripts refuse bad arguments with the fix, before any timing starts."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("args", "message"), [
    (["--candidates", "32x4,bad"], "give EMBEDxTASKS pairs"),
    (["--candidates", "32x0"], "give EMBEDxTASKS pairs"),
    (["--max-rows", "10"], "3 <= min_rows <= max_rows"),
])
def test_bench_pretrain_sizes_refuses_bad_arguments(tmp_path, args, message):
    out = tmp_path / "receipt.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_pretrain_sizes.py"), *args, "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and message in done.stderr
    assert not out.exists()
