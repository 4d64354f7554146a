"""A generated reading of a summary: per τ, the range of each O arm's ΔRMSE % beside the paper's.

The sentences only restate numbers of the summary (no judgement typed in), so a README can quote
them next to the tables: for each τ and O arm, the smallest and largest per-dataset mean
ΔRMSE % against base, the same range over the datasets where the paper reports a value, and on
how many datasets Full-O changes RMSE more than OA (the paper's τ-stress direction). Where the
cells recorded presence profiles, it adds the range of the per-dataset median presence and of the
fraction of presences below ½ at each arm's sites (how strongly τ gates the host's tokens), and
the module whose presences most often fall below ½.
"""

from __future__ import annotations

from collections import Counter

from .summary import Row, Summary

__all__ = ["reading"]


def _span(values: list[float]) -> str:
    return f"{min(values):+.3g}% to {max(values):+.3g}%"


def _arm_phrase(rows: list[Row], label: str) -> str:
    text = f"{label} ΔRMSE {_span([r.d_rmse_pct for r in rows])}"
    paper = [r.paper_d_rmse_pct for r in rows if r.paper_d_rmse_pct is not None]
    if paper:
        text += f" (paper: {_span(paper)} on the {len(paper)} dataset(s) it reports)"
    medians = [r.presence_p50 for r in rows if r.presence_p50 is not None]
    if medians:
        below = [r.presence_below_half for r in rows if r.presence_below_half is not None]
        text += (f", median presence at its sites {min(medians):.3g} to {max(medians):.3g} "
                 f"({min(below):.1%} to {max(below):.1%} of presences below ½)")
    gated = Counter(r.most_gated_module for r in rows if r.most_gated_module is not None)
    if gated:
        module, count = gated.most_common(1)[0]
        worst = max(r.most_gated_below_half for r in rows if r.most_gated_module == module)
        text += (f"; most gated module `{module or 'model'}` on {count} of {len(rows)} datasets "
                 f"(up to {worst:.1%} of its presences below ½)")
    return text


def reading(summary: Summary) -> list[str]:
    """Markdown bullet lines, one per τ at which both O arms and base ran."""
    lines = []
    for tau in summary.taus:
        per_arm = {arm: [r for spec in summary.datasets
                         if (r := summary.row(spec, arm, tau)) and r.d_rmse_pct is not None]
                   for arm in ("oa", "full-o")}
        if not all(per_arm.values()):
            continue
        oa = {r.dataset: r.d_rmse_pct for r in per_arm["oa"]}
        shared = [r for r in per_arm["full-o"] if r.dataset in oa]
        worse = sum(abs(r.d_rmse_pct) > abs(oa[r.dataset]) for r in shared)
        lines.append(f"* τ = {tau:g}: {_arm_phrase(per_arm['oa'], 'OA')}; "
                     f"{_arm_phrase(per_arm['full-o'], 'Full-O')}. Full-O changes RMSE more than "
                     f"OA on {worse} of {len(shared)} datasets.")
    return lines
