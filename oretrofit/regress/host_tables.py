"""One comparison table across model families: the ΔRMSE % of each O arm against base, per
host, from one run folder per host (``oretrofit regress --host ...``), rendered by
``oretrofit tables --across-hosts DIR...``.

Each row is one folder's mean over its (dataset, seed) cells at one τ, the Table 7 "mean"
row (:func:`oretrofit.regress.summary.summarize`), so the families are compared on the
datasets and seeds their runs share only when the runs were made with the same matrix.
Folders are read, never merged: unlike ``tables DIR1 DIR2`` (shards of one run), each keeps
its own settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .._files.atomic import make_folder, own_folder, write_text_atomic
from .._files.written import claim
from .store import read_cells, read_variants
from .summary import MEAN_ROW, summarize
from .tables import ARM_LABELS, Table, to_latex, to_markdown

__all__ = ["HostRow", "HOST_FILES", "host_rows", "host_table", "write_host_table"]

O_ARMS = ("oa", "full-o")
HOST_FILES = ("hosts.md", "hosts.tex")


@dataclass(frozen=True)
class HostRow:
    """One run folder at one τ: its host, its cells and each O arm's mean ΔRMSE % (None where
    the arm did not run, NaN where a base RMSE of 0 leaves it undefined)."""

    host: str
    run: str
    folder: str
    tau: float
    cells: int
    d_rmse_pct: dict[str, Optional[float]]


def host_rows(folders: Sequence[str | Path]) -> list[HostRow]:
    """ΔRMSE % = 100·(RMSE_arm − RMSE_base)/RMSE_base, mean over cells, of each O arm, one row
    per (folder, τ); the host is the one the folder's run recorded (TabPFN when none)."""
    if not folders:
        raise ValueError("name the run folders to compare (one per host)")
    rows = []
    for folder in folders:
        settings, datasets, cells = read_cells([folder])
        summary = summarize(cells, datasets, read_variants([folder], cells))
        for tau in summary.taus:
            found = {arm: summary.row(MEAN_ROW, arm, tau) for arm in O_ARMS}
            first = next((r for r in found.values() if r), None)
            if first is None:
                continue
            rows.append(HostRow(
                settings.get("host", "tabpfn"), Path(folder).name, str(folder), tau,
                first.n_seeds,
                {arm: (float("nan") if r.d_rmse_undefined else r.d_rmse_pct) if r else None
                 for arm, r in found.items()}))
    return rows


def _cell(value: float | None) -> str:
    if value is None:
        return "—"
    return "undefined (base RMSE 0)" if value != value else f"{value:+.3f}%"


def _table(rows: Sequence[HostRow]) -> Table:
    header = ["Host", "Run", "τ", "Cells", *(f"{ARM_LABELS[a]} ΔRMSE %" for a in O_ARMS)]
    return Table("ΔRMSE % against base across hosts (means over cells)", header,
                 [[r.host, r.run, f"{r.tau:g}", str(r.cells),
                   *(_cell(r.d_rmse_pct[a]) for a in O_ARMS)] for r in rows],
                 ["Each row: one run folder's mean over its (dataset, seed) cells."])


def host_table(folders: Sequence[str | Path]) -> Table:
    """:func:`host_rows` as one table: Host, Run (the folder's name), τ, Cells, ΔRMSE % of
    each O arm."""
    return _table(host_rows(folders))


def write_host_table(folders: Sequence[str | Path], out: str | Path | None = None
                     ) -> tuple[list[HostRow], dict[str, Path]]:
    """:func:`host_table` as ``hosts.md`` and ``hosts.tex`` in ``out`` (default: the first
    folder's ``tables``); a file of those names that oretrofit did not write is refused
    (:func:`oretrofit._files.written.claim`), nothing written. Returns the rows and files."""
    rows = host_rows(folders)
    table = _table(rows)
    folder = (make_folder(out, f"--out {out}") if out is not None
              else own_folder(Path(folders[0]) / "tables"))
    claim(folder, HOST_FILES)
    texts = dict(zip(HOST_FILES, (to_markdown([table]), to_latex([table]))))
    return rows, {name: write_text_atomic(folder / name, text) for name, text in texts.items()}
