#!/usr/bin/env bash
# The GPU check of issue 55 (half precision) and of the tabular hosts, in one run of at most 10 minutes.
#   bash scripts/gpu_check.sh [--device cuda|cpu] [--out DIR]
# --device cuda (default): the full check, receipts under results/cuda/. --device cpu: the same
# steps at tiny settings (a smoke run of every step; the tests run it), receipts under --out.
# PYTHON=... picks the interpreter (torch, transformers, for steps 5-7 tabpfn, for step 8 any of
# tabpfn, tabicl, tabdpt: it runs the families installed and fails when none is); WHEELS=DIR
# installs carried wheels (pip --no-index) into /tmp/site first, for a machine without a registry.
# Each step has its own time limit (they add up to 580 s on CUDA; stretched 6x with --device cpu,
# where other jobs share the cores); a step that fails or runs out is recorded
# and the next one runs. OUT/gpu_check.json lists each step's command, exit status and seconds with
# the provenance (versions, device, git revision), and the OAttention routes of step 3.
#   1. operator sweep (fp32, bf16, fp16)     -> OUT/operators.{json,md} (--device cpu: operators-quick)
#   2. fp32 OAttention route and exactness, vs SDPA           -> OUT/attention.{json,md}
#   3. OAttention vs SDPA at (8,9,2048,64), (1,16,8192,128), GQA (1,32->8,8192,128); bf16/fp16/fp32;
#      after attention_warm, a step that compiles the kernels into Triton's cache untimed;
#      fwd, fwd+bwd, memory, error vs fp64 beside SDPA's; the route each row took (Triton, cuDNN,
#      FlexAttention, memory-efficient, or fp32 compute) and why a route's check failed
#                                                             -> OUT/attention_shapes.{json,md}
#   4. SmolLM2-shaped Llama (random weights, bf16): prefill 8x2048 and 1x8192, 64 decoded tokens
#      with a KV cache, per arm (base / oa / full-o)          -> OUT/llama.{json,md}
#   5. one Table 2 cell (sklearn:diabetes, seed 11, tau 1e-8, base / oa / full-o), default host
#                                                             -> OUT/table2-cell/, OUT/table2-cell.json
#   6. ragged batched prediction, 64 datasets                 -> OUT/bench_batched.json
#   7. TabPFN full-o / base predict time and memory           -> OUT/bench_retrofit.json
#   8. each tabular family's full-o / base predict and batched / loop, vendor defaults
#                                                             -> OUT/bench_tabular.{json,md}
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
OUT=
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "error: unknown argument $1; use --device cuda|cpu and --out DIR" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "error: --device $DEVICE; use cuda or cpu" >&2; exit 2 ;; esac
OUT=${OUT:-results/$DEVICE}
PYTHON=${PYTHON:-python3}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export ORETROFIT_CACHE_DIR=${ORETROFIT_CACHE_DIR:-$PWD/.cache-gpu-check}
# Step 3's kernels compile once, in attention_warm, into this cache; the timed step reuses them.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$ORETROFIT_CACHE_DIR/triton}
if [ -n "${WHEELS:-}" ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
if [ "$DEVICE" = cuda ]; then
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
    "error: torch has no CUDA device here; run on a GPU machine, or use --device cpu")' || exit 1
  SIZE=default; QUICK=; ROUNDS=10; DATASETS=64; SWEEP_QUICK=; ATT_SIZES=1024,4096,8192; SLACK=1
else  # tiny settings; the limits stretched for a shared CPU (the 9 minutes are the GPU's budget)
  SIZE=small; QUICK=--quick; ROUNDS=1; DATASETS=2; SWEEP_QUICK=--quick; ATT_SIZES=48; SLACK=6
fi
mkdir -p "$OUT"
STEPS="$OUT/gpu_check.steps.tsv"
: > "$STEPS"
started=$(date +%s)
ORETROFIT=("$PYTHON" -c 'import sys; from oretrofit.cli.app import main; sys.argv[0] = "oretrofit"; main()')

step() {  # step NAME LIMIT_S CMD...: run with a time limit, record status and seconds, go on
  local name=$1 limit=$(( $2 * SLACK )); shift 2
  local began; began=$(date +%s)
  echo "== $name (at $(( began - started )) s, limit $limit s)"
  timeout "$limit" "$@"
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - began ))" "$*" >> "$STEPS"
}

step operators 80 "${ORETROFIT[@]}" sweep operators --device "$DEVICE" $SWEEP_QUICK --out "$OUT"
step attention 40 "$PYTHON" scripts/gpu_attention.py --device "$DEVICE" --sizes "$ATT_SIZES" \
  --rounds "$ROUNDS" --out "$OUT"
step attention_warm 60 "$PYTHON" scripts/gpu_attention_shapes.py --device "$DEVICE" --warm
step attention_shapes 90 "$PYTHON" scripts/gpu_attention_shapes.py --device "$DEVICE" \
  --rounds "$ROUNDS" --out "$OUT"
step llama 80 "$PYTHON" scripts/gpu_llama.py --device "$DEVICE" --rounds "$(( ROUNDS < 5 ? ROUNDS : 5 ))" \
  --out "$OUT"
host=$("$PYTHON" -c 'import sys
from oretrofit.tabpfn import write_random_checkpoint as w
from oretrofit.hosts.tabpfn.checkpoints import cache_dir
print(w(cache_dir() / f"tabpfn-v3-random-{sys.argv[1]}-seed0-gpu-check.ckpt", sys.argv[1], 0))' "$SIZE")
step table2_cell 60 sh -c "\"\$@\" > '$OUT/table2-cell.json'" table2 "${ORETROFIT[@]}" regress \
  --datasets sklearn:diabetes --seeds 11 --arms base,oa,full-o --tau 1e-8 --model-path "$host" \
  --device "$DEVICE" --out "$OUT/table2-cell" --no-plots --json
step batched 60 "$PYTHON" benchmarks/bench_batched.py --device "$DEVICE" --size "$SIZE" \
  --rounds "$(( ROUNDS < 3 ? ROUNDS : 3 ))" --datasets "$DATASETS" --out "$OUT/bench_batched.json"
step retrofit 60 "$PYTHON" benchmarks/bench_retrofit.py --device "$DEVICE" $QUICK \
  --out "$OUT/bench_retrofit.json"
step tabular 50 "$PYTHON" benchmarks/bench_tabular.py --device "$DEVICE" $QUICK \
  --rounds "$(( ROUNDS < 3 ? ROUNDS : 3 ))" --out "$OUT/bench_tabular.json"

"$PYTHON" - "$STEPS" "$OUT/gpu_check.json" "$DEVICE" <<'EOF'
import json
import sys
from pathlib import Path
from oretrofit._files.provenance import environment, write_json_atomic
steps = [dict(zip(("step", "exit", "seconds", "command"), line.split("\t")))
         for line in Path(sys.argv[1]).read_text().splitlines()]
for s in steps:
    s["exit"], s["seconds"] = int(s["exit"]), int(s["seconds"])
shapes = Path(sys.argv[2]).parent / "attention_shapes.json"
found = json.loads(shapes.read_text()) if shapes.exists() else {"rows": [], "route_failures": []}
routes = {f"{r['dtype']} d={r['d']}": r["route"] for r in found["rows"]}
write_json_atomic(Path(sys.argv[2]), {"schema_version": 2, "device": sys.argv[3], "steps": steps,
                                      "attention_routes": routes,
                                      "route_failures": found["route_failures"],
                                      "environment": environment(sys.argv[3])})
print("\n".join(f"{s['step']}: exit {s['exit']}, {s['seconds']} s" for s in steps))
print("\n".join([f"OAttention route, {k}: {v}" for k, v in routes.items()]
                + found["route_failures"]))
sys.exit(1 if any(s["exit"] for s in steps) else 0)
EOF
