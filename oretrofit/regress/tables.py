"""Renders run folders as Markdown, LaTeX and CSV tables (and plots) beside the paper's values.

For every τ run: the Table 2 layout (means over seeds of RMSE and R² per arm) and the Table 7
layout (ΔRMSE % and ΔR² against base, with the mean over cells). Each entry reads
``measured / paper``, with ``—`` where the paper reports no value. A grid of three or more τ adds
the curve (ΔRMSE % and ΔR² against τ); per-site τ variants add their own rows and the site-family
ablation its ranking (:mod:`.variant_tables`). The rendered text and CSVs
hold no timings (those go to ``timings.csv``), so re-rendering the same cells, however they were
produced (one run, a resumed run, shards), gives identical files.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .._files.atomic import make_folder, own_folder, write_text_atomic
from .._files.markdown import pipe_table
from .._files.written import claim, refuse_foreign
from .plots import PLOT_NAMES
from .reading import reading
from .store import read_cells, read_variants
from .summary import MEAN_ROW, Row, Summary, summarize
from .variant_tables import ablation_tables, curve_tables, variant_table
__all__ = ["Table", "Rendered", "build_tables", "to_markdown", "to_latex", "render"]

ARM_LABELS = {"base": "Base", "oa": "OA", "full-o": "Full-O"}
_CELL_COLUMNS = ("dataset", "seed", "arm", "tau", "rmse", "r2", "n_train", "n_test",
                 "n_features", "split_sha256", "dataset_sha256")
_TEXT_NAMES = ("tables.md", "tables.tex", "summary.csv", "cells.csv", "timings.csv",
               "timings.md")
_TIMING_COLUMNS = ("dataset", "seed", "arm", "tau", "fit_s", "predict_s", "wall_s", "cpu_s",
                   "worker", "torch_threads")


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


@dataclass
class Rendered:
    markdown: str
    files: dict[str, Path]
    summary: Summary
    settings: dict[str, Any]


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """``—`` where there is no value, ``undefined`` for NaN (R² of a constant target)."""
    if value is None:
        return "—"
    return "undefined" if math.isnan(value) else f"{value:{spec}}{suffix}"


def _pair(measured: float | None, paper: float | None, spec: str, suffix: str = "") -> str:
    return f"{_fmt(measured, spec, suffix)} / {_fmt(paper, spec, suffix)}"


def _d_rmse(row: Row) -> str:
    if row.d_rmse_undefined:
        return f"undefined (base RMSE 0) / {_fmt(row.paper_d_rmse_pct, '+.3f', '%')}"
    return _pair(row.d_rmse_pct, row.paper_d_rmse_pct, "+.3f", "%")


def _label(row: Row | None, summary: Summary, spec: str) -> str:
    if spec == MEAN_ROW:
        return f"mean over {row.n_seeds} cells" if row else MEAN_ROW
    return summary.names[spec] + (" †" if row and row.standin_for else "")


def _standins(summary: Summary) -> list[str]:
    standins = sorted({(r.name, r.standin_for) for r in summary.rows if r.standin_for})
    return [f"† {name}: offline stand-in for {spec}; the paper column is {spec}'s."
            for name, spec in standins]


def _notes(summary: Summary) -> list[str]:
    return ["Each entry: measured / paper (— where the paper reports none).",
            *_standins(summary), *summary.notes]


def build_tables(summary: Summary) -> list[Table]:
    """The Table 2 and Table 7 layouts for every τ (or one base table when only base ran)."""
    tables = []
    if not summary.rows:
        return [Table("No complete (dataset, seed) group", ["Dataset", "Seeds"], [],
                      _notes(summary))]
    for tau in summary.taus or [None]:
        arms = [a for a in summary.arms if tau is not None or a == "base"]
        columns: list[tuple[str, Callable[[Row], str]]] = [
            *((f"{ARM_LABELS[a]} RMSE", lambda r: _pair(r.rmse, r.paper_rmse, ".6g"))
              for a in arms),
            *((f"{ARM_LABELS[a]} R²", lambda r: _pair(r.r2, r.paper_r2, ".6f")) for a in arms)]
        title = ("base (no τ)" if tau is None else f"τ = {tau:g}") + ": means over seeds"
        tables.append(_grid(summary, f"{title} (Table 2 layout)", arms * 2, tau, columns,
                            with_mean=False))
        o_arms = [a for a in arms if a != "base"]
        if tau is None or not o_arms or "base" not in summary.arms:
            continue
        columns = [(f"{ARM_LABELS[a]} ΔRMSE %", _d_rmse) for a in o_arms]
        columns += [(f"{ARM_LABELS[a]} ΔR²", lambda r: _pair(r.d_r2, r.paper_d_r2, "+.6f"))
                    for a in o_arms]
        tables.append(_grid(summary, f"τ = {tau:g}: change against base, means over seeds "
                                     "(Table 7 layout)", o_arms * 2, tau, columns, with_mean=True))
    variants = variant_table(summary)
    extra = [*curve_tables(summary), *([variants] if variants else []), *ablation_tables(summary)]
    return tables + [Table(title, header, rows, _standins(summary))
                     for title, header, rows in extra]


def _grid(summary: Summary, title: str, arms: Sequence[str], tau: float | None,
          columns: Sequence[tuple[str, Callable[[Row], str]]], with_mean: bool) -> Table:
    """One row per dataset; column i shows ``columns[i]`` of arm ``arms[i]``'s aggregate."""
    specs = [*summary.datasets, *([MEAN_ROW] if with_mean else [])]
    rows = []
    for spec in specs:
        found = [summary.row(spec, arm, None if arm == "base" else tau) for arm in arms]
        if not any(found):
            continue
        first = next(r for r in found if r)
        rows.append([_label(first, summary, spec), str(first.n_seeds),
                     *(show(r) if r else "—" for r, (_, show) in zip(found, columns))])
    header = ["Dataset", "Cells" if with_mean else "Seeds", *(name for name, _ in columns)]
    return Table(title, header, rows, _notes(summary))


def timing_table(cells: Sequence[dict[str, Any]], summary: Summary,
                 settings: dict[str, Any]) -> Table:
    """Seconds per cell (means over seeds and τ) by dataset and arm: build+fit+predict (wall),
    fit, predict, and process CPU time."""
    rows = []
    for spec in summary.datasets:
        for arm in summary.arms:
            own = [c for c in cells if c["dataset"] == spec and c["arm"] == arm]
            if own:
                mean = {k: sum(c.get(k, 0.0) for c in own) / len(own)
                        for k in ("wall_s", "fit_s", "predict_s", "cpu_s")}
                rows.append([summary.names[spec], ARM_LABELS[arm], str(len(own)),
                             f"{own[0]['n_train']}/{own[0]['n_test']}",
                             *(f"{mean[k]:.2f}" for k in ("wall_s", "fit_s", "predict_s",
                                                          "cpu_s"))])
    threads = sorted({c.get("torch_threads") for c in cells}, key=str)
    note = (f"Host: {settings.get('weights', '?')}; device {settings.get('device_type', '?')}; "
            f"torch threads {', '.join(map(str, threads))}.")
    return Table("Seconds per cell", ["Dataset", "Arm", "Cells", "Train/test rows",
                                      "Wall", "Fit", "Predict", "CPU"], rows, [note])


def to_markdown(tables: Iterable[Table]) -> str:
    parts = []
    for t in tables:
        parts.append("\n".join([f"### {t.title}", "", pipe_table(t.header, t.rows), "",
                                 *t.notes, ""]))
    return "\n".join(parts)


def _tex(text: str) -> str:
    for raw, escaped in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"),
                         ("#", r"\#"), ("τ", r"$\tau$"), ("Δ", r"$\Delta$"), ("²", r"$^2$"),
                         ("—", "--"), ("†", r"$^\dagger$")):
        text = text.replace(raw, escaped)
    return text


def to_latex(tables: Iterable[Table]) -> str:
    """booktabs tabulars, one ``table`` environment per table, the title as caption."""
    parts = []
    for t in tables:
        parts += [r"\begin{table}[t]", r"\centering", r"\small",
                  r"\begin{tabular}{l" + "r" * (len(t.header) - 1) + "}", r"\toprule",
                  " & ".join(map(_tex, t.header)) + r" \\", r"\midrule",
                  *(" & ".join(map(_tex, r)) + r" \\" for r in t.rows), r"\bottomrule",
                  r"\end{tabular}", r"\caption{" + _tex(" ".join([t.title, *t.notes])) + "}",
                  r"\end{table}", ""]
    return "\n".join(parts)


def _csv(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _with_variant(columns: Iterable[str], shown: bool) -> list[str]:
    """``columns`` with ``variant`` after ``tau`` where variants ran (none otherwise: folders
    without variants render exactly as before they existed)."""
    columns = [c for c in columns if c != "variant"]
    return [*columns[:columns.index("tau") + 1], "variant",
            *columns[columns.index("tau") + 1:]] if shown else columns


def output_names(plots: bool) -> tuple[str, ...]:
    """The files :func:`render` writes (the plots' when ``plots``)."""
    return (*_TEXT_NAMES, *(PLOT_NAMES if plots else ()))


def check_outputs(out: str | Path, plots: bool) -> None:
    """Refuse, before a run, files in ``out`` of the names :func:`render` writes that oretrofit
    did not write (:func:`oretrofit._files.written.refuse_foreign`); a folder not there passes."""
    if Path(out).is_dir():
        refuse_foreign(out, output_names(plots))


def render(folders: Sequence[str | Path], out: str | Path | None = None, *,
           plots: bool = True) -> Rendered:
    """Render one or more run folders (shards are merged) into ``out`` (default
    ``<first folder>/tables``): tables.md, tables.tex, summary.csv, cells.csv, timings.csv,
    timings.md and the ΔRMSE % plots."""
    settings, datasets, cells = read_cells(folders)
    summary = summarize(cells, datasets, read_variants(folders, cells))
    tables = build_tables(summary)
    variants = any(c.get("variant") for c in cells)
    # the run folder's own tables folder is never a link (_atomic.own_folder); --out is yours
    out = (make_folder(out, f"--out {out}") if out is not None
           else own_folder(Path(folders[0]) / "tables"))
    markdown = to_markdown(tables)
    lines = reading(summary)
    if lines:
        markdown += "\n".join(["", "### Reading (generated from the rows above)", "", *lines, ""])
    texts = dict(zip(_TEXT_NAMES, (
        markdown, to_latex(tables),
        _csv(map(asdict, summary.rows), _with_variant(Row.__dataclass_fields__,
                                                      any(r.variant for r in summary.rows))),
        _csv(cells, _with_variant(_CELL_COLUMNS, variants)),
        _csv(cells, _with_variant(_TIMING_COLUMNS, variants)),
        to_markdown([timing_table(cells, summary, settings)]))))
    claim(out, output_names(plots))     # the user's own files of these names: never replaced
    files = {}
    for name, text in texts.items():
        files[name] = write_text_atomic(out / name, text)
    if plots:
        from .plots import plot_delta_rmse
        files.update(plot_delta_rmse(summary, out))
    return Rendered(markdown, files, summary, settings)
