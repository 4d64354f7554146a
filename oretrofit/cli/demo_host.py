"""`oretrofit demo-host train|export|average|eval|card|compare`: prior-fit, evaluate and document the
demo host (the small TabPFN v3 checkpoint `--model-path demo` loads). The verbs' names before this
group (`pretrain-demo`, `pretrain-export`, ...) stay one release as hidden aliases that print the new
name; `pretrain-refresh-docs` is now `make docs` (scripts/refresh_docs.py)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import typer

from . import choices
from .errors import fail
from .output import print_json

from oretrofit.demo_host.inference import DEFAULT_PRESET, PRESETS

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """Seconds in a budget such as ``2h``, ``90m``, ``1h30m``, ``300s`` or ``300``."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise typer.BadParameter(f"budget {text!r} is not a duration; write e.g. 2h, 90m, 1h30m or 300s",
                                 param_hint="--budget")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    total = hours * _UNITS["h"] + minutes * _UNITS["m"] + seconds
    if total <= 0:
        raise typer.BadParameter(f"budget {text!r} is no time at all; give a positive duration, e.g. 300s",
                                 param_hint="--budget")
    return total


def parse_overrides(items: list[str], defaults: Any, flag: str) -> Any:
    """``defaults`` (a frozen dataclass) with ``KEY=VALUE`` overrides, each value cast to the field's type."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not hasattr(defaults, key):
            raise ValueError(f"{flag} {item!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(f.name for f in dataclasses.fields(defaults))}")
        kind = type(getattr(defaults, key))
        try:
            changes[key] = (tuple(float(v) for v in value.split(",")) if kind is tuple else kind(value))
        except ValueError:
            raise ValueError(f"{flag} {item!r}: {key} takes {kind.__name__} values "
                             f"(default {getattr(defaults, key)!r})") from None
    return dataclasses.replace(defaults, **changes)


def parse_prior_overrides(items: list[str]) -> Any:
    """A PriorConfig with ``--prior KEY=VALUE`` overrides."""
    from oretrofit.demo_host.prior import PriorConfig

    return parse_overrides(items, PriorConfig(), "--prior")


def parse_class_overrides(items: list[str]) -> Any:
    """A ClassConfig (the classifier's class counts) with ``--classes KEY=VALUE`` overrides."""
    from oretrofit.demo_host.classes import ClassConfig

    return parse_overrides(items, ClassConfig(), "--classes")


def parse_host_overrides(items: list[str]) -> Any:
    """A HostConfig (the v3 architecture's size) with ``--host KEY=VALUE`` overrides."""
    from oretrofit.demo_host.train import HostConfig

    return parse_overrides(items, HostConfig(), "--host")


demo_app = typer.Typer(name="demo-host", no_args_is_help=True, add_completion=False,
                       help="Train, export, average, evaluate and document the demo host.")


@demo_app.command("train")
def train(
    out: Path = typer.Option(..., "--out", help="Run folder: train_state.pt, tabpfn-v3-demo.ckpt "
                                                "(a classifier's tabpfn-v3-demo-classifier.ckpt), loss.csv"),
    task: str = typer.Option("regressor", "--task", help="regressor (bar NLL) or classifier (cross-entropy on "
                                                          "the regression prior's targets cut into classes)"),
    warm_start: Path = typer.Option(None, "--warm-start",
                                    help="A classifier run starts from this v3 regressor checkpoint's weights "
                                         "(e.g. oretrofit/data/tabpfn-v3-demo.ckpt)"),
    classes: list[str] = typer.Option([], "--classes",
                                      help="Class-count override KEY=VALUE for a classifier, e.g. "
                                           "binary_fraction=0.5 (repeatable)"),
    budget: str = typer.Option("2h", "--budget", help="Wall-clock training budget, e.g. 2h, 90m, 300s"),
    seed: int = typer.Option(0, "--seed", min=0),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/train_state.pt"),
    max_steps: int = typer.Option(None, "--max-steps", min=1,
                                  help="Stop after this many steps (each stage's with --curriculum; smoke runs)"),
    budget_steps: int = typer.Option(None, "--budget-steps",
                                     help="Train exactly N steps, the schedule over steps instead of "
                                          "wall-clock (the same steps on any machine); replaces --budget"),
    init_from: Path = typer.Option(None, "--init-from",
                                   help="Start a new stage from this run folder's weights (fresh optimiser)"),
    lr: float = typer.Option(None, "--lr", min=0.0, help="Peak learning rate (default: TrainConfig's)"),
    batch_size: int = typer.Option(None, "--batch-size", min=1, help="Tasks per step (default: TrainConfig's)"),
    workers: int = typer.Option(None, "--workers", min=1,
                                help="Worker processes, one core each, splitting every step's tasks and "
                                     "averaging their gradients (default 1)"),
    prior: list[str] = typer.Option([], "--prior", help="Prior override KEY=VALUE, e.g. max_rows=512 (repeatable)"),
    host: list[str] = typer.Option([], "--host",
                                   help="Architecture override KEY=VALUE, e.g. embed_dim=64 (repeatable)"),
    curriculum: bool = typer.Option(False, "--curriculum",
                                    help="The shipped recipe in one run: the budget split over three stages "
                                         "on tasks of at most 128, 256, 512 rows at 1, 0.7, 0.5 x --lr, "
                                         "seeds SEED, SEED+1, SEED+2 (stages 1-2 in OUT/stage1, OUT/stage2)"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object"),
) -> None:
    """Prior-fit the small TabPFN v3 demo host on the synthetic regression prior (or, with --task
    classifier, on its targets cut into classes)."""
    from oretrofit._files.provenance import portable
    from oretrofit.demo_host.curriculum import CURRICULUM, train_curriculum
    from oretrofit.demo_host.train import TrainConfig, train

    overrides = {k: v for k, v in (("lr", lr), ("batch_size", batch_size), ("workers", workers)) if v is not None}
    try:
        if curriculum and init_from is not None:
            raise ValueError("--curriculum trains every stage from fresh weights; drop --init-from")
        if curriculum and any(item.startswith("max_rows=") for item in prior):
            rows = ", ".join(str(stage.max_rows) for stage in CURRICULUM)
            raise ValueError(f"--curriculum sets max_rows per stage ({rows}); drop --prior max_rows")
        cfg = TrainConfig(budget_s=parse_budget(budget), seed=seed, max_steps=max_steps, budget_steps=budget_steps,
                          prior=parse_prior_overrides(prior), host=parse_host_overrides(host), task=task,
                          warm_start=None if warm_start is None else str(warm_start),
                          classes=parse_class_overrides(classes), **overrides)
        summary = (train_curriculum(out, cfg, resume=resume) if curriculum
                   else train(out, cfg, resume=resume, init_from=init_from))
    except ValueError as exc:
        raise fail(exc) from exc
    summary["command"] = portable(" ".join(["oretrofit", *sys.argv[1:]]))
    if json_out:                                  # a record: paths as receipts name them
        print_json({"schema_version": 1, **summary,
                    "checkpoint": portable(Path(summary["checkpoint"]))})
    else:
        print(f"{summary['steps']} steps in {summary['elapsed_s']:.0f} s, final NLL "
              f"{summary['final_nll']:.4f}; checkpoint {summary['checkpoint']}")


@demo_app.command("export")
def export(
    run: Path = typer.Option(..., "--run", help="A `demo-host train` output folder"),
    out: Path = typer.Option(..., "--out", help="Checkpoint to write (.ckpt or .safetensors); the name must contain v3"),
    inference: str = typer.Option(None, "--inference", callback=choices.INFERENCE_PRESET,
                                  help=f"Inference preset a regressor carries (default {DEFAULT_PRESET}; see "
                                       "`demo-host eval --help`); a classifier carries tabpfn's classification "
                                       "default"),
) -> None:
    """Write a run's weights as a standalone tabpfn-format checkpoint (no optimiser state)."""
    from oretrofit.demo_host.train import export_checkpoint

    try:
        print(str(export_checkpoint(run, out, inference)))
    except ValueError as exc:
        raise fail(exc) from exc


@demo_app.command("average")
def average(
    checkpoints: list[Path] = typer.Argument(..., help="Exported checkpoints of runs that share starting weights"),
    out: Path = typer.Option(..., "--out", help="Checkpoint to write (.ckpt or .safetensors); the name must contain v3"),
) -> None:
    """Write the uniform parameter average of checkpoints (same architecture and preset)."""
    from oretrofit.demo_host.average import average_checkpoints

    try:
        print(str(average_checkpoints(checkpoints, out)))
    except ValueError as exc:
        raise fail(exc) from exc


@demo_app.command("eval")
def evaluate(
    checkpoint: Path = typer.Option(None, "--checkpoint",
                                    help="A tabpfn-format v3 checkpoint (omit: baselines only)"),
    random_reference: bool = typer.Option(True, "--random-reference/--no-random-reference",
                                          help="Also score the random-weight host of the same size"),
    out: Path = typer.Option(..., "--out", help="Evaluation receipt JSON to write"),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Number of 70/30 split seeds"),
    datasets: str = typer.Option("evaluation", "--datasets",
                                 help="A suite (evaluation: the issue's four; validation: the tables "
                                      "choices are made on) or comma-separated dataset specs; for a classifier, "
                                      "evaluation is sklearn:iris, wine, breast_cancer and digits"),
    inference: str = typer.Option(None, "--inference", callback=choices.INFERENCE_PRESET,
                                  help="Run the hosts with this inference preset instead of the "
                                       "checkpoint's own: " + ", ".join(PRESETS)
                                       + "; add -xN for N ensemble members (v2-no-ypower-x16)"),
    reuse_baselines: Path = typer.Option(None, "--reuse-baselines",
                                         help="Earlier receipt whose baseline rows to reuse (same data)"),
    max_train_rows: int = typer.Option(None, "--max-train-rows", min=2,
                                        help="Keep only each split's first N train rows (learning curves)"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object"),
) -> None:
    """R² of the host vs ridge, kNN-10, random forest and a GP on the same splits; for a classifier
    checkpoint, accuracy and log-loss vs logistic regression and a random forest."""
    from oretrofit.demo_host import evaluate_classifier as classification
    from oretrofit.demo_host.card_classifier import CLASSIFIER_NAME, RANDOM_NAME
    from oretrofit.demo_host.evaluate import SUITES, evaluate, markdown_table, random_reference_host

    split = [d for d in datasets.split(",") if d]
    if checkpoint is not None and _is_classifier(checkpoint):
        given = [flag for flag, value in (("--inference", inference), ("--reuse-baselines", reuse_baselines),
                                          ("--max-train-rows", max_train_rows)) if value is not None]
        if given:
            raise fail(ValueError(f"{', '.join(given)}: regression options; {checkpoint} is a classifier "
                                  "checkpoint, drop them"))
        names = list(classification.DATASETS) if datasets == "evaluation" else split
        hosts, random_name = {CLASSIFIER_NAME: checkpoint}, RANDOM_NAME
        run, table = (lambda: classification.evaluate_classifier(hosts, names, n_seeds=seeds, receipt_path=out),
                      classification.markdown_table)
    else:
        names = list(SUITES.get(datasets, split))
        hosts, random_name = ({"tabpfn_v3_demo": checkpoint} if checkpoint is not None else {}), "tabpfn_v3_random"
        run, table = (lambda: evaluate(hosts, names, n_seeds=seeds, receipt_path=out, reuse_baselines=reuse_baselines,
                                       max_train_rows=max_train_rows, inference=inference), markdown_table)
    if random_reference and checkpoint is not None:
        hosts[random_name] = random_reference_host(checkpoint)
    try:
        receipt = run()
    except ValueError as exc:
        raise fail(exc) from exc
    if json_out:
        print_json(receipt)
    else:
        print(table(receipt))


def _is_classifier(checkpoint: Path) -> bool:
    from oretrofit._surgery.registry import RetrofitError
    from oretrofit.hosts.tabpfn.checkpoints import checkpoint_task, load_checkpoint

    try:
        return checkpoint_task(load_checkpoint(checkpoint)) == "classifier"
    except RetrofitError as exc:
        raise fail(exc) from exc


@demo_app.command("card")
def card(
    run: Path = typer.Option(..., "--run", help="Training run folder (train_state.pt, loss.csv)"),
    evaluation: Path = typer.Option(..., "--evaluation", help="Receipt written by `demo-host eval`"),
    out: Path = typer.Option(..., "--out", help="Model card Markdown path; the PNG goes beside it"),
    command: str = typer.Option(..., "--command", help="The exact training command, for the card"),
    eval_command: str = typer.Option(None, "--eval-command",
                                     help="The evaluation command, for the card (default: the receipt's; "
                                          "left out if --command has it as a line)"),
    note: list[str] = typer.Option([], "--note", help="A sentence for the card's training section (repeatable)"),
) -> None:
    """Write the model card (architecture, prior, steps, wall time, loss curve, evaluation); a
    classifier run's card names the regressor it started from and scores accuracy and log-loss."""
    from oretrofit.demo_host.card import write_card
    from oretrofit.demo_host.card_classifier import write_classifier_card
    from oretrofit.demo_host.train import load_state

    try:
        task = load_state(run, "point --run at a `demo-host train` output folder")["train_config"].get("task")
        writer = write_classifier_card if task == "classifier" else write_card
        path = writer(run, evaluation, out, training_command=command, evaluation_command=eval_command, notes=note)
    except ValueError as exc:
        raise fail(exc) from exc
    print(str(path))


@demo_app.command("compare")
def compare(
    receipt: list[str] = typer.Option(..., "--receipt",
                                      help="LABEL=PATH of a `demo-host eval` receipt with a host (repeatable)"),
) -> None:
    """Host R² per dataset, its mean and the issue's targets met, one row per evaluated run."""
    from oretrofit.demo_host.card import compare_runs
    from oretrofit.demo_host.documents import labelled_receipts

    try:
        print(compare_runs(labelled_receipts(receipt)))
    except ValueError as exc:
        raise fail(exc) from exc


def refresh_docs(
    documents: list[Path] = typer.Argument(..., help="Markdown files holding demo-host compare blocks"),
    check: bool = typer.Option(False, "--check", help="Change nothing; exit 1 if a table is stale or missing"),
) -> None:
    """Rewrite the table under each `oretrofit demo-host compare` block from the receipts it names
    (the old `pretrain-refresh-docs`, now `make docs`: scripts/refresh_docs.py)."""
    from oretrofit.demo_host.documents import refresh_documents

    try:
        stale = refresh_documents(documents, check=check, report=print)
    except (OSError, ValueError) as exc:
        raise fail(exc) from exc
    if check and stale:
        raise typer.Exit(1)


# The verbs' names before the demo-host group, kept one release as hidden aliases.
RENAMED = {"pretrain-demo": "train", "pretrain-export": "export", "pretrain-average": "average",
           "pretrain-eval": "eval", "pretrain-card": "card", "pretrain-compare": "compare"}


def register(app: typer.Typer) -> None:
    """Add the ``demo-host`` group to ``app``, and the old ``pretrain-*`` names as hidden aliases."""
    from ._aliases import renamed

    app.add_typer(demo_app, name="demo-host", rich_help_panel="Demo host")
    commands = {info.name: info.callback for info in demo_app.registered_commands}
    moved = {old: (commands[new], f"oretrofit demo-host {new}") for old, new in RENAMED.items()}
    moved["pretrain-refresh-docs"] = (refresh_docs, "make docs")
    for old, (callback, now) in moved.items():
        app.command(old, hidden=True, help=f"Renamed: {now}.")(renamed(callback, old, now))
