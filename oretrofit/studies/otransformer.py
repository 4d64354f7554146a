"""Table 3 / Table 5: the scoped OTransformer study (B.6).

Two blocks, d = 32, 4 heads, FFN 128, τ = ε = 1e-6. k ∈ {0, 1, 4} exact zero tokens are inserted
after tokenisation, before the position encoding, during training and evaluation. Arms: Standard,
OA-only, OTransformer (one shared initial state) and the separately initialised structural
control. Diagnostics (k > 0) compare the trained model on the test sequence with and without its
k zero tokens: per-layer inserted-state norm, old-token and CLS shift, prediction shift, norm and
presence quantiles, exact/near-zero fractions and finiteness. 5 tasks × 3 seeds × 3 k × 4 arms.
"""

from __future__ import annotations

import torch

from .._files.markdown import pipe_table
from .._operators.presence import presence
from .common import StudyOptions, fmt, matrix_plan, mean, quantiles, train_host
from .data import FIVE_TASKS, PAPER_ORDER, TASKS as REGISTRY, load_split
from .models import ARM_SPECS, FTHost
from .receipts import PlannedRun
from .training import metrics, predict, primary_metric

NAME = "otransformer"
TASKS = FIVE_TASKS
ARMS = ("standard", "oa_only", "otransformer", "structural_control")
ZERO_TOKENS = (0, 1, 4)
NEAR_ZERO = 1e-6
# Table 3 (paper, GPU): arm -> (host components, max inserted-state L∞, interpretation).
PAPER = {
    "standard": ("Softmax, additive encoding, affine norm, biased FFN", "7.982", "Ordinary host"),
    "oa_only": ("Hidden-carrier OA; other components ordinary", "7.983",
                "Attention alone is insufficient"),
    "otransformer": ("Hidden-carrier OA, OInject, ONorm, OFFN", "0", "Declared O-closed path"),
    "structural_control": ("Hidden-carrier OA, no additive encoding, affine-free norm, "
                           "bias-free FFN", "0", "Separately initialized comparator"),
}
TITLES = {"standard": "Standard", "oa_only": "OA-only", "otransformer": "OTransformer",
          "structural_control": "Structural control"}


@torch.no_grad()
def null_diagnostics(model: FTHost, x: torch.Tensor, n_zero: int) -> dict:
    """Trained model on ``x`` with ``n_zero`` zero tokens vs without (k > 0 only)."""
    tau = model.spec.tau
    base, extended = model.states(x), model.states(x, n_zero)               # [(B, N[+k], d)]
    n_old = base[0].shape[1]
    cls = n_old - 1
    layers = []
    for layer, (b, e) in enumerate(zip(base, extended)):
        inserted = e[:, n_old:]                                               # (B, k, d)
        layers.append({"layer": layer, "inserted_state_linf": float(inserted.abs().max()),
                       "inserted_state_max_norm": float(inserted.norm(dim=-1).max()),
                       "old_token_shift_linf": float((e[:, :cls] - b[:, :cls]).abs().max()),
                       "cls_shift_linf": float((e[:, cls] - b[:, cls]).abs().max())})
    final = extended[-1]
    inserted, old = final[:, n_old:], final[:, :n_old]
    shift = model.readout(extended[-1]) - model.readout(base[-1])
    return {
        "layers": layers,
        "max_inserted_state_linf": max(layer["inserted_state_linf"] for layer in layers),
        "prediction_rms_shift": float(shift.double().square().mean().sqrt()),
        "prediction_max_abs_shift": float(shift.abs().max()),
        "inserted_norm_quantiles": quantiles(inserted.norm(dim=-1)),
        "inserted_presence_quantiles": quantiles(presence(inserted, tau)),
        "old_presence_quantiles": quantiles(presence(old, tau)),
        "inserted_exact_zero_fraction": float((inserted == 0).double().mean()),
        "inserted_near_zero_fraction": float((inserted.abs() <= NEAR_ZERO).double().mean()),
        "finite": bool(all(torch.isfinite(s).all() for s in extended)
                       and torch.isfinite(shift).all()),
    }


def _execute(options: StudyOptions, task: str, seed: int, zero_tokens: int, arm: str) -> dict:
    k = zero_tokens
    split = load_split(task, seed)
    model, outcome = train_host(ARM_SPECS[arm], split, options, n_zero=k)
    outcome["test"] = metrics(split, predict(lambda x: model(x, n_zero=k), split.x_test),
                              split.y_test)
    outcome["null"] = null_diagnostics(model, split.x_test, k) if k else None
    return outcome


def plan(options: StudyOptions) -> list[PlannedRun]:
    return matrix_plan(options, [("zero_tokens", "k", ZERO_TOKENS), ("arm", "", ARMS)],
                       lambda arm, **_: {"host": ARM_SPECS[arm].as_dict()}, _execute)


def _worst(values: list[float]) -> str:
    return f"{max(values):.4g}" if values else "–"


def report(runs: dict[str, dict], plan_ids: list[str]) -> str:
    """Table 3 layout (maxima over the evaluated k > 0 cells) plus mean test metrics per arm."""
    done = [i for i in plan_ids if i in runs]
    rows = []
    for arm in ARMS:
        fits = [i for i in done if i.endswith(f"/{arm}")]
        nulls = [runs[i]["outcome"]["null"] for i in fits if runs[i]["outcome"]["null"]]
        components, paper_linf, meaning = PAPER[arm]
        cls_shift = [layer["cls_shift_linf"] for n in nulls for layer in n["layers"]]
        rows.append([TITLES[arm], components,
                     _worst([n["max_inserted_state_linf"] for n in nulls]), paper_linf,
                     _worst([n["prediction_rms_shift"] for n in nulls]), _worst(cls_shift),
                     f"{sum(n['finite'] for n in nulls)}/{len(nulls)}", str(len(fits)), meaning])
    header = ["Arm", "Host components", "Max inserted-state L∞", "Paper",
              "Max prediction RMS shift", "Max CLS shift L∞", "Finite (k>0)", "Fits",
              "Interpretation"]
    table = pipe_table(header, rows)

    metric_rows = []
    for task in PAPER_ORDER:
        metric = primary_metric(REGISTRY[task].kind)
        for k in ZERO_TOKENS:
            cells = []
            for arm in ARMS:
                values = [runs[i]["outcome"]["test"][metric] for i in done
                          if i.startswith(f"{task}/") and i.endswith(f"/k{k}/{arm}")]
                cells.append(f"{fmt(mean(values))} ({len(values)})" if values else "–")
            if any(c != "–" for c in cells):
                metric_rows.append([REGISTRY[task].title, metric.replace("rmse", "RMSE"), str(k),
                                    *cells])
    metric_table = pipe_table(["Task", "Metric", "k", *(TITLES[a] for a in ARMS)], metric_rows)
    return ("Table 3 (CPU rerun): scoped OTransformer study. Maxima are over the evaluated "
            "task–seed–zero-count cells with k > 0; shifts compare each trained model on the test "
            "sequence with and without its k zero tokens.\n\n" + table
            + "\n\nMean test metric (number of seeds) per task, training zero count k and arm "
            "(not in the paper's tables).\n\n" + metric_table)
