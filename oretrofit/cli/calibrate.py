"""`oretrofit calibrate`: per-site τ for a TabPFN v3 host from regression data, as a patch spec."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``calibrate`` verb to ``app``."""

    @app.command("calibrate")
    def calibrate(
        out: Path = typer.Option(..., "--out", help="where to write the calibrated patch spec (JSON)"),
        model_path: str = typer.Option(None, "--model-path", help="TabPFN v3 checkpoint, 'demo' or "
                                       "'random'; default: tabpfn's download cache"),
        datasets: list[str] = typer.Option(..., "--dataset", help="calibration dataset spec, e.g. "
                                           "sklearn:diabetes (repeatable)"),
        seeds: list[int] = typer.Option([11], "--seed", help="split seeds whose train rows are the "
                                        "calibration data (repeatable)"),
        arm: str = typer.Option("full-o", "--arm", help="oa or full-o"),
        delta: float = typer.Option(1e-3, "--delta", help="largest gate δ a carrier at the quantile "
                                    "may get (presence ≥ 1−δ)"),
        quantile: float = typer.Option(0.01, "--quantile", help="low quantile q of each site's "
                                       "carriers ‖h‖² that keeps presence ≥ 1−δ"),
        openml_cache: Path = typer.Option(None, "--openml-cache", help="OpenML cache folder"),
        offline_standins: bool = typer.Option(False, "--offline-standins", help="load the offline "
                                              "stand-ins for OpenML datasets (as regress does)"),
    ) -> None:
        """Choose τ per site: τ_site = δ/(1−δ)·Q_q(‖h‖²) of its carriers on the train rows."""
        from oretrofit._registry import RetrofitError
        from oretrofit.regress.calibrate import calibrate_tabpfn
        from oretrofit.regress.data import OFFLINE_STANDINS, load_datasets

        if len(set(seeds)) != len(seeds) or len(set(datasets)) != len(datasets):
            typer.echo("error: --seed and --dataset values must not repeat", err=True)
            raise typer.Exit(2)
        try:
            loaded = load_datasets(datasets, openml_cache=openml_cache,
                                   standins=OFFLINE_STANDINS if offline_standins else None)
            spec = calibrate_tabpfn(model_path, list(loaded.values()), seeds, arm=arm, delta=delta, quantile=quantile)
        except (RetrofitError, ValueError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(spec, indent=2))
        taus = spec["site_tau"].values()
        typer.echo(f"{len(spec['site_tau'])} site(s), τ from {min(taus):.3g} to {max(taus):.3g}; "
                   f"spec written to {out}")
