"""`oretrofit reproduce table2|table7|matrix|tables|study|operators|hosts`: the paper's runners in
one group. Each verb delegates to the runner's own command (`regress`, `tables`, `experiment`,
`sweep operators`) or, for `hosts`, to `python -m oretrofit.sweep.hosts`."""

from __future__ import annotations

from pathlib import Path

import typer

from ._aliases import fixed
from .experiment import experiment
from .regress import paper_table, regress, tables
from .sweep import operators


def hosts(
    out: Path = typer.Option(Path("results"), "--out", help="Folder for hosts.json and hosts.md"),
) -> None:
    """τ→0 equivalence, null insertion and mask-free padding on MiniLM and SmolLM2 (offline)."""
    from oretrofit.sweep.hosts import main

    main(["--out", str(out)])


def register(app: typer.Typer) -> None:
    """Add the ``reproduce`` group to ``app``."""
    group = typer.Typer(no_args_is_help=True, help="Rerun the paper's tables and studies and write "
                                                   "their receipts.")
    group.command("table2", help="The paper's Table 2: 6 OpenML datasets × seeds 11, 23, 37 × "
                                 "base/oa/full-o at τ = 1e-8.")(fixed(paper_table, table="table2"))
    group.command("table7", help="The paper's Table 7: Table 2's matrix at τ = 1 (same --out "
                                 "reuses the base cells).")(fixed(paper_table, table="table7"))
    group.command("matrix")(regress)
    group.command("tables")(tables)
    group.command("study")(experiment)
    group.command("operators")(operators)
    group.command("hosts")(hosts)
    app.add_typer(group, name="reproduce")
