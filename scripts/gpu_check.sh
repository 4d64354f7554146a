#!/usr/bin/env bash
# The GPU check of the TabPFN v3 host and the operators, for a session with a CUDA device.
# Each step has a time limit (200 + 90 + 150 + 150 s: under 10 minutes in all); it writes its receipts under results/cuda/:
#   1. the operator sweep on CUDA (fp32, bf16 and fp16: the sweep's own dtype axis)
#        -> results/cuda/operators.{json,md}
#   2. fused OAttention vs SDPA on CUDA, and the SDPA kernel each selects (torch.profiler)
#        -> results/cuda/attention.{json,md}
#   3. one Table 2 cell (sklearn:diabetes, seed 11, τ = 1e-8, arms base / oa / full-o) on the
#      default-size (58.3M-parameter) random-init host with --device cuda
#        -> results/cuda/table2-cell/
#   4. ragged batched prediction: 64 datasets, one predict_batched call vs the per-dataset loop
#        -> results/cuda/bench_batched.json
# Usage: bash scripts/gpu_check.sh   (PYTHON=... picks the interpreter: a CUDA build of torch
# with oretrofit[regress,datasets] installed; the machine needs no network).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=results/cuda
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export ORETROFIT_CACHE_DIR=${ORETROFIT_CACHE_DIR:-$PWD/.cache-gpu-check}

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
  "error: torch has no CUDA device here; install a CUDA build of torch==2.13.0 and oretrofit")'
mkdir -p "$OUT"
started=$(date +%s)
ORETROFIT=("$PYTHON" -c 'import sys; from oretrofit.cli.app import main; sys.argv[0] = "oretrofit"; main()')
step() { echo "== $1 ($(( $(date +%s) - started )) s)"; }

step "operator sweep on cuda"
timeout 200 "${ORETROFIT[@]}" sweep operators --device cuda --out "$OUT"

step "attention on cuda"
timeout 90 "$PYTHON" scripts/gpu_attention.py --out "$OUT"

step "Table 2 cell on the default-size random host"
host=$("$PYTHON" -c 'from oretrofit.tabpfn import write_random_checkpoint as w
from oretrofit.hosts.tabpfn.checkpoints import cache_dir
print(w(cache_dir() / "tabpfn-v3-random-default-seed0-gpu-check.ckpt", "default", 0))')
timeout 150 "${ORETROFIT[@]}" regress --datasets sklearn:diabetes --seeds 11 \
  --arms base,oa,full-o --tau 1e-8 --model-path "$host" --device cuda \
  --out "$OUT/table2-cell" --no-plots --json > "$OUT/table2-cell.json"

step "ragged batched prediction on cuda"
timeout 150 "$PYTHON" benchmarks/bench_batched.py --device cuda --rounds 3 \
  --out "$OUT/bench_batched.json"

step "done"
