"""B.5: the machine-readable OStandardize sweep, as a study receipt.

τ = 1e-6, ε_var = 1e-6, token axis 1; fp32 shapes (2,5,4), (1,7,8), (3,4,16) and bf16/fp16 on
(2,5,4). The measurements of one case are the operator sweep's
(:func:`oretrofit.sweep.standardize_checks.standardize_case`): old support, mean, variance and
outputs under one zero inserted at the first, an interior and the last position; exact-zero
inserted outputs; permutation equivariance; finite gradients; all-null, zero-length and
singleton support (the singleton centres to an exact zero state, after which a biased OFFN
branch emits zero). This module only plans the cases per seed and lays out the table.
"""

from __future__ import annotations

from ..sweep.standardize_checks import B5_CASES, standardize_case
from .._files.markdown import pipe_table
from .common import StudyOptions
from .receipts import PlannedRun

NAME = "ostandardize"
TASKS: tuple[str, ...] = ("sweep",)
TAU, EPS_VAR, DIM = 1e-6, 1e-6, 1
CASES = tuple((str(dtype).removeprefix("torch."), shape) for shape, dtype in B5_CASES)


def _execute(dtype_name: str, shape: tuple[int, int, int], seed: int) -> dict:
    dtype = dict((str(d).removeprefix("torch."), d) for _, d in B5_CASES)[dtype_name]
    return standardize_case(tuple(shape), dtype, seed, TAU, EPS_VAR, "cpu")


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
        rows.append([dtype, str(tuple(shape)), worst("old_moments"),
                     worst("old_output"), worst("inserted_output"),
                     worst("permutation"), str(all(o["gradients_finite"] for o in outs)),
                     worst("all_null"), worst("singleton_centred"),
                     worst("singleton_next_offn"), str(len(ids))])
    header = ["dtype", "shape", "Moment L∞ (insert)", "Old output L∞ (insert)", "Inserted output",
              "Permutation L∞", "Grads finite", "All-null output", "Singleton output",
              "Singleton → OFFN", "Seeds"]
    return ("B.5 OStandardize sweep (τ = 1e-6, ε_var = 1e-6, token axis 1): worst case over "
            "seeds and insertion positions (first, interior, last). The paper reports this sweep "
            "as a receipt without a table.\n\n" + pipe_table(header, rows))
