"""`oretrofit check MODEL`: retrofit a transformers model and measure the paper's contracts on it.

MODEL is a local transformers folder (``save_pretrained`` output, loaded with ``AutoModel``
offline) or one of the shipped pretrained weights: ``minilm`` (all-MiniLM-L6-v2) or ``smollm2``
(SmolLM2-135M-Instruct); see :mod:`oretrofit.hosts.transformers.models`. The contracts and their
limits (τ→0 agreement and exact revert per arm, null insertion, mask-free padding) are
:mod:`oretrofit.hosts.transformers.check`'s, which measures them (``oretrofit.transformers.check``
in Python).

With ``--spec FILE`` (a saved or calibrated patch spec, e.g. ``oretrofit calibrate --out``) null
insertion and padding run under that spec, each site at its own τ, and τ→0 agreement is measured
for the spec's arm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from . import choices
from .errors import fail
from .output import print_json
from .specs import read_spec_option

SCHEMA_VERSION = 1


def run_check(name: str, arms: list[str], tau: float | None,
              spec_file: Path | None = None) -> dict[str, Any]:
    """Measure every contract (:func:`oretrofit.hosts.transformers.check.check`); ``holds`` is
    True when all are within their limits.

    With ``spec_file``, ``arms`` and ``tau`` are the spec's: pass ``[]`` and None.
    """
    from oretrofit._files.provenance import environment, portable
    from oretrofit.hosts.transformers.check import check
    from oretrofit.hosts.transformers.contracts import require_finite_weights
    from oretrofit.hosts.transformers.models import load_model
    spec = read_spec_option(spec_file) if spec_file is not None else None
    if spec is not None and spec["arm"] == "base":
        raise ValueError(f"the spec {spec_file} has arm 'base': it patches nothing, so there "
                         "is nothing to check; pass a spec of arm oa or full-o")
    model = load_model(name)
    require_finite_weights(model, name)
    summary = check(model, arms, tau, spec)
    return {"schema_version": SCHEMA_VERSION, "command": "check", "model": name,
            "class": type(model).__name__, "tau": tau,
            "spec": None if spec is None else {"file": portable(spec_file),
                                               "site_tau": spec.get("site_tau") or {}},
            **summary, "environment": environment()}


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    limits = summary["limits"]
    table = Table(title=f"{summary['class']} ({summary['model']}) · host {summary['host']}")
    for column in ("contract", "measured", "limit", "holds"):
        table.add_column(column)
    for a in summary["agreement"]:
        table.add_row(f"τ→0 agreement, {a['arm']} ({a['sites']} sites, τ = ε = {a['tau']:g})",
                      f"{a['relative_max_diff']:.3g}", f"≤ {limits['agreement']:g}",
                      _mark(a["relative_max_diff"] <= limits["agreement"]))
        table.add_row(f"revert() bit-identical, {a['arm']}", str(a["revert_bit_identical"]),
                      "True", _mark(a["revert_bit_identical"]))
    n, u = summary["null_insertion"], summary["null_insertion_unpatched"]
    label = (f"{summary['insertion_arm']}, spec {Path(summary['spec']['file']).name}"
             if summary["spec"] else f"{summary['insertion_arm']}, τ = {summary['tau']:g}")
    table.add_row(f"null insertion ({n['where']}), old-state drift, {label}",
                  f"{n['old_max_delta']:.3g} (unpatched {u['old_max_delta']:.3g})",
                  f"≤ {limits['drift']:g}", _mark(n["old_max_delta"] <= limits["drift"]))
    table.add_row(f"null insertion, inserted max |h| over {n['layers']} states, {label}",
                  f"{n['inserted_max_abs']:.3g} (unpatched {u['inserted_max_abs']:.3g})", "0",
                  _mark(n["inserted_max_abs"] == 0))
    padding = summary["padding_max_delta"]
    if padding is not None:
        table.add_row(f"mask-free padding, {label}", f"{padding:.3g}", f"≤ {limits['padding']:g}",
                      _mark(padding <= limits["padding"]))
    console = Console()
    console.print(table)
    console.print("all contracts hold" if summary["holds"] else "some contracts do not hold")


def register(app: typer.Typer) -> None:
    """Add the ``check`` verb to ``app``."""

    @app.command("check")
    def check(
        model: str = typer.Argument(..., help="a local transformers folder, or minilm / smollm2"),
        arm: str = typer.Option(None, "--arm", help="oa or full-o (default: both)",
                                callback=choices.O_ARMS),
        tau: float = typer.Option(None, "--tau", help="τ of null insertion and padding "
                                  "(default 1e-6)"),
        spec: Path = typer.Option(None, "--spec", help="run null insertion and padding under a "
                                  "saved or calibrated patch spec (JSON: per-site τ) instead of "
                                  "--arm/--tau; agreement runs for the spec's arm"),
        json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Retrofit a transformers model and print the paper's contracts on it (exit 1 when one
        does not hold, 2 when the model cannot be retrofitted)."""
        from oretrofit._surgery.registry import RetrofitError
        given = [flag for flag, value in (("--arm", arm), ("--tau", tau)) if value is not None]
        if spec is not None and given:
            raise fail(f"--spec sets the arm and every site's τ itself; drop "
                       f"{', '.join(given)} (or drop --spec)")
        try:
            summary = (run_check(model, [], None, spec) if spec is not None else
                       run_check(model, [arm] if arm else ["oa", "full-o"],
                                 1e-6 if tau is None else tau))
        except (RetrofitError, ValueError, OSError) as err:
            raise fail(err) from None
        if json_out:
            print_json(summary)
        else:
            _print_table(summary)
        if not summary["holds"]:
            raise typer.Exit(1)
