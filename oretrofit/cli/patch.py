"""`oretrofit patch`: retrofit a TabPFN v3 checkpoint (regressor or classifier), print its sites,
write a patched artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from . import choices
from .errors import fail
from .output import print_json
from .specs import read_spec_option

SCHEMA_VERSION = 1


def parse_site_tau(values: list[str] | None) -> dict[str, float]:
    """``['re:icl\\..*=1e-6', 'te.*=1e-4']`` -> {pattern: τ}; the last '=' separates τ. A
    pattern given twice is refused (one τ would silently replace the other)."""
    out: dict[str, float] = {}
    for item in values or []:
        pattern, sep, tau = item.rpartition("=")
        try:
            if not sep or not pattern:
                raise ValueError
            value = float(tau)
        except ValueError:
            raise typer.BadParameter(f"{item!r} is not PATTERN=TAU (e.g. 're:icl\\..*=1e-6')",
                                     param_hint="--site-tau") from None
        if pattern in out:
            raise typer.BadParameter(f"pattern {pattern!r} is given twice (τ {out[pattern]:g} "
                                     f"and {value:g}); give each pattern one τ",
                                     param_hint="--site-tau")
        out[pattern] = value
    return out


def _receivers_text(receivers: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in receivers.items()) or "-"


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    how = (f"spec {Path(summary['spec_file']).name} (arm {summary['arm']})" if summary["spec_file"]
           else f"arm {summary['arm']} · τ={summary['tau']:g}")
    table = Table(title=f"TabPFN v3 {summary['task']} · {how} · {summary['weights']}")
    for column in ("site", "kind", "τ", "learned receivers: presence"):
        table.add_column(column)
    for row in summary["sites"]:
        table.add_row(row["site"], row["kind"], f"{row['tau']:g}",
                      _receivers_text(row["receivers"]))
    console = Console()
    console.print(table)
    console.print(f"{len(summary['sites'])} site(s); checkpoint {summary['model_path']} "
                  f"(sha256 {summary['checkpoint_sha256'][:12]}…)"
                  + (f"; artifact {summary['out']}" if summary["out"] else "")
                  + ("; dry run, nothing patched" if summary["dry_run"] else ""))


def _spec_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The retrofit arguments a patch spec records (see :func:`oretrofit.apply_spec`)."""
    return {"arm": spec["arm"], "tau": spec["tau"], "eps": spec["eps"],
            "site_tau": spec.get("site_tau") or {}, "targets": spec.get("targets"),
            "exclude": spec.get("exclude")}


def run_patch(model_path: str | None, arm: str, tau: float, eps: float,
              site_tau: dict[str, float], targets: list[str] | None, exclude: list[str] | None,
              dry_run: bool, out: Path | None, spec_file: Path | None = None) -> dict[str, Any]:
    """Plan (dry run) or apply the retrofit and write the artifact; return the JSON summary.

    With ``spec_file`` (a saved or calibrated patch spec) the retrofit is that spec's, applied
    with :func:`oretrofit.apply_spec` (which refuses a spec that does not fit the checkpoint),
    and the other retrofit arguments are ignored; the artifact records the spec's own entries
    (its ``calibration`` record among them) with the checkpoint's SHA-256.
    """
    import oretrofit
    from oretrofit._files.provenance import environment, portable
    from oretrofit._surgery.registry import site_row
    from oretrofit.tabpfn import (build_model, checkpoint_sha256, load_checkpoint,
                                  resolve_model_path, weights_label, write_patched_artifact)
    from oretrofit.hosts.tabpfn.checkpoints import checkpoint_task
    from oretrofit.hosts.tabpfn.estimators import check_spec_checkpoint

    path = resolve_model_path(model_path)
    checkpoint = load_checkpoint(path)
    model, _, _ = build_model(checkpoint)
    sha = checkpoint_sha256(path)
    given = read_spec_option(spec_file) if spec_file is not None else None
    if given is not None:
        check_spec_checkpoint(given, path)
        settings = _spec_settings(given)
    else:
        settings = dict(arm=arm, tau=tau, eps=eps, site_tau=site_tau, targets=targets,
                        exclude=exclude)
    spec = None
    if dry_run and given is None:
        plan = oretrofit.plan_retrofit(model, **settings)
        sites = [site_row(s, c, "planned") for s, c in plan.entries]
    else:
        result = (oretrofit.apply_spec(model, given) if given is not None
                  else oretrofit.retrofit(model, **settings))
        sites = result.report()
        if dry_run:                       # a spec is checked against the model in full
            result.revert()
        else:
            spec = {**(given or {}), **result.spec(), "source_checkpoint_sha256": sha,
                    "weights": weights_label(checkpoint)}
            if out is not None:
                write_patched_artifact(out, path, spec)
    return {"schema_version": SCHEMA_VERSION, "command": "patch", "model_path": portable(path),
            "checkpoint_sha256": sha, "weights": weights_label(checkpoint),
            "task": checkpoint_task(checkpoint), **settings, "dry_run": dry_run,
            "spec_file": None if spec_file is None else portable(spec_file),
            "out": None if dry_run or out is None else portable(out), "sites": sites, "spec": spec,
            "environment": environment()}


def register(app: typer.Typer) -> None:
    """Add the ``patch`` verb to ``app``."""

    @app.command("patch")
    def patch(
        arm: str = typer.Option(None, "--arm", help="base, oa or full-o (default full-o)",
                                callback=choices.ARMS),
        tau: float = typer.Option(None, "--tau", help="presence scale τ > 0 (default 1e-8)"),
        eps: float = typer.Option(None, "--eps", help="OAttention ε ≥ 0 (default 0: the limit ε → 0⁺, "
                                "exact on the host)"),
        model_path: str = typer.Option(None, "--model-path", help="TabPFN v3 checkpoint "
                                       "(regressor or classifier), 'demo' "
                                       "(trained demo host, random weights when not installed) "
                                       "or 'random'; default: tabpfn's download cache"),
        site_tau: list[str] = typer.Option(None, "--site-tau", help="PATTERN=TAU per-site τ "
                                           "(glob or 're:' regex; repeatable)"),
        target: list[str] = typer.Option(None, "--target", help="only sites matching (repeatable)"),
        exclude: list[str] = typer.Option(None, "--exclude",
                                          help="drop sites matching (repeatable)"),
        spec: Path = typer.Option(None, "--spec", help="retrofit with a saved or calibrated "
                                  "patch spec (JSON, e.g. from `oretrofit calibrate --out`) "
                                  "instead of --arm/--tau/--eps/--site-tau/--target/--exclude"),
        dry_run: bool = typer.Option(False, "--dry-run", help="plan and print; patch and write "
                                     "nothing"),
        json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
        out: Path = typer.Option(None, "--out", help="write the patched artifact (a *v3*.ckpt or "
                                 ".safetensors carrying its patch spec)"),
    ) -> None:
        """Retrofit a TabPFN v3 host (regressor or classifier) with an arm at τ, or with a patch
        spec, and list every patched site with its τ."""
        from oretrofit._operators.presence import EPS_RETROFIT
        from oretrofit._surgery.registry import RetrofitError
        overrides = parse_site_tau(site_tau)
        if spec is not None:
            settings = (("--arm", arm), ("--tau", tau), ("--eps", eps), ("--site-tau", site_tau),
                        ("--target", target), ("--exclude", exclude))
            given = [flag for flag, value in settings if value not in (None, [], ())]
            if given:
                raise fail(f"--spec sets the arm and every site's τ itself; drop "
                           f"{', '.join(given)} (or drop --spec)")
        ignored = [flag for flag, value in (("--tau", tau), ("--eps", eps),
                                            ("--site-tau", site_tau)) if value not in (None, [])]
        if arm == "base" and ignored:
            raise fail(f"arm 'base' patches no site, so {', '.join(ignored)} would be ignored; "
                       "drop them, or choose --arm oa or full-o")
        try:
            summary = run_patch(model_path, arm or "full-o", 1e-8 if tau is None else tau,
                                EPS_RETROFIT if eps is None else eps, overrides, target or None,
                                exclude or None, dry_run, out, spec)
        except (RetrofitError, ValueError) as err:
            raise fail(err) from None
        if json_out:
            print_json(summary)
        else:
            _print_table(summary)
