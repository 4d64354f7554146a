"""Benchmark scripts refuse bad arguments with the fix, before any timing starts, and every one runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("script", "args", "message"), [
    ("bench_pretrain_sizes.py", ["--candidates", "32x4,bad"], "give EMBEDxTASKS pairs"),
    ("bench_pretrain_sizes.py", ["--candidates", "32x0"], "give EMBEDxTASKS pairs"),
    ("bench_pretrain_sizes.py", ["--max-rows", "10"], "3 <= min_rows <= max_rows"),
    ("bench_tabular.py", ["--family", "tabpfn,catboost"],
     "--family takes some of tabpfn, tabicl, tabdpt"),
    ("bench_tabular.py", ["--rounds", "0"], "--rounds and --datasets at least 1"),
])
def test_benchmarks_refuse_bad_arguments(tmp_path, monkeypatch, capsys, script_module, script,
                                         args, message):
    """Checked in this process (the smoke run below starts the script as a command)."""
    out = tmp_path / "receipt.json"
    monkeypatch.setattr(sys, "argv", [script, *args, "--out", str(out)])
    with pytest.raises(SystemExit) as exit_:
        script_module(f"benchmarks/{script}").main()
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_bench_tabular_names_the_environment_of_a_family_not_installed(
        tmp_path, monkeypatch, capsys, script_module):
    module = script_module("benchmarks/bench_tabular.py")
    monkeypatch.setattr(module, "package_version", lambda name: None if name == "tabdpt" else "1")
    monkeypatch.setattr(sys, "argv", ["bench_tabular.py", "--family", "tabdpt",
                                      "--out", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit):
        module.main()
    assert "--family tabdpt needs the tabdpt package" in capsys.readouterr().err


# Every script in benchmarks/ and scripts/gpu_* runs here at its smallest settings on the CPU, so
# a script the README cites cannot break unnoticed. scripts/gpu_check.sh --device cpu runs the
# GPU check's steps at tiny settings: the operator sweep, scripts/gpu_attention.py,
# scripts/gpu_attention_shapes.py, scripts/gpu_llama.py, a Table 2 cell, bench_batched.py and
# bench_retrofit.py (and its memory probe) and bench_tabular.py (the families installed here).
SMOKE = {
    "benchmarks/bench_attention.py": ["--quick", "--no-memory", "--max-reference-n", "256",
                                      "--out", "{tmp}/bench_attention.json"],
    "benchmarks/bench_hosts.py": ["--tiny", "--backend", "eager", "--repeats", "1",
                                  "--out", "{tmp}"],
    "benchmarks/bench_cycles.py": ["--cycles", "2", "--pickle", "--out", "{tmp}/cycles.json"],
    "benchmarks/bench_calibrate.py": ["--lines", "20", "--baseline-lines", "2", "--big-mb",
                                      "0.05", "--out", "{tmp}/bench_calibrate.json"],
    "benchmarks/bench_pretrain_sizes.py": ["--steps", "1", "--warmup", "0", "--candidates", "32x1",
                                           "--max-rows", "32", "--out", "{tmp}/sizes.json"],
    "benchmarks/bench_pretrain_threads.py": ["--quick", "--steps", "1", "--warmup", "0",
                                             "--out", "{tmp}/threads.json"],
    "scripts/gpu_check.sh": ["--device", "cpu", "--out", "{tmp}"],
    "benchmarks/kernel_static.py": ["--quick", "--out", "{tmp}/kernel_static.json"],
    "benchmarks/bench_triton_host.py": ["--quick", "--out", "{tmp}/bench_triton_host.json"],
}
RUN_BY_GPU_CHECK = {"benchmarks/bench_batched.py", "benchmarks/bench_retrofit.py",
                    "benchmarks/bench_tabular.py",
                    "scripts/gpu_attention.py", "scripts/gpu_attention_shapes.py",
                    "scripts/gpu_llama.py"}
GPU_CHECK_RECEIPTS = ["operators-quick.json", "attention.json", "attention_shapes.json", "llama.json",
                      "table2-cell.json", "bench_batched.json", "bench_retrofit.json",
                      "bench_tabular.json", "bench_tabular.md"]


def test_every_benchmark_and_gpu_script_has_a_smoke_run() -> None:
    scripts = {str(p.relative_to(ROOT)) for p in [*ROOT.glob("benchmarks/*.py"),
                                                  *ROOT.glob("scripts/gpu_*")]}
    assert scripts == set(SMOKE) | RUN_BY_GPU_CHECK


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    args = [a.format(tmp=tmp_path) for a in SMOKE[script]]
    command = (["bash", str(ROOT / script)] if script.endswith(".sh")
               else [sys.executable, str(ROOT / script)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable,
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "ORETROFIT_CACHE_DIR": str(tmp_path / "cache")}       # random hosts written here
    return subprocess.run(command + args, capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=900)


def _bench_hosts_rows(tmp_path: Path) -> None:
    """Every row kind ran: long, short (with op counts) and compiled; each compiled arm compiled
    the unpatched model's graphs, without a graph break or the recompile limit, and generated its
    tokens."""
    rows = {kind: json.loads((tmp_path / f"bench_hosts{kind}.json").read_text())["rows"]
            for kind in ("", "_short", "_compile")}
    assert [len(r) for r in rows.values()] == [4, 6, 4]
    # the hooks add ops to every short call; the counts do not depend on the load
    assert all(r["patched_ops"] > r["unpatched_ops"] > 0 for r in rows["_short"])
    for row in rows["_compile"]:
        assert row["patched_dynamo"] == row["unpatched_dynamo"], row
        assert row["patched_dynamo"]["graph_breaks"] == 0 and row["patched_dynamo"]["graphs"] > 1
        assert not (row["patched_limit_hit"] or row["unpatched_limit_hit"]) and row["same_tokens"]


def _bench_calibrate_rows(tmp_path: Path) -> None:
    """Each text was calibrated (the one-line file to one row of 128 tokens) and the one pass
    gave the τ of each site alone."""
    receipt = json.loads((tmp_path / "bench_calibrate.json").read_text())
    assert [row["rows"] for row in receipt["cli"].values()][::2] == [20, 1]
    assert list(receipt["cli"].values())[2]["tokens"] == 128
    assert receipt["one_pass_vs_per_site"]["same_tau"] is True


ROW_CHECKS = {"benchmarks/bench_hosts.py": _bench_hosts_rows,
              "benchmarks/bench_calibrate.py": _bench_calibrate_rows}


@pytest.mark.parametrize("script", [s for s in SMOKE if s != "scripts/gpu_check.sh"])
def test_benchmark_smoke_run(script: str, tmp_path: Path) -> None:
    done = _run(script, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(tmp_path.rglob("*.json")), "no receipt written"
    ROW_CHECKS.get(script, lambda _: None)(tmp_path)


def test_the_gpu_check_runs_every_step_on_the_cpu(tmp_path: Path) -> None:
    done = _run("scripts/gpu_check.sh", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [
        "operators", "attention", "attention_warm", "attention_shapes", "llama", "table2_cell",
        "batched", "retrofit", "tabular"]
    assert all(s["exit"] == 0 for s in summary["steps"]) and summary["environment"]
    for name in GPU_CHECK_RECEIPTS:
        assert (tmp_path / name).exists(), name
    attention = json.loads((tmp_path / "attention.json").read_text())  # gpu_attention.py's logic
    assert attention["route"]["kernel"] == "cpu-flash" and len(attention["rows"]) == 9
    assert len(attention["checks"]) == 24 and max(c["error"] for c in attention["checks"]) <= 2e-6
    assert "bound 2e-06: met" in (tmp_path / "attention.md").read_text()
    shapes = json.loads((tmp_path / "attention_shapes.json").read_text())
    assert {(r["dtype"], r["mode"]) for r in shapes["rows"]} == {
        (d, m) for d in ("bf16", "fp16", "fp32") for m in ("fwd", "fwd+bwd")}
    assert all({"B", "H", "Hkv", "N", "d", "route"} <= set(r) for r in shapes["rows"])
    assert summary["attention_routes"] == {"bf16 d=16": "cpu-flash (fp32 compute)",
                                           "bf16 d=32": "cpu-flash (fp32 compute)",
                                           "fp16 d=16": "cpu-flash (fp32 compute)",
                                           "fp16 d=32": "cpu-flash (fp32 compute)",
                                           "fp32 d=16": "cpu-flash", "fp32 d=32": "cpu-flash"}
    llama = json.loads((tmp_path / "llama.json").read_text())
    assert {r["arm"] for r in llama["rows"]} == {"base", "oa", "full-o"}
    assert all(r["pass"] != "error" for r in llama["rows"])
    retrofit = json.loads((tmp_path / "bench_retrofit.json").read_text())
    assert [r["arm"] for r in retrofit["rows"]] == ["base", "oa", "full-o"]
    assert all(r["peak_bytes"] > 0 for r in retrofit["rows"])
    tabular = json.loads((tmp_path / "bench_tabular.json").read_text())
    assert sorted(tabular["families"]) == ["tabicl", "tabpfn"]     # the installed families
    for entry in tabular["families"].values():
        assert [(r["task"], r["measure"]) for r in entry["rows"]] == [
            (task, measure) for task in ("regressor", "classifier")
            for measure in ("predict", "batched")]
        # recorded; the batched answers' equivalence is the hosts' tests' (TabPFN's grouping
        # follows a cost model timed under the machine's load, so its fp32 rounding varies)
        assert all(0 <= r["max_rel_difference"] < float("inf") for r in entry["rows"]
                   if r["measure"] == "batched")
    assert tabular["markdown"] + "\n" == (tmp_path / "bench_tabular.md").read_text()
