"""The demo classifier's model card: where it started, architecture, prior, training run, loss curve,
evaluation, commands.

Everything in the card is read from the run's ``train_state.pt``, the warm-start checkpoint and
the evaluation receipt written by :func:`oretrofit.demo_host.evaluate_classifier.evaluate_classifier`;
nothing is typed in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._files.markdown import pipe_table
from .._files.provenance import portable
from .._files.reading import FileRefused, read_json
from .._files.atomic import write_text_atomic
from . import classes as classes_module
from . import warm_start as warm_start_module
from .card import _stage_table, _table, command_lines, note_lines, plot_loss
from .evaluate_classifier import markdown_table
from .train import HostConfig, config_from_state, load_state, stage_record, stage_totals

__all__ = ["CLASSIFIER_NAME", "RANDOM_NAME", "beats_random", "write_classifier_card"]

CLASSIFIER_NAME = "tabpfn_v3_demo_classifier"
RANDOM_NAME = "tabpfn_v3_random"


def beats_random(receipt: dict[str, Any]) -> list[dict[str, Any]]:
    """Per dataset: the classifier's and the random-weights classifier's mean accuracy and
    log-loss, and whether the classifier is better on both."""
    accuracy, loss = receipt["summary"]["accuracy"], receipt["summary"]["log_loss"]
    return [{"dataset": d, "accuracy": accuracy[d][CLASSIFIER_NAME]["mean"],
             "random_accuracy": accuracy[d][RANDOM_NAME]["mean"], "log_loss": loss[d][CLASSIFIER_NAME]["mean"],
             "random_log_loss": loss[d][RANDOM_NAME]["mean"],
             "better": (accuracy[d][CLASSIFIER_NAME]["mean"] > accuracy[d][RANDOM_NAME]["mean"]
                        and loss[d][CLASSIFIER_NAME]["mean"] < loss[d][RANDOM_NAME]["mean"])}
            for d in accuracy]


def _read_receipt(path: Path) -> dict[str, Any]:
    fix = "give a receipt written by `oretrofit demo-host eval` of a classifier checkpoint"
    try:
        receipt = read_json(path, "the receipt", fix)
    except FileRefused as exc:
        raise ValueError(f"--evaluation {path}: {exc}") from None
    if not isinstance(receipt, dict) or receipt.get("kind") != "oretrofit.pretrain.classification" \
            or CLASSIFIER_NAME not in receipt.get("hosts", {}):
        raise ValueError(f"--evaluation {path}: not a classification receipt scoring {CLASSIFIER_NAME}; {fix}")
    return receipt


def write_classifier_card(run: Path, evaluation: Path, out: Path, training_command: str,
                          evaluation_command: str | None = None, notes: list[str] | None = None) -> Path:
    """Write the classifier's Markdown card at ``out`` and its loss-curve PNG beside it; return the card's path."""
    run, out = Path(run), Path(out)
    state = load_state(run, "point --run at a `demo-host train --task classifier` output folder")
    receipt = _read_receipt(Path(evaluation))
    cfg = config_from_state(state["train_config"])
    stored = state["train_config"]
    stages = [*state.get("stages", []), stage_record(state)]
    total_steps, total_s = stage_totals(state)
    png = plot_loss([[tuple(r) for r in s["loss_log"]] for s in stages], out.with_name(out.stem + "-loss.png"),
                    loss="cross-entropy (test rows)", title="demo TabPFN v3 classifier: prior-fitting loss")
    n_params = sum(v.numel() for k, v in state["model"].items() if k != "regression_borders")
    host = receipt["hosts"][CLASSIFIER_NAME]
    architecture = HostConfig(**stored["host"]).tabpfn_config("classifier")
    warm = stored.get("warm_start")
    start = (f"the demo regressor `{Path(warm).name}` (sha256 `{state.get('warm_start_sha256')}`)"
             if warm else f"tabpfn's initialisation at seed {cfg.seed}")
    checks = [f"- {c['dataset']}: accuracy {c['accuracy']:.3f} vs {c['random_accuracy']:.3f}, log-loss "
              f"{c['log_loss']:.3f} vs {c['random_log_loss']:.3f} — {'better' if c['better'] else 'NOT better'}"
              for c in beats_random(receipt)]
    train_cfg = {k: v for k, v in stored.items() if k not in ("host", "prior", "classes")}
    datasets = pipe_table(["dataset", "loader", "rows", "features", "classes", "sha256"],
                          ([d, f"`{i['loader']}`", i["n_rows"], i["n_features"], i["n_classes"], f"`{i['sha256'][:12]}`"]
                           for d, i in receipt["datasets"].items()))
    text = f"""# tabpfn-v3-demo-classifier: a small TabPFN v3 classifier prior-fitted by oretrofit

These are **not** Prior Labs' TabPFN v3 weights. This checkpoint is tabpfn's own v3
architecture (`architecture_name: tabpfn_v3`, `max_num_classes` {architecture.max_num_classes}, loads through
`TabPFNClassifier(model_path=...)`) in the demo regressor's small configuration, prior-fitted on a
2-core CPU by `oretrofit.demo_host` on a synthetic classification prior, starting from {start}.
It exists so that `make_classifier("demo")` is a host that has learned its active path on a
machine with no download.

- checkpoint: `{Path(host['path']).name}`, sha256 `{host['sha256']}`
- parameters: {n_params:,}
- training: {total_steps} steps in {total_s / 60:.1f} min wall-clock over {len(stages)} stage(s),
  final logged cross-entropy {state['loss_log'][-1][3]:.4f}

## Architecture (TabPFNV3Config fields oretrofit sets; the rest are tabpfn's defaults)

{_table({**stored['host'], 'max_num_classes': architecture.max_num_classes})}

Read-out: v3's many-class decoder ({architecture.decoder_num_heads} heads of dimension
{architecture.decoder_head_dim}). Inference config: tabpfn's v2.5 classification default (`default_inference_config("classifier")`).

## Where it started

{warm_start_module.__doc__.strip()}

## Prior

{classes_module.__doc__.strip()}

{_table(stored['classes'])}

The regression tasks are the demo regressor's prior (`oretrofit.demo_host.prior`, described in
its card `tabpfn-v3-demo.md`) with these fields:

{_table(stored['prior'])}

## Training

Loss: cross-entropy of the test rows' classes (`oretrofit.demo_host.train.class_nll`); AdamW,
linear warm-up then cosine in the fraction of the budget spent.

{_stage_table(stages)}

Training configuration:

{_table(train_cfg)}

![loss curve]({png.name})
{note_lines(notes)}
## Evaluation

{markdown_table(receipt)}

`{CLASSIFIER_NAME}` is this checkpoint, `{RANDOM_NAME}` the same configuration with random
(untrained) weights; baselines as in `oretrofit.demo_host.evaluate_classifier`. Datasets:

{datasets}

Against the random-weights classifier (mean accuracy, mean log-loss):

{chr(10).join(checks)}

Receipt: `{Path(evaluation).name}`.

## How it was made

```
{command_lines(training_command, evaluation_command, receipt)}
```
"""
    write_text_atomic(out, portable(text))
    return out
