"""One comparison table across model families: the ΔRMSE % of each O arm against base, per
host, from one run folder per host (``oretrofit regress --host ...``).

Each row is one folder's mean over its (dataset, seed) cells at one τ, the Table 7 "mean"
row (:func:`oretrofit.regress.summary.summarize`), so the families are compared on the
datasets and seeds their runs share only when the runs were made with the same matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .._files.atomic import make_folder, write_text_atomic
from .store import read_cells, read_variants
from .summary import MEAN_ROW, summarize
from .tables import ARM_LABELS, Table, to_markdown

__all__ = ["host_table", "write_host_table"]

_O_ARMS = ("oa", "full-o")


def _cell(value: float | None, undefined: bool) -> str:
    if undefined:
        return "undefined (base RMSE 0)"
    return "—" if value is None else f"{value:+.3f}%"


def host_table(folders: Sequence[str | Path]) -> Table:
    """ΔRMSE % = 100·(RMSE_arm − RMSE_base)/RMSE_base, mean over cells, of each O arm, one row
    per (folder, τ); the host is the one the folder's run recorded (TabPFN when none)."""
    rows = []
    for folder in folders:
        settings, datasets, cells = read_cells([folder])
        summary = summarize(cells, datasets, read_variants([folder], cells))
        for tau in summary.taus:
            found = [summary.row(MEAN_ROW, arm, tau) for arm in _O_ARMS]
            first = next((r for r in found if r), None)
            if first is None:
                continue
            rows.append([settings.get("host", "tabpfn"), Path(folder).name, f"{tau:g}",
                         str(first.n_seeds),
                         *(_cell(r.d_rmse_pct, r.d_rmse_undefined) if r else "—"
                           for r in found)])
    header = ["Host", "Run", "τ", "Cells", *(f"{ARM_LABELS[a]} ΔRMSE %" for a in _O_ARMS)]
    return Table("ΔRMSE % against base across hosts (means over cells)", header, rows,
                 ["Each row: one run folder's mean over its (dataset, seed) cells."])


def write_host_table(folders: Sequence[str | Path], out: str | Path) -> Path:
    """:func:`host_table` as Markdown at ``out/hosts.md``."""
    folder = make_folder(out, f"--out {out}")
    return write_text_atomic(folder / "hosts.md", to_markdown([host_table(folders)]))
