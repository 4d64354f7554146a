"""Table 9: test-time NULL insertion into a trained two-block FT-style host (C.4).

The host (32-dim, 4 heads, learned CLS read-out, affine-free LayerNorm, bias-free FFN) is trained
without inserted tokens; then 1 and 4 exact zero tokens are appended after the feature and CLS
carriers and the trained model is compared on the original and the extended test sequence:
prediction RMS shift, and the inserted-state L∞ after the final block.
"""

from __future__ import annotations

import torch

from .._files.markdown import pipe_table
from .common import StudyOptions, matrix_plan, mean, train_host
from .data import FIVE_TASKS, load_split
from .models import BlockSpec, HostSpec
from .receipts import PlannedRun
from .training import metrics, predict

NAME = "insertion"
TASKS = FIVE_TASKS
ARMS = ("softmax", "oattention")
INSERTED = (1, 4)
# Table 9 (paper, GPU): inserted -> (RMS shift standard, OA, state L∞ standard range, OA).
PAPER = {1: ("7.39e-02", "3.69e-05", "1.83–7.42", "0"), 4: ("2.18e-01", "1.64e-04", "1.84–7.42", "0")}


def host_spec(arm: str) -> HostSpec:
    """FT-style host: biased tokenizer, affine-free norms, bias-free FFN, no position encoding."""
    return HostSpec(BlockSpec(arm, o_local=False, affine_norm=False, ffn_bias=False),
                    encoding="none", tokenizer_bias=True)


@torch.no_grad()
def insertion_effect(model, x: torch.Tensor, n_zero: int) -> dict:
    """Compare the trained host on ``x`` with and without ``n_zero`` appended zero tokens."""
    base, extended = model.states(x)[-1], model.states(x, n_zero)[-1]      # (B, N[+k], d)
    n_old = base.shape[1]
    inserted = extended[:, n_old:]
    shift = model.readout(extended) - model.readout(base)                  # (B, outputs)
    return {"prediction_rms_shift": float(shift.double().square().mean().sqrt()),
            "prediction_max_abs_shift": float(shift.abs().max()),
            "inserted_state_linf": float(inserted.abs().max()),
            "inserted_exact_zero_fraction": float((inserted == 0).double().mean()),
            "old_token_shift_linf": float((extended[:, :n_old] - base).abs().max()),
            "finite": bool(torch.isfinite(extended).all() and torch.isfinite(shift).all())}


def _execute(options: StudyOptions, task: str, seed: int, arm: str) -> dict:
    split = load_split(task, seed)
    model, outcome = train_host(host_spec(arm), split, options)
    outcome["test"] = metrics(split, predict(model, split.x_test), split.y_test)
    outcome["insertion"] = {str(k): insertion_effect(model, split.x_test, k) for k in INSERTED}
    return outcome


def plan(options: StudyOptions) -> list[PlannedRun]:
    return matrix_plan(options, [("arm", "", ARMS)],
                       lambda arm, **_: {"host": host_spec(arm).as_dict(),
                                         "inserted": list(INSERTED)}, _execute)


def report(runs: dict[str, dict], plan_ids: list[str]) -> str:
    """Table 9 layout: mean RMS prediction shift over task–seed pairs; L∞ range (min–max)."""
    done = [i for i in plan_ids if i in runs]
    rows = []
    for k in INSERTED:
        cells = {}
        for arm in ARMS:
            effects = [runs[i]["outcome"]["insertion"][str(k)] for i in done if i.endswith(arm)]
            shift = mean(e["prediction_rms_shift"] for e in effects)
            states = [e["inserted_state_linf"] for e in effects]
            cells[arm] = ("–" if shift is None else f"{shift:.2e}",
                          "–" if not states else (f"{min(states):.2f}–{max(states):.2f}"
                                                  if max(states) > 0 else "0"))
        paper = PAPER[k]
        rows.append([str(k), cells["softmax"][0], cells["oattention"][0], cells["softmax"][1],
                     cells["oattention"][1], paper[0], paper[1], paper[2], paper[3]])
    pairs = len({i.rsplit("/", 1)[0] for i in done})
    header = ["Inserted tokens", "RMS shift standard", "RMS shift OA", "State L∞ standard",
              "State L∞ OA", "Paper shift standard", "Paper shift OA", "Paper L∞ standard",
              "Paper L∞ OA"]
    return (f"Table 9 (CPU rerun): test-time insertion over {pairs} task–seed pairs. Prediction "
            "shift is the RMS over test predictions (model outputs: logits, or the standardised "
            "regression output), averaged over pairs; state is the maximum absolute inserted "
            "coordinate after the final block (min–max over pairs).\n\n"
            + pipe_table(header, rows))
