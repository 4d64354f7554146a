"""Tables of a τ grid and of per-site τ variants: the ΔRMSE %/ΔR² curve against τ, each variant's
change against base, and the site-family ablation ranked by the RMSE each family costs.

All entries restate rows of the :class:`Summary` (means over seeds of the per-seed changes
against base, and the mean over cells); nothing is computed here but the ranking:

    rank families of arm a by  ΔRMSE %(mean over cells, family at stress τ)   (largest first)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from .summary import MEAN_ROW, Row, Summary

__all__ = ["CURVE_MIN_TAUS", "curve_tables", "variant_table", "ablation_tables", "tau_range"]

CURVE_MIN_TAUS = 3          # with two τ the per-τ Table 7 layouts already are the curve
_ARM_LABELS = {"base": "Base", "oa": "OA", "full-o": "Full-O"}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    if value is None:
        return "—"
    return "undefined" if math.isnan(value) else f"{value:{spec}}{suffix}"


def _d_rmse(row: Row | None) -> str:
    if row is None:
        return "—"
    return "undefined (base RMSE 0)" if row.d_rmse_undefined else _fmt(row.d_rmse_pct, "+.3f", "%")


def _name(summary: Summary, spec: str, row: Row | None) -> str:
    if spec == MEAN_ROW:
        return f"mean over {row.n_seeds} cells" if row else MEAN_ROW
    return summary.names[spec] + (" †" if row and row.standin_for else "")


def tau_range(record: Mapping[str, Any]) -> str:
    """``min–max`` of a variant's per-site τ (its default τ when it has none); an ablation's
    stress τ on its family's sites and its τ elsewhere."""
    values = list((record.get("site_tau") or {}).values()) or [record.get("tau")]
    if record.get("kind") == "ablation":
        return (f"{record['stress_tau']:g} on {len(values)} site(s), {record['tau']:g} "
                "elsewhere")
    low, high = min(values), max(values)
    return f"{low:.3g}" if low == high else f"{low:.3g}–{high:.3g}"


def curve_tables(summary: Summary) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(title, header, rows)`` of ΔRMSE % and of ΔR² against every τ, one row per O arm and
    dataset (and the mean over cells); empty below :data:`CURVE_MIN_TAUS` τ values."""
    arms = [a for a in summary.arms if a != "base"]
    if len(summary.taus) < CURVE_MIN_TAUS or not arms or "base" not in summary.arms:
        return []
    header = ["Arm", "Dataset", *(f"τ={t:g}" for t in summary.taus)]
    shown: list[tuple[str, Callable[[Row | None], str]]] = [
        ("ΔRMSE %", _d_rmse), ("ΔR²", lambda r: _fmt(r.d_r2 if r else None, "+.4f"))]
    tables = []
    for what, show in shown:
        rows = []
        for arm in arms:
            for spec in [*summary.datasets, MEAN_ROW]:
                found = [summary.row(spec, arm, t) for t in summary.taus]
                if any(found):
                    first = next(r for r in found if r)
                    rows.append([_ARM_LABELS[arm], _name(summary, spec, first),
                                 *(show(r) for r in found)])
        tables.append((f"{what} against τ (means over seeds; the curve)", header, rows))
    return tables


def variant_table(summary: Summary) -> tuple[str, list[str], list[list[str]]] | None:
    """One row per variant and dataset (and the mean over cells): its per-site τ range, mean
    RMSE and R², and its change against base over the same seeds."""
    if not summary.variants:
        return None
    header = ["Variant", "Arm", "Site τ", "Dataset", "Seeds", "RMSE", "R²", "ΔRMSE %", "ΔR²"]
    rows = []
    for key, record in sorted(summary.variants.items(),
                              key=lambda item: (item[1].get("kind") == "ablation", item[0])):
        arm, _, name = key.partition("/")
        for spec in [*summary.datasets, MEAN_ROW]:
            row = summary.variant_row(spec, key)
            if row is not None:
                rows.append([name, _ARM_LABELS[arm], tau_range(record), _name(summary, spec, row),
                             str(row.n_seeds), _fmt(row.rmse, ".6g"), _fmt(row.r2, ".6f"),
                             _d_rmse(row), _fmt(row.d_r2, "+.6f")])
    return ("Per-site τ variants: change against base, means over seeds (same seeds as base)",
            header, rows)


def ablation_tables(summary: Summary) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per O arm (and stress/near-identity τ pair): its site families ranked by the mean-over-cells
    ΔRMSE % they cost when gated at the stress τ alone (every other site at the near τ)."""
    groups: dict[tuple[str, float, float], list[tuple[float, dict, Row | None, Row | None]]] = {}
    for key, record in summary.variants.items():
        if record.get("kind") != "ablation":
            continue
        mean = summary.variant_row(MEAN_ROW, key)
        per_dataset = [r for s in summary.datasets
                       if (r := summary.variant_row(s, key)) and r.d_rmse_pct is not None]
        worst = max(per_dataset, key=lambda r: r.d_rmse_pct, default=None)
        cost = mean.d_rmse_pct if mean and mean.d_rmse_pct is not None else -math.inf
        group = (record["arm"], record["stress_tau"], record["tau"])
        groups.setdefault(group, []).append((cost, record, mean, worst))
    tables = []
    order = {a: i for i, a in enumerate(_ARM_LABELS)}
    for (arm, stress, near), ranked in sorted(groups.items(), key=lambda g: (order[g[0][0]],
                                                                            g[0][1:])):
        ranked.sort(key=lambda item: -item[0])
        rows = [[str(rank), record["family"], str(len(record["site_tau"])),
                 _d_rmse(mean), _fmt(mean.d_r2 if mean else None, "+.6f"),
                 f"{_d_rmse(worst)} ({summary.names[worst.dataset]})" if worst else "—"]
                for rank, (_, record, mean, worst) in enumerate(ranked, 1)]
        tables.append((f"{_ARM_LABELS[arm]}: site families ranked by the RMSE they cost (family at "
                       f"stress τ = {stress:g}, every other site at τ = {near:g})",
                       ["Rank", "Family", "Sites", "ΔRMSE % (mean over cells)", "ΔR² (mean)",
                        "Largest dataset ΔRMSE %"], rows))
    return tables
