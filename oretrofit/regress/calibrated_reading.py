"""The generated reading of a calibration study: per-site τ of each calibrated spec, whether the
calibrated specs keep each O arm within ``TOLERANCE_PCT`` of base RMSE, the τ grid beside them,
and the site families ranked by the RMSE they cost.

Every figure is read from the specs and the summaries of the run folders (:func:`summarize`):

    ΔRMSE %(d, variant) = mean over seeds of 100 · (RMSE(variant) / RMSE(base) − 1)
    criterion met       ⇔ |ΔRMSE %(d, calibrated spec of arm a)| ≤ TOLERANCE_PCT on every d
    largest safe τ      = the largest grid τ with |ΔRMSE %(d, a, τ)| ≤ TOLERANCE_PCT on every d

Nothing here is typed in: re-running the study rewrites the reading.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from .._files.markdown import pipe_table
from .summary import MEAN_ROW, Summary
from .variant_tables import ablation_tables

__all__ = ["TOLERANCE_PCT", "NEAR_IDENTITY_TAU", "calibrated_reading"]

TOLERANCE_PCT = 1.0          # the criterion: within 1 % of base RMSE on every dataset
NEAR_IDENTITY_TAU = 1e-8     # the paper's global τ the calibrated τ are compared with
_LABELS = {"oa": "OA", "full-o": "Full-O"}


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3f}%"


def _tau_summary(arm: str, spec: Mapping[str, Any]) -> str:
    taus = list(spec["site_tau"].values())
    low = min(taus)
    return (f"* {_LABELS[arm]}: {len(taus)} sites, τ min {low:.3g} · median "
            f"{statistics.median(taus):.3g} · max {max(taus):.3g}; the smallest is "
            f"{math.log10(low / NEAR_IDENTITY_TAU):.1f} orders of magnitude above "
            f"τ = {NEAR_IDENTITY_TAU:g}.")


def _site_table(specs: Mapping[str, Mapping[str, Any]]) -> str:
    arms = list(specs)
    order: list[str] = []
    for spec in specs.values():
        order += [s for s in spec["sites"] if s not in order]
    rows = [[f"`{site}`", *(f"{specs[a]['site_tau'][site]:.3g}" if site in specs[a]["site_tau"]
                            else "—" for a in arms)] for site in order]
    return pipe_table(["Site", *(f"{_LABELS[a]} τ" for a in arms)], rows)


def _variant_key(summary: Summary, arm: str) -> str:
    found = [k for k, r in summary.variants.items()
             if r.get("kind") == "calibrated" and k.startswith(f"{arm}/")]
    if len(found) != 1:
        raise ValueError(f"the run folder holds {len(found)} calibrated variant(s) of arm {arm}; "
                         "run it with exactly one --tau-spec per arm")
    return found[0]


def _largest_safe_tau(summary: Summary, arm: str) -> float | None:
    safe = [t for t in summary.taus
            if all((r := summary.row(d, arm, t)) is not None and r.d_rmse_pct is not None
                   and abs(r.d_rmse_pct) <= TOLERANCE_PCT for d in summary.datasets)]
    return max(safe, default=None)


def _contrast_tau(summary: Summary) -> float:
    """The global τ shown beside the calibrated specs: the paper's stress τ = 1 when run."""
    return 1.0 if 1.0 in summary.taus else max(summary.taus)


def _acceptance(summary: Summary, arms: Sequence[str]) -> list[str]:
    keys = {arm: _variant_key(summary, arm) for arm in arms}
    rows, verdicts = [], []
    contrast = _contrast_tau(summary)
    for spec in [*summary.datasets, MEAN_ROW]:
        found = {arm: summary.variant_row(spec, keys[arm]) for arm in arms}
        stress = {arm: summary.row(spec, arm, contrast) for arm in arms}
        name = (summary.names[spec] + (" †" if found[arms[0]] and found[arms[0]].standin_for
                                       else "")) if spec != MEAN_ROW else MEAN_ROW
        rows.append([name, *(_pct(found[a].d_rmse_pct if found[a] else None) for a in arms),
                     *(_pct(stress[a].d_rmse_pct if stress[a] else None) for a in arms)])
    for arm in arms:
        values = [r.d_rmse_pct for d in summary.datasets
                  if (r := summary.variant_row(d, keys[arm])) is not None]
        met = len(values) == len(summary.datasets) and all(
            v is not None and abs(v) <= TOLERANCE_PCT for v in values)
        worst = max((abs(v) for v in values if v is not None), default=None)
        safe = _largest_safe_tau(summary, arm)
        verdicts.append(
            f"* {_LABELS[arm]}: {'met' if met else 'NOT met'} — the calibrated spec's largest "
            f"|ΔRMSE %| over the {len(summary.datasets)} datasets is "
            f"{'—' if worst is None else f'{worst:.3f}%'} (criterion ≤ {TOLERANCE_PCT:g}%). "
            "The largest single τ of the grid that stays within it on every dataset is "
            f"{'none' if safe is None else f'{safe:g}'}.")
    top = f"{contrast:g}"
    table = pipe_table(["Dataset", *(f"{_LABELS[a]} calibrated ΔRMSE %" for a in arms),
                        *(f"{_LABELS[a]} τ = {top} ΔRMSE %" for a in arms)], rows)
    return [table, "", *verdicts]


def _ranking(ablation: Summary) -> list[str]:
    lines = []
    for title, header, rows in ablation_tables(ablation):
        lines += [f"**{title}**", "", pipe_table(header, rows), ""]
    for arm in (a for a in ablation.arms if a != "base"):
        stress = {r["stress_tau"] for r in ablation.variants.values()
                  if r.get("kind") == "ablation" and r["arm"] == arm}
        for tau in sorted(stress & set(ablation.taus)):
            row = ablation.row(MEAN_ROW, arm, tau)
            lines.append(f"* Every site of {_LABELS[arm]} at τ = {tau:g} at once: ΔRMSE % "
                         f"{_pct(row.d_rmse_pct if row else None)} (mean over cells).")
    return [*lines, ""] if lines and lines[-1] else lines


def calibrated_reading(specs: Mapping[str, Mapping[str, Any]], curve: Summary,
                       ablation: Summary, provenance: Sequence[str]) -> str:
    """The Markdown reading (module docstring). ``specs``: arm -> calibrated spec; ``curve``:
    the summary of the τ-grid folder run with those specs (``--tau-spec``); ``ablation``: the
    summary of the site-family ablation folder; ``provenance``: lines naming how it was made."""
    arms = [a for a in ("oa", "full-o") if a in specs]
    first = specs[arms[0]]["calibration"]
    data = first["data"]
    standins = sorted({(r.name, r.standin_for) for r in curve.rows if r.standin_for})
    lines = ["## Calibrated τ on the demo host (generated reading)", "",
             f"Calibrated with δ = {first['delta']:g}, q = {first['quantile']:g} "
             f"(τ_site = δ/(1−δ)·Q_q(‖h‖²)) on the train rows of {len(data['splits'])} "
             f"(dataset, seed) splits ({data['rows']} rows); scored on their test rows.", "",
             "### Per-site τ", "", *(_tau_summary(a, specs[a]) for a in arms), "",
             _site_table({a: specs[a] for a in arms}), "",
             f"### Within {TOLERANCE_PCT:g} % of base RMSE?", "",
             f"Means over seeds {', '.join(map(str, sorted({s['seed'] for s in data['splits']})))}"
             f" of the change against base; the last columns are one global τ = "
             f"{_contrast_tau(curve):g} at every site, for contrast.", "",
             *_acceptance(curve, arms), "",
             *(f"† {name}: offline stand-in for {spec}." for name, spec in standins),
             *([""] if standins else []),
             "### Where the host breaks: site families at the stress τ", "",
             *_ranking(ablation),
             "### Provenance", "", *provenance, ""]
    return "\n".join(lines)
