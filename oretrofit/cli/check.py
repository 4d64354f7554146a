"""`oretrofit check MODEL`: retrofit a transformers model and measure the paper's contracts on it.

MODEL is a local transformers folder (``save_pretrained`` output, loaded with ``AutoModel``
offline) or one of the shipped pretrained weights: ``minilm`` (all-MiniLM-L6-v2) or ``smollm2``
(SmolLM2-135M-Instruct). Contracts (relative max differences, thresholds in ``LIMITS``):

    τ→0 agreement     every hidden state patched at τ = ε = 1e-12 vs unpatched, per arm;
                      revert() bit-identical; state_dict keys unchanged
    null insertion    2 zero carriers inserted (old position ids kept) under the arm at τ:
                      old states' drift, inserted states exactly 0 in every layer
    mask-free padding right zero padding with no attention mask vs each sequence alone
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

SCHEMA_VERSION = 1
SHIPPED = ("minilm", "smollm2")
LIMITS = {"agreement": 1e-4, "drift": 1e-4, "padding": 1e-4}


def load_model(name: str) -> Any:
    """A shipped model by name, or ``AutoModel`` from a local folder (offline), in eval mode."""
    from oretrofit.hosts_report import load_minilm, load_smollm2
    if name in SHIPPED:
        return (load_minilm if name == "minilm" else load_smollm2)()[0]
    path = Path(name)
    if not (path / "config.json").is_file():
        raise ValueError(f"{name!r} is neither a transformers folder (no config.json) nor one of "
                         f"{', '.join(SHIPPED)}")
    from transformers import AutoModel
    return AutoModel.from_pretrained(path, local_files_only=True).eval()


def run_check(name: str, arms: list[str], tau: float) -> dict[str, Any]:
    """Measure every contract; ``holds`` is True when all are within ``LIMITS``."""
    import oretrofit
    from oretrofit._provenance import environment
    from oretrofit.patches.transformers_zoo import example_inputs
    from oretrofit.transformers_contracts import agreement, null_insertion, padding_delta
    model = load_model(name)
    inputs = example_inputs(model, batch=2, tokens=12)
    agreements = [agreement(model, inputs, arm) for arm in arms]
    insertion_arm = "full-o" if "full-o" in arms else arms[-1]
    unpatched = null_insertion(model, inputs)
    sequences = ([inputs["input_ids"][0].tolist(), inputs["input_ids"][1, :7].tolist()]
                 if "input_ids" in inputs else [])
    with oretrofit.retrofitted(model, insertion_arm, tau) as r:
        inserted = null_insertion(model, inputs)
        padding = padding_delta(model, sequences) if sequences else None
        host = r.plan.host
    holds = (all(a["relative_max_diff"] <= LIMITS["agreement"] and a["revert_bit_identical"]
                 and a["state_dict_keys_unchanged"] for a in agreements)
             and inserted["inserted_max_abs"] == 0 and inserted["old_max_delta"] <= LIMITS["drift"]
             and (padding is None or padding <= LIMITS["padding"]))
    return {"schema_version": SCHEMA_VERSION, "command": "check", "model": name,
            "class": type(model).__name__, "host": host, "tau": tau, "insertion_arm":
            insertion_arm, "agreement": agreements, "null_insertion": inserted,
            "null_insertion_unpatched": unpatched, "padding_max_delta": padding,
            "limits": LIMITS, "holds": holds, "environment": environment()}


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"{summary['class']} ({summary['model']}) · host {summary['host']}")
    for column in ("contract", "measured", "limit", "holds"):
        table.add_column(column)
    for a in summary["agreement"]:
        table.add_row(f"τ→0 agreement, {a['arm']} ({a['sites']} sites, τ = ε = {a['tau']:g})",
                      f"{a['relative_max_diff']:.3g}", f"≤ {LIMITS['agreement']:g}",
                      _mark(a["relative_max_diff"] <= LIMITS["agreement"]))
        table.add_row(f"revert() bit-identical, {a['arm']}", str(a["revert_bit_identical"]),
                      "True", _mark(a["revert_bit_identical"]))
    n, u = summary["null_insertion"], summary["null_insertion_unpatched"]
    label = f"{summary['insertion_arm']}, τ = {summary['tau']:g}"
    table.add_row(f"null insertion ({n['where']}), old-state drift, {label}",
                  f"{n['old_max_delta']:.3g} (unpatched {u['old_max_delta']:.3g})",
                  f"≤ {LIMITS['drift']:g}", _mark(n["old_max_delta"] <= LIMITS["drift"]))
    table.add_row(f"null insertion, inserted max |h| over {n['layers']} states, {label}",
                  f"{n['inserted_max_abs']:.3g} (unpatched {u['inserted_max_abs']:.3g})", "0",
                  _mark(n["inserted_max_abs"] == 0))
    padding = summary["padding_max_delta"]
    if padding is not None:
        table.add_row(f"mask-free padding, {label}", f"{padding:.3g}", f"≤ {LIMITS['padding']:g}",
                      _mark(padding <= LIMITS["padding"]))
    console = Console()
    console.print(table)
    console.print("all contracts hold" if summary["holds"] else "some contracts do not hold")


def register(app: typer.Typer) -> None:
    """Add the ``check`` verb to ``app``."""

    @app.command("check")
    def check(
        model: str = typer.Argument(..., help="a local transformers folder, or minilm / smollm2"),
        arm: str = typer.Option(None, "--arm", help="oa or full-o (default: both)"),
        tau: float = typer.Option(1e-6, "--tau", help="τ of null insertion and padding"),
        json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Retrofit a transformers model and print the paper's contracts on it (exit 1 when one
        does not hold, 2 when the model cannot be retrofitted)."""
        from oretrofit._registry import RetrofitError
        if arm not in (None, "oa", "full-o"):
            raise typer.BadParameter("choose oa or full-o", param_hint="--arm")
        try:
            summary = run_check(model, [arm] if arm else ["oa", "full-o"], tau)
        except (RetrofitError, ValueError, OSError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
        if json_out:
            print(json.dumps(summary, default=str))
        else:
            _print_table(summary)
        if not summary["holds"]:
            raise typer.Exit(1)
