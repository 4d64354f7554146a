"""Static metrics of the Triton OAttention kernels compiled for an H100 (sm_90a), no GPU needed.

    python benchmarks/kernel_static.py [--quick] [--out results/kernel_static.json]

Each kernel of :mod:`oretrofit._kernels.triton_kernels` is compiled ahead of time for sm_90a at the GPU
check's shapes (``(B, H→Hkv, N, d)``: (8, 9, 2048, 64), (1, 16, 8192, 128), GQA (1, 32→8, 8192,
128)) and at d = 96 and 256, bf16, in the configuration the route picks (``configs_for``), and
causal at the first and the GQA shape. The launch arguments are the ones a call builds: a call
on ``meta`` tensors runs the real launcher with the launch recorded instead of run. Per kernel it prints the shared memory, registers and
spilled bytes (``ptxas -v`` from the triton wheel), CTAs per SM that these allow, the matmul
units of one tile (``tt.dot`` in the innermost loop) and the SASS instruction mix of the inner
loop over the tiles that need no key masks (``nvdisasm``; tiles of fewer than 64 rows take
``HMMA``), with the length of the masked loop (a block's ragged or causal-diagonal tiles) beside
it, against a reference loop: the plain flash-attention forward (:func:`_reference_forward`, no
bias, mask or gate) at the same tile.

These figures do not move with machine load: the receipt is a benchmark run on any CPU machine.
CTAs per SM follow the H100's limits: 228 KB shared memory per SM (227 KB per CTA, 1 KB reserved
per CTA), 64 K registers (allocated per warp in units of 256), 2048 threads, 32 CTAs.
``--quick``: the d = 64 forward and the reference only (the smoke test). Compiled results are
cached by Triton (``TRITON_CACHE_DIR``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

# This benchmark compiles the kernels (the interpreter the tests set would only run them).
os.environ.pop("TRITON_INTERPRET", None)

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")                 # what the JIT uses today
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from oretrofit._files.markdown import pipe_table  # noqa: E402
from oretrofit._files.provenance import environment, write_json_atomic  # noqa: E402
from oretrofit._kernels import triton as kernels  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# (B, H, Hkv, N, d): the GPU check's shapes, then d = 96 and 256.
SHAPES = {"A": (8, 9, 9, 2048, 64), "B": (1, 16, 16, 8192, 128), "C": (1, 32, 8, 8192, 128),
          "d96": (1, 8, 8, 4096, 96), "d256": (1, 8, 8, 4096, 256)}
# The causal kernels (key j visible to query i iff j ≤ i + N − N here) at these shapes too.
CAUSAL_SHAPES = ("A", "C")
SMEM_PER_SM, SMEM_PER_CTA, SMEM_RESERVED = 228 * 1024, 227 * 1024, 1024
REGS_PER_SM, THREADS_PER_SM, CTAS_PER_SM = 65536, 2048, 32
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint8: "u8"}
LOOP_CLASSES = ("HGMMA", "HMMA", "MUFU", "FMUL", "FFMA", "FADD", "FMNMX", "FSEL", "FSETP", "F2FP",
                "SHFL", "BAR", "LDGSTS", "LDS", "STS", "LDSM", "STSM", "IMAD", "IADD3", "LOP3",
                "ISETP")


@triton.jit
def _reference_forward(Q, K, V, OUT, sqh, sqn, N, qk_scale, BM: tl.constexpr, BN: tl.constexpr,
                       D: tl.constexpr):
    """Plain attention of one query block of one head (q, k, v, out ``(H, N, D)`` contiguous,
    N a multiple of BM and BN): the online softmax in base 2 (``qk_scale`` holds log2 e)."""
    head = tl.program_id(1).to(tl.int64) * sqh
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, D)
    q = tl.load(Q + head + rows[:, None] * sqn + cols[None, :])
    row_max = tl.full([BM], float("-inf"), tl.float32)
    row_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, N, BN):
        keys = start + tl.arange(0, BN)
        kt = tl.load(K + head + keys[None, :] * sqn + cols[:, None])
        scores = tl.dot(q, kt) * qk_scale
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        weights = tl.math.exp2(scores - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(weights, 1)
        v = tl.load(V + head + keys[:, None] * sqn + cols[None, :])
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        row_max = new_max
    tl.store(OUT + head + rows[:, None] * sqn + cols[None, :], (acc / row_sum[:, None]).to(
        OUT.dtype.element_ty))


def _source(kernel, args: tuple, flags: dict) -> ASTSource:
    """What the JIT would compile for a call with ``args`` and ``flags``: pointers and ints
    divisible by 16 marked so, ``None`` (an absent mask), ints equal to 1, the kernel's
    constexpr parameters and the flags as constexprs."""
    values = dict(zip(kernel.arg_names, args)) | flags
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        value = values[name]
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif (value is None or isinstance(value, bool) or name in flags
              or kernel.params[i].is_constexpr or value == 1 and isinstance(value, int)):
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)


def _recorded_launches(shape: tuple[int, ...], dtype: torch.dtype,
                       causal: bool = False) -> list[tuple]:
    """``(name, kernel, config, args, flags)`` of a forward and a backward (every input
    requiring grad) at ``shape``, from the project's launcher on ``meta`` tensors."""
    b, h, hkv, n, d = shape
    q = torch.empty(b, h, n, d, device="meta", dtype=dtype)
    k, v = (torch.empty(b, hkv, n, d, device="meta", dtype=dtype) for _ in range(2))
    p_q, p_k = torch.empty(b, n, device="meta"), torch.empty(b, n, device="meta")
    recorded = []

    def record(self, kernel, grid, args, kwargs):
        flags = dict(kwargs)
        config = kernels.KernelConfig(flags.pop("BM"), flags.pop("BN"), flags.pop("num_warps"),
                                      flags.pop("num_stages"))
        recorded.append((kernel, config, args, flags))

    with mock.patch.object(kernels._Launch, "launch", record):
        launch = kernels._Launch(q, k, v, p_q, p_k, None, None, 0.0, d ** -0.5, None, 0.0, 0,
                                 causal=causal)
        out, lse = launch.forward()
        launch.backward(out, lse, torch.empty_like(out), True, True)
    names = ("forward", "dq", "dkdv")
    return [(name, *rec) for name, rec in zip(names, recorded)]


def _compile(kernel, config, args, flags):
    settings = dict(BM=config.bm, BN=config.bn)
    return triton.compile(_source(kernel, args, {**flags, **settings}), target=TARGET,
                          options=dict(num_warps=config.warps, num_stages=config.stages))


def _ptxas(ptx: str) -> dict:
    """Registers and spilled bytes of ``ptx`` for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.ptx")
        path.write_text(ptx)
        log = subprocess.run([str(BIN / "ptxas-blackwell"), "-arch=sm_90a", "-v", str(path), "-o",
                              str(Path(tmp, "k.o"))], capture_output=True, text=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else 0}


def _sass_tile_loops(cubin: bytes) -> tuple[collections.Counter, collections.Counter | None]:
    """Instruction classes of ``(main, masked)``: of the innermost loops (a backward branch's body
    holding no other) with the most matrix instructions (HGMMA + HMMA), the shortest is the loop
    over the key tiles that need no masks, where every tile but a block's ragged last one and
    (causal) diagonal ones runs; the longest is the masked loop (None where there is one loop)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.cubin")
        path.write_bytes(cubin)
        text = subprocess.run([str(BIN / "nvdisasm"), "-c", str(path)], capture_output=True,
                              text=True).stdout
    labels, ops = {}, []
    for line in text.splitlines():
        if label := re.match(r"\s*(\.L_x_\d+):", line):
            labels[label.group(1)] = len(ops)
        elif instruction := re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line):
            ops.append(re.sub(r"^@!?U?P\w+\s+", "", instruction.group(1).strip()))
    loops = {(labels[m.group(1)], i) for i, op in enumerate(ops)
             if (m := re.search(r"\bBRA\b.*?(\.L_x_\d+)", op)) and m.group(1) in labels
             and labels[m.group(1)] <= i}
    inner = [(a, b) for a, b in loops
             if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    if not inner:
        return collections.Counter(), None
    mixes = [collections.Counter(op.split()[0].split(".")[0] for op in ops[a:b + 1])
             for a, b in inner]
    most = max(m["HGMMA"] + m["HMMA"] for m in mixes)
    hot = sorted((m for m in mixes if m["HGMMA"] + m["HMMA"] == most),
                 key=lambda m: sum(m.values()))
    return hot[0], hot[-1] if len(hot) > 1 else None


def _matmuls_per_tile(ttir: str) -> int:
    """``tt.dot`` in the body of the innermost ``scf.for`` that has the most (one tile's
    matrix products: a kernel with a masked and an unmasked copy of its loop counts one)."""
    stack, counts = [], []
    for line in ttir.splitlines():
        text = line.strip()
        if text.startswith("}") and stack:
            kind, dots = stack.pop()
            if kind == "for":
                counts.append(dots)
        if text.startswith("%") and " tt.dot " in text:
            fors = [entry for entry in stack if entry[0] == "for"]
            if fors:
                fors[-1][1] += 1
        if text.endswith("{"):
            stack.append(["for" if "scf.for" in text else "region", 0])
    return max(counts, default=0)


def ctas_per_sm(shared: int, registers: int, warps: int) -> int:
    """CTAs of one kernel an H100 SM holds at once (module docstring's limits)."""
    regs_per_warp = -(-registers * 32 // 256) * 256
    by_smem = SMEM_PER_SM // (shared + SMEM_RESERVED) if shared <= SMEM_PER_CTA else 0
    by_regs = REGS_PER_SM // regs_per_warp // warps
    return min(by_smem, by_regs, THREADS_PER_SM // (32 * warps), CTAS_PER_SM)


def measure(compiled, warps: int) -> dict:
    """The static metrics of one compiled kernel."""
    loop, masked = _sass_tile_loops(compiled.asm["cubin"])
    row = {"shared_bytes": compiled.metadata.shared, **_ptxas(compiled.asm["ptx"]),
           "matmuls": _matmuls_per_tile(compiled.asm["ttir"]),
           "loop_instructions": sum(loop.values()),
           "masked_loop_instructions": sum(masked.values()) if masked else None,
           "loop_mix": {c: loop[c] for c in LOOP_CLASSES if loop[c]}}
    row["ctas_per_sm"] = ctas_per_sm(row["shared_bytes"], row["registers"], warps)
    return row


def kernel_rows(shape_key: str, kernels_wanted: tuple[str, ...],
                causal: bool = False) -> list[dict]:
    rows = []
    for name, kernel, config, args, flags in _recorded_launches(SHAPES[shape_key],
                                                                torch.bfloat16, causal):
        if name not in kernels_wanted:
            continue
        row = {"shape": shape_key + " causal" * causal, "dims": SHAPES[shape_key],
               "kernel": name, "config": vars(config)}
        try:
            row |= measure(_compile(kernel, config, args, flags), config.warps)
        except Exception as error:  # noqa: BLE001 -- the receipt records any compile failure
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def reference_row(d: int, config: kernels.KernelConfig) -> dict:
    """The reference loop at head dim ``d`` with the forward's tile, warps and stages."""
    h, n = 16, 8192
    q = torch.empty(h, n, d, device="meta", dtype=torch.bfloat16)
    args = (q, q, q, q, n * d, d, n, d ** -0.5 * 1.4426950408889634)
    compiled = _compile(_reference_forward, config, args, {"D": d})
    row = {"shape": f"d{d}", "kernel": "reference forward", "config": vars(config),
           **measure(compiled, config.warps)}
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict], env: dict) -> str:
    table = []
    for r in rows:
        c = r["config"]
        mix = ", ".join(f"{k} {v}" for k, v in r.get("loop_mix", {}).items())
        table.append([r["shape"], r["kernel"], f"{c['bm']}×{c['bn']} w{c['warps']} s{c['stages']}",
                      *(r.get(key, "—") for key in ("shared_bytes", "registers", "spill_bytes",
                                                     "ctas_per_sm", "matmuls",
                                                     "loop_instructions")),
                      r.get("masked_loop_instructions") or "—",
                      r.get("error", mix)])
    header = ["shape", "kernel", "tile, warps, stages", "shared B", "registers", "spilled B",
              "CTAs/SM", "tt.dot", "loop instr.", "masked loop", "loop mix (or compile error)"]
    shapes = "; ".join(f"{k} = (B, H, Hkv, N, d) {v}" for k, v in SHAPES.items())
    return (f"# Triton OAttention kernels, static metrics on sm_90a\n\n"
            f"`{env['command']}` at {env['git_revision']}, triton "
            f"{env['packages'].get('triton')}, torch {env['packages'].get('torch')}, "
            f"{env['created_utc']}. Compiled ahead of time for sm_90a (no GPU), bf16, every input "
            f"requiring grad; {shapes}. tt.dot: matmul units per tile. Loop instructions: SASS per "
            f"warp per tile of the inner loop without key masks (masked loop: the one with). "
            f"Made by benchmarks/kernel_static.py (its docstring says how).\n\n"
            + pipe_table(header, table, ["left", "left", "left"] + ["right"] * 7 + ["left"])
            + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the d = 64 forward and reference")
    parser.add_argument("--out", default="results/kernel_static.json")
    args = parser.parse_args(argv)
    if args.quick:
        plan = [("A", ("forward",), False)]
    else:
        plan = [(key, ("forward", "dq", "dkdv"), False) for key in SHAPES]
        plan += [(key, ("forward", "dq", "dkdv"), True) for key in CAUSAL_SHAPES]
    rows = [row for key, wanted, causal in plan for row in kernel_rows(key, wanted, causal)]
    for d in (64,) if args.quick else (64, 128):
        rows.append(reference_row(d, kernels.configs_for(d).forward))
    env = environment()
    out = Path(args.out)
    write_json_atomic(out, {"environment": env, "rows": rows})
    out.with_suffix(".md").write_text(markdown(rows, env))
    print(markdown(rows, env))


if __name__ == "__main__":
    main()
