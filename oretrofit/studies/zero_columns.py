"""Table 10: training-time exact-zero columns (C.5).

k ∈ {0, 1, 2, 4} exact-zero columns are appended after train-fitted preprocessing to the train,
validation and test sets. The two-block host has a bias-free feature tokenizer (so a zero column is
an exact zero token), affine-free LayerNorm, bias-free FFN and a learned CLS read-out. Standard and
hidden-carrier OAttention arms start from the same initial state for each task, seed and k, and
every k > 0 host starts from the k = 0 host's parameters (plus its own rows for the zero columns).
"""

from __future__ import annotations

import torch

from .._files.markdown import pipe_table
from .common import StudyOptions, fmt, matrix_plan, mean, train_host
from .data import FIVE_TASKS, PAPER_ORDER, TASKS as REGISTRY, load_split
from .models import BlockSpec, HostSpec
from .receipts import PlannedRun
from .training import metrics, predict, primary_metric

NAME = "zero_columns"
TASKS = FIVE_TASKS
ARMS = ("softmax", "oattention")
ZERO_COLUMNS = (0, 1, 2, 4)
# Table 10 (paper, GPU): task -> standard/OA per k.
PAPER = {
    "iris": (".8667/.9222", ".8667/.9111", ".8778/.9111", ".9333/.8889"),
    "wine": (".9444/.9444",) * 4,
    "breast_cancer": (".9678/.9678",) * 4,
    "digits": (".9204/.9213", ".9194/.9213", ".9194/.9213", ".9194/.9213"),
    "diabetes": ("62.6683/62.6689", "62.7226/62.6680", "62.7453/62.6682", "62.8580/62.6688"),
}


def host_spec(arm: str) -> HostSpec:
    """Bias-free tokenizer, affine-free norms, bias-free FFN, no position encoding."""
    return HostSpec(BlockSpec(arm, o_local=False, affine_norm=False, ffn_bias=False),
                    encoding="none", tokenizer_bias=False)


def _execute(options: StudyOptions, task: str, seed: int, zero_columns: int, arm: str) -> dict:
    k = zero_columns
    split = load_split(task, seed, zero_columns=k)
    model, outcome = train_host(host_spec(arm), split, options, zero_columns=k)
    outcome["test"] = metrics(split, predict(model, split.x_test), split.y_test)
    with torch.no_grad():
        final = model.states(split.x_test)[-1]                                # (B, F + k + 1, d)
        zero_tokens = final[:, split.n_features - k: split.n_features]
    outcome["zero_column_state_linf"] = float(zero_tokens.abs().max()) if k else None
    return outcome


def plan(options: StudyOptions) -> list[PlannedRun]:
    return matrix_plan(options, [("zero_columns", "k", ZERO_COLUMNS), ("arm", "", ARMS)],
                       _config, _execute)


def _config(arm: str, zero_columns: int, **_: object) -> dict:
    config: dict = {"host": host_spec(arm).as_dict()}
    if zero_columns:
        config["initial_state"] = ("parameters shared with the k = 0 host copied from it; the k "
                                   "extra tokenizer rows drawn afresh")
    return config


def report(runs: dict[str, dict], plan_ids: list[str]) -> str:
    """Table 10 layout: mean test metric, standard/OA, one CPU row and one paper row per task."""
    rows = []
    for task in PAPER_ORDER:
        if not any(i.startswith(f"{task}/") for i in plan_ids):
            continue
        metric = primary_metric(REGISTRY[task].kind)
        cells, seeds = [], []
        for k in ZERO_COLUMNS:
            pair = []
            for arm in ARMS:
                values = [runs[i]["outcome"]["test"][metric] for i in plan_ids
                          if i in runs and i.startswith(f"{task}/") and i.endswith(f"/k{k}/{arm}")]
                seeds.append(len(values))
                pair.append(fmt(mean(values)))
            cells.append("–" if pair == ["–", "–"] else "/".join(pair))
        title, label = REGISTRY[task].title, metric.replace("rmse", "RMSE")
        rows.append([title, label, "CPU", *cells, str(min(seeds))])
        rows.append([title, label, "paper", *PAPER[task], "3"])
    header = ["Task", "Metric", "Run", *(f"k={k}" for k in ZERO_COLUMNS), "Seeds"]
    states = {arm: [runs[i]["outcome"]["zero_column_state_linf"] for i in plan_ids
                    if i in runs and i.endswith(f"/{arm}") and "/k0/" not in i] for arm in ARMS}
    note = "; ".join(f"{arm} max {max(v):.4g}" if v else f"{arm} –" for arm, v in states.items())
    return ("Table 10 (CPU rerun): mean test metric over seeds with k exact-zero columns, "
            "standard/hidden-carrier OAttention. For Diabetes, lower RMSE is better.\n\n"
            + pipe_table(header, rows)
            + f"\n\nZero-column token state L∞ after the final block (k > 0): {note}.")
