"""B.5: the machine-readable OStandardize sweep, as a receipt.

τ = 1e-6, ε_var = 1e-6, token axis 1; fp32 shapes (2,5,4), (1,7,8), (3,4,16) and bf16/fp16 on
(2,5,4). Each case checks, with :func:`oretrofit.o_moments` / :func:`oretrofit.o_standardize`:
old support, mean, variance and outputs preserved under one zero inserted at the first, an
interior and the last position; exact-zero inserted outputs; permutation equivariance; finite
gradients; all-null, zero-length and singleton active support (the singleton centres to an exact
zero state, after which a biased OFFN branch emits zero).
"""

from __future__ import annotations

import torch
from torch import nn

from .._components import OFFN, o_moments, o_standardize
from .._presence import presence
from .common import StudyOptions, markdown_table
from .receipts import PlannedRun

NAME = "ostandardize"
TASKS: tuple[str, ...] = ("sweep",)
TAU, EPS_VAR, DIM = 1e-6, 1e-6, 1
CASES = (("float32", (2, 5, 4)), ("float32", (1, 7, 8)), ("float32", (3, 4, 16)),
         ("bfloat16", (2, 5, 4)), ("float16", (2, 5, 4)))


def _linf(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _insertion(h: torch.Tensor, position: int) -> dict:
    """Insert one zero token at ``position`` on axis 1 and compare moments and outputs."""
    zero = h.new_zeros(h.shape[0], 1, h.shape[2])
    ext = torch.cat([h[:, :position], zero, h[:, position:]], dim=1)
    old = [i for i in range(ext.shape[1]) if i != position]
    s0, m0, v0 = o_moments(h, presence(h, TAU), DIM)
    s1, m1, v1 = o_moments(ext, presence(ext, TAU), DIM)
    out, out_ext = o_standardize(h, TAU, EPS_VAR, DIM), o_standardize(ext, TAU, EPS_VAR, DIM)
    return {"position": position, "support_linf": _linf(s0, s1), "mean_linf": _linf(m0, m1),
            "variance_linf": _linf(v0, v1), "old_output_linf": _linf(out, out_ext[:, old]),
            "inserted_output_linf": float(out_ext[:, position].abs().max())}


def _singleton(dtype: torch.dtype, width: int) -> dict:
    """One active token among zeros: centring gives an exact zero state; OFFN then emits 0."""
    h = torch.zeros(1, 3, width, dtype=dtype)
    h[0, 1] = torch.linspace(0.5, 1.5, width, dtype=dtype)
    z = o_standardize(h, TAU, EPS_VAR, DIM)
    ffn = OFFN(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)),
               TAU).to(dtype)
    with torch.no_grad():
        nn.init.constant_(ffn.ffn[0].bias, 0.3)
        nn.init.constant_(ffn.ffn[2].bias, 0.7)
        after = ffn(z)
    return {"singleton_output_linf": float(z.abs().max()),
            "singleton_offn_output_linf": float(after.abs().max())}


def _execute(dtype_name: str, shape: tuple[int, int, int], seed: int) -> dict:
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(shape, generator=gen).to(dtype)
    insertions = [_insertion(h, pos) for pos in (0, shape[1] // 2, shape[1])]
    perm = torch.randperm(shape[1], generator=gen)
    out = o_standardize(h, TAU, EPS_VAR, DIM)
    permuted = o_standardize(h[:, perm], TAU, EPS_VAR, DIM)
    leaf = h.detach().clone().requires_grad_(True)
    o_standardize(leaf, TAU, EPS_VAR, DIM).float().square().sum().backward()
    null = o_standardize(torch.zeros(shape, dtype=dtype), TAU, EPS_VAR, DIM)
    empty = o_standardize(torch.zeros(shape[0], 0, shape[2], dtype=dtype), TAU, EPS_VAR, DIM)
    return {"insertion": insertions,
            "max_old_output_linf": max(i["old_output_linf"] for i in insertions),
            "max_moment_linf": max(max(i["support_linf"], i["mean_linf"], i["variance_linf"])
                                   for i in insertions),
            "max_inserted_output_linf": max(i["inserted_output_linf"] for i in insertions),
            "permutation_linf": _linf(permuted, out[:, perm]),
            "gradients_finite": bool(torch.isfinite(leaf.grad).all()),
            "all_null_output_linf": float(null.abs().max()),
            "all_null_finite": bool(torch.isfinite(null).all()),
            "zero_length_shape": list(empty.shape),
            "output_finite": bool(torch.isfinite(out).all()),
            **_singleton(dtype, shape[2])}


def plan(options: StudyOptions) -> list[PlannedRun]:
    cases = CASES[:1] if options.quick else CASES
    return [PlannedRun(f"{dtype}/{'x'.join(map(str, shape))}/seed{seed}",
                       {"dtype": dtype, "shape": list(shape), "seed": seed, "tau": TAU,
                        "eps_var": EPS_VAR, "token_axis": DIM},
                       lambda d=dtype, s=shape, sd=seed: _execute(d, s, sd))
            for dtype, shape in cases for seed in options.seeds]


def report(runs: dict[str, dict], plan_ids: list[str]) -> str:
    """One row per dtype–shape case: worst values over seeds and insertion positions."""
    rows = []
    for dtype, shape in CASES:
        ids = [i for i in plan_ids if i in runs and i.startswith(f"{dtype}/{'x'.join(map(str, shape))}/")]
        if not ids:
            continue
        outs = [runs[i]["outcome"] for i in ids]

        def worst(key: str) -> str:
            return f"{max(o[key] for o in outs):.3g}"
        rows.append([dtype, str(tuple(shape)), worst("max_moment_linf"),
                     worst("max_old_output_linf"), worst("max_inserted_output_linf"),
                     worst("permutation_linf"), str(all(o["gradients_finite"] for o in outs)),
                     worst("all_null_output_linf"), worst("singleton_output_linf"),
                     worst("singleton_offn_output_linf"), str(len(ids))])
    header = ["dtype", "shape", "Moment L∞ (insert)", "Old output L∞ (insert)", "Inserted output",
              "Permutation L∞", "Grads finite", "All-null output", "Singleton output",
              "Singleton → OFFN", "Seeds"]
    return ("B.5 OStandardize sweep (τ = 1e-6, ε_var = 1e-6, token axis 1): worst case over "
            "seeds and insertion positions (first, interior, last). The paper reports this sweep "
            "as a receipt without a table.\n\n" + markdown_table(header, rows))
