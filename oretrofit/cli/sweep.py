"""``oretrofit sweep operators``: the operator contract sweep (paper Tables 1 and 6, B.5)."""

from __future__ import annotations

from pathlib import Path
import typer
from rich.console import Console

from .choices import one_of
from .errors import fail
from .output import json_text

__all__ = ["register"]

sweep_app = typer.Typer(no_args_is_help=True, help="Measure the operators' contracts and write receipts.")
_err = Console(stderr=True)


@sweep_app.command("operators")
def operators(
    device: str = typer.Option("cpu", "--device", help="Where to run the operators: cpu or cuda",
                               callback=one_of(lambda: ("cpu", "cuda"))),
    out: Path = typer.Option(Path("results"), "--out", help="Folder for operators.json and operators.md"),
    as_json: bool = typer.Option(False, "--json", help="Print the receipt as one JSON object"),
    quick: bool = typer.Option(False, "--quick", help="One seed and one shape per table (a smoke run)"),
) -> None:
    """Max errors per property over seeds × shapes × dtypes; writes a JSON receipt and a table."""
    import torch

    from .._files.atomic import make_folder, write_text_atomic
    from .._files.lock import receipt_lock
    from .._files.written import claim
    from .._files.provenance import environment, write_json_atomic
    from ..sweep import SweepConfig, operators_markdown, run_operator_sweep

    if device == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter("--device cuda was requested but torch sees no CUDA device; "
                                 "use --device cpu")
    make_folder(out, f"--out {out}")               # a file in the way, before the sweep runs
    stem = "operators-quick" if quick else "operators"
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    try:
        with receipt_lock(json_path), _err.status("operator sweep") as status:
            claim(out, [json_path.name, md_path.name])     # never a file oretrofit did not write
            receipt = run_operator_sweep(SweepConfig(device=device, quick=quick), progress=lambda
                                         msg: status.update(f"operator sweep: {msg}"))
            receipt["environment"] = environment(device)
            table = operators_markdown(receipt)
            write_json_atomic(json_path, receipt)
            write_text_atomic(md_path, table)
    except (RuntimeError, OSError) as err:          # a busy or full --out
        raise fail(err) from None
    _err.print(f"wrote {json_path} and {md_path} in {receipt['seconds']:.1f} s")
    typer.echo(json_text(receipt) if as_json else table)


def register(app: typer.Typer) -> None:
    """Add the ``sweep`` group to ``app``."""
    app.add_typer(sweep_app, name="sweep")
