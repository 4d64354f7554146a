"""Aggregates cells into the paper's two views, with the paper's values beside.

For dataset d, arm a and τ, over the seeds s that have both the arm's cell and base's cell:

    ΔRMSE %(d, a, τ) = mean_s 100 · (RMSE(d, s, a, τ) / RMSE(d, s, base) - 1)
    ΔR²(d, a, τ)     = mean_s (R²(d, s, a, τ) - R²(d, s, base))

and the "mean over cells" row averages the per-(dataset, seed) changes (the paper's "mean over
18 cells"). Absolute RMSE and R² are plain means over seeds (Table 2's layout).

Arms are compared over the same seeds only: a (dataset, seed) group enters the rows only when it
has every (arm, τ) cell present anywhere in the folders; an incomplete group (a shard, a killed
run) is left out of every row and named in ``Summary.notes``. Where base's RMSE is 0 (a constant
target) ΔRMSE % is undefined: the row says so (``d_rmse_undefined``) instead of averaging the
other seeds, and the mean row leaves those cells out (also in the notes).

A per-site τ variant of an arm (:mod:`.variants`) is its own row (``Row.variant``), computed the
same way against base over the same seeds; ``Summary.taus`` lists only the plain τ values.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .._surgery.registry import ARMS
from .data import openml_id
from .reference import PAPER_DATASETS, paper_absolute, paper_delta, paper_mean_delta
from .store import cell_id

__all__ = ["Row", "Summary", "summarize", "MEAN_ROW"]

MEAN_ROW = "mean over cells"
_ARM_ORDER = {arm: i for i, arm in enumerate(ARMS)}


@dataclass
class Row:
    """One (dataset, arm, τ) aggregate; ``tau`` is None for base, ``dataset`` MEAN_ROW for the
    mean over cells. ``paper_*`` are None where the paper reports no value."""

    tau: float | None
    dataset: str
    name: str
    arm: str
    n_seeds: int
    rmse: float | None = None
    r2: float | None = None
    d_rmse_pct: float | None = None
    d_r2: float | None = None
    paper_rmse: float | None = None
    paper_r2: float | None = None
    paper_d_rmse_pct: float | None = None
    paper_d_r2: float | None = None
    standin_for: str | None = None
    presence_p50: float | None = None       # mean over seeds of each cell's median observed presence
    presence_below_half: float | None = None  # mean over seeds of the fraction of presences < ½
    most_gated_module: str | None = None      # the module with the largest such mean fraction
    most_gated_below_half: float | None = None
    d_rmse_undefined: bool = False          # base RMSE 0 on some seed: ΔRMSE % has no value
    variant: str | None = None              # the per-site τ variant (``tau``: its default τ)


@dataclass
class Summary:
    taus: list[float]                      # τ values of the O-arm cells, ascending
    arms: list[str]                        # arms present, in ARMS order
    datasets: list[str]                    # specs, ordered by display name
    names: dict[str, str]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # incomplete groups, undefined changes
    # "<arm>/<name>" -> the variant's run.json record, for the variants that have rows
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def row(self, dataset: str, arm: str, tau: float | None,
            variant: str | None = None) -> Row | None:
        return next((r for r in self.rows
                     if (r.dataset, r.arm, r.tau, r.variant) == (dataset, arm, tau, variant)),
                    None)

    def variant_row(self, dataset: str, key: str) -> Row | None:
        """The row of variant ``<arm>/<name>`` on ``dataset`` (or MEAN_ROW)."""
        arm, _, name = key.partition("/")
        return next((r for r in self.rows if (r.dataset, r.arm, r.variant) == (dataset, arm,
                                                                                 name)), None)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _presence_means(cells: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Mean over cells of the median presence and the fraction below ½ (cells that observed any),
    and the module whose presences fall below ½ most often (mean fraction over cells)."""
    seen = [c["presence"] for c in cells if (c.get("presence") or {}).get("count")]
    per_module: dict[str, list[float]] = defaultdict(list)
    for cell in cells:
        for name, profile in (cell.get("presence_by_module") or {}).items():
            if profile["count"]:
                per_module[name].append(profile["below_half"])
    fractions = {name: _mean(values) for name, values in per_module.items()}
    most = max(fractions, key=fractions.__getitem__) if any(fractions.values()) else None
    return {"presence_p50": _mean([p["quantiles"]["0.5"] for p in seen]),
            "presence_below_half": _mean([p["below_half"] for p in seen]),
            "most_gated_module": most, "most_gated_below_half": fractions.get(most)}


def _complete(cells: Sequence[Mapping[str, Any]], names: Mapping[str, str]
              ) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The cells of complete (dataset, seed) groups, and one note per incomplete group."""
    wanted = sorted({cell_id(c) for c in cells},
                    key=lambda k: (_ARM_ORDER[k[0]], k[2] or "", -1.0 if k[1] is None else k[1]))
    groups: dict[tuple[str, int], set[tuple[str, float | None, str | None]]] = defaultdict(set)
    for c in cells:
        groups[(c["dataset"], c["seed"])].add(cell_id(c))
    notes = []
    for (spec, seed), have in sorted(groups.items()):
        missing = [k for k in wanted if k not in have]
        if missing:
            lacks = ", ".join(a if t is None else f"{a} τ={t:g}" if v is None else f"{a} [{v}]"
                              for a, t, v in missing)
            notes.append(f"Incomplete: {names[spec]} seed {seed} lacks {lacks}; its other cells "
                         "are left out of every row (arms are compared over the same seeds). "
                         "Re-run the matrix into this folder to complete it.")
    keep = {g for g, have in groups.items() if len(have) == len(wanted)}
    return [c for c in cells if (c["dataset"], c["seed"]) in keep], notes


def _changes(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]
             ) -> tuple[float | None, float | None, bool]:
    """(mean ΔRMSE %, mean ΔR², undefined) over (cell, base cell) pairs; ΔRMSE % is undefined
    when any base RMSE is 0."""
    undefined = any(b["rmse"] == 0 for _, b in pairs)
    d_rmse = None if undefined else _mean([100 * (c["rmse"] / b["rmse"] - 1) for c, b in pairs])
    return d_rmse, _mean([c["r2"] - b["r2"] for c, b in pairs]), undefined


def summarize(cells: Sequence[Mapping[str, Any]],
              datasets: Mapping[str, Mapping[str, Any]],
              variants: Mapping[str, Mapping[str, Any]] | None = None) -> Summary:
    """Per-dataset means and changes against base for every τ and variant present (module
    docstring); ``variants``: the run folders' variant records (``<arm>/<name>`` -> record)."""
    names = {s: datasets.get(s, {}).get("name", s) for s in {c["dataset"] for c in cells}}
    cells, notes = _complete(cells, names)
    by_key = {(c["dataset"], c["seed"], *cell_id(c)): c for c in cells}
    specs = sorted({c["dataset"] for c in cells},
                   key=lambda s: (datasets.get(s, {}).get("name", s), s))
    taus = sorted({c["tau"] for c in cells if c["tau"] is not None and c.get("variant") is None})
    arms = [a for a in ARMS if any(c["arm"] == a for c in cells)]
    runs = sorted({(c["arm"], c["tau"], c["variant"]) for c in cells if c.get("variant")},
                  key=lambda k: (_ARM_ORDER[k[0]], k[2]))
    summary = Summary(taus, arms, specs, {s: names[s] for s in specs}, notes=notes,
                      variants={f"{a}/{v}": dict((variants or {}).get(f"{a}/{v}", {}))
                                for a, _, v in runs})
    for spec in specs:
        seeds = sorted({c["seed"] for c in cells if c["dataset"] == spec})
        pid = openml_id(spec)
        standin = datasets.get(spec, {}).get("source", {}).get("standin_for")
        for arm in arms:
            for tau, variant in (*(((None, None),) if arm == "base" else
                                   ((t, None) for t in taus)),
                                 *((t, v) for a, t, v in runs if a == arm)):
                own = [by_key[k] for s in seeds if (k := (spec, s, arm, tau, variant)) in by_key]
                if not own:
                    continue
                row = Row(tau, spec, names[spec], arm, len(own),
                          rmse=_mean([c["rmse"] for c in own]), r2=_mean([c["r2"] for c in own]),
                          standin_for=standin, variant=variant, **_presence_means(own))
                pairs = [(c, by_key[base]) for c in own
                         if arm != "base" and (base := (spec, c["seed"], "base", None, None))
                         in by_key]
                if pairs:
                    row.d_rmse_pct, row.d_r2, row.d_rmse_undefined = _changes(pairs)
                if variant is None:
                    # base is τ-free; the paper reports its absolute values in Table 2 (τ = 1e-8)
                    absolute = paper_absolute(pid, arm, 1e-8 if tau is None else tau)
                    delta = paper_delta(pid, arm, tau) if tau is not None else None
                    row.paper_rmse, row.paper_r2 = absolute or (None, None)
                    row.paper_d_rmse_pct, row.paper_d_r2 = delta or (None, None)
                summary.rows.append(row)
    zero = sorted({(names[c["dataset"]], c["seed"]) for c in cells
                   if c["arm"] == "base" and c["rmse"] == 0})
    if zero:
        summary.notes.append("ΔRMSE % is undefined where base RMSE is 0 (a constant target): "
                             + ", ".join(f"{n} seed {s}" for n, s in zero)
                             + "; those cells are left out of the mean over cells.")
    for tau in taus:
        for arm in (a for a in arms if a != "base"):
            _add_mean_row(summary, cells, by_key, arm, tau, None)
    for arm, tau, variant in runs:
        _add_mean_row(summary, cells, by_key, arm, tau, variant)
    return summary


def _add_mean_row(summary: Summary, cells: Sequence[Mapping[str, Any]],
                  by_key: Mapping[tuple, Mapping[str, Any]], arm: str, tau: float,
                  variant: str | None) -> None:
    pairs = [(c, b) for c in cells if cell_id(c) == (arm, tau, variant)
             and (b := by_key.get((c["dataset"], c["seed"], "base", None, None))) is not None
             and b["rmse"] != 0]
    if not pairs:
        return
    paper = paper_mean_delta(arm, tau) if variant is None and _is_paper_grid(summary) else None
    d_rmse, d_r2, _ = _changes(pairs)
    summary.rows.append(Row(
        tau, MEAN_ROW, MEAN_ROW, arm, len(pairs), d_rmse_pct=d_rmse, d_r2=d_r2,
        paper_d_rmse_pct=paper[0] if paper else None, paper_d_r2=paper[1] if paper else None,
        variant=variant))


def _is_paper_grid(summary: Summary) -> bool:
    """The paper's mean row applies only when the same six datasets were run."""
    return sorted(openml_id(s) or -1 for s in summary.datasets) == sorted(PAPER_DATASETS)
