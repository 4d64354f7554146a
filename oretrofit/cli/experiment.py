"""`oretrofit experiment NAME`: run or resume one of the paper's learned-model studies."""

from __future__ import annotations

from pathlib import Path

import typer

from . import choices
from .errors import fail
from .output import print_json


def _split_list(values: list[str] | None) -> tuple[str, ...] | None:
    """``--datasets a,b --datasets c`` -> ("a", "b", "c"); None when not given."""
    if not values:
        return None
    return tuple(v for item in values for v in item.split(",") if v)


def experiment(
    name: str = typer.Argument(..., help="adapters, insertion, zero_columns, otransformer or "
                                         "ostandardize", callback=choices.one_of(
                                             choices.names_in("oretrofit.studies", "STUDIES"))),
    quick: bool = typer.Option(False, "--quick", help="CI-size matrix: first data set, first "
                               "seed, 3 epochs (receipt NAME-quick.json)"),
    out: Path = typer.Option(Path("results/studies"), "--out", help="Folder for NAME.json "
                             "(receipt, resumed when present) and NAME.md (table)"),
    datasets: list[str] = typer.Option(None, "--datasets", help="Data sets, comma-separated "
                                       "or repeated (default: the study's full list)"),
    seeds: list[str] = typer.Option(None, "--seeds", help="Seeds (default 11,23,37)"),
    epochs: int = typer.Option(100, "--epochs", min=1, help="Training epochs per fit"),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Mini-batch rows"),
    report_only: bool = typer.Option(False, "--report-only", help="Only regenerate NAME.md "
                                     "from the existing receipt; run nothing"),
    merge_from: list[Path] = typer.Option(None, "--merge-from", help="Absorb the runs of "
                                          "another receipt of this study (a parallel worker's "
                                          "--out folder run with other seeds); repeatable"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object"),
) -> None:
    """Run a learned-model study; runs already in the receipt are skipped (resume)."""
    from oretrofit.studies import STUDIES, StudyOptions, run_study
    from oretrofit.studies.data import SEEDS, check_tasks

    study = STUDIES[name]
    chosen = _split_list(datasets)
    try:
        if chosen is not None:
            check_tasks(chosen, study.TASKS)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--datasets") from None
    try:
        seed_values = tuple(int(s) for s in _split_list(seeds) or SEEDS)
    except ValueError:
        raise typer.BadParameter(f"seeds are integers, comma-separated or repeated (e.g. 11,23), "
                                 f"got {','.join(seeds)!r}", param_hint="--seeds") from None
    options = StudyOptions(chosen, seed_values, epochs, batch_size, quick)
    try:
        result = run_study(study, options, out, execute=not report_only,
                           merge_from=merge_from or ())
    except (ValueError, RuntimeError, OSError) as err:    # bad input, a busy or full --out
        raise fail(err) from None
    if json_out:
        print_json({"schema_version": 1, "study": name, "receipt": str(result.receipt_path),
                    "table": str(result.table_path), "complete": result.complete,
                    "runs_done": result.runs_done, "runs_planned": result.runs_planned,
                    "wall_s": result.wall_s, "markdown": result.markdown})
    else:
        print(result.markdown)


def register(app: typer.Typer) -> None:
    """Add the ``experiment`` verb to ``app``."""
    app.command("experiment")(experiment)
