"""Matplotlib PNGs of the change against base: ΔRMSE % per dataset and arm at each τ, and, with
several τ or a calibrated variant, ΔRMSE % and ΔR² against τ (log x) per arm and dataset over the
whole grid, each calibrated spec drawn as a star at x = the median of its per-site τ."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._files.atomic import atomic_file
from .summary import MEAN_ROW, Row, Summary

__all__ = ["plot_delta_rmse", "PLOT_NAMES"]

PLOT_NAMES = ("delta_rmse.png", "delta_rmse_vs_tau.png")        # the files it may write

_ARM_LABELS = {"oa": "OA", "full-o": "Full-O"}
_PANELS_PER_ROW = 4


def _save(fig, path: Path) -> None:
    """Save ``fig`` as a PNG at ``path`` through :func:`oretrofit._files.atomic.atomic_file`."""
    with atomic_file(path) as fh:
        fig.savefig(fh, format="png", dpi=120, metadata={"Software": None})


def _o_arms(summary: Summary) -> list[str]:
    return [a for a in summary.arms if a != "base"]


def _scale(ax, values: list[float]) -> None:
    """Symmetric-log y when changes span orders of magnitude (Full-O at τ = 1)."""
    finite = [abs(v) for v in values if v is not None and np.isfinite(v)]
    if finite and max(finite) > 10:
        ax.set_yscale("symlog", linthresh=0.1)
    ax.axhline(0.0, color="0.4", linewidth=0.8)


def plot_delta_rmse(summary: Summary, out: Path) -> dict[str, Path]:
    """Write ``delta_rmse.png`` (and ``delta_rmse_vs_tau.png`` for several τ or a calibrated
    variant); returns paths.

    Bars are measured means over seeds; black crosses are the paper's values where it has them.
    Nothing is drawn without base cells (there is no change to show).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = _o_arms(summary)
    if "base" not in summary.arms or not arms or not summary.taus:
        return {}
    files = {}
    names = [summary.names[s] for s in summary.datasets]
    x = np.arange(len(names))
    width = 0.8 / len(arms)
    columns = min(len(summary.taus), _PANELS_PER_ROW)
    lines = -(-len(summary.taus) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(max(5, 1.3 * len(names)) * columns,
                                                      4 * lines), squeeze=False)
    for ax in axes.flat[len(summary.taus):]:
        ax.set_visible(False)
    for ax, tau in zip(axes.flat, summary.taus):
        shown = []
        for i, arm in enumerate(arms):
            rows = [summary.row(s, arm, tau) for s in summary.datasets]
            measured = [r.d_rmse_pct if r else None for r in rows]
            paper = [r.paper_d_rmse_pct if r else None for r in rows]
            offset = x - 0.4 + width * (i + 0.5)
            ax.bar(offset, [np.nan if v is None else v for v in measured], width,
                   label=_ARM_LABELS.get(arm, arm))
            ax.scatter(offset, [np.nan if v is None else v for v in paper], marker="x",
                       color="black", zorder=3, label="paper" if i == 0 else None)
            shown += measured + paper
        _scale(ax, shown)
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_title(f"τ = {tau:g}")
        ax.set_ylabel("ΔRMSE % vs base (mean over seeds)")
        ax.legend(fontsize="small")
    fig.tight_layout()
    files[PLOT_NAMES[0]] = out / PLOT_NAMES[0]
    _save(fig, files[PLOT_NAMES[0]])
    plt.close(fig)
    if len(summary.taus) > 1 or _calibrated(summary):
        files[PLOT_NAMES[1]] = _plot_against_tau(plt, summary, arms, out)
    return files


def _calibrated(summary: Summary) -> dict[str, float]:
    """``<arm>/<name>`` -> median site τ of each calibrated variant (its marker's x)."""
    found = {}
    for key, record in summary.variants.items():
        if record.get("kind") == "calibrated":
            values = sorted((record.get("site_tau") or {}).values()) or [record["tau"]]
            found[key] = float(np.median(values))
    return found


def _plot_against_tau(plt, summary: Summary, arms: list[str], out: Path) -> Path:
    """One column per O arm; ΔRMSE % on top, ΔR² below; one line per dataset and the mean over
    cells (black), a star per calibrated variant in its dataset's colour."""
    metrics = (("ΔRMSE % vs base", lambda r: r.d_rmse_pct), ("ΔR² vs base", lambda r: r.d_r2))
    calibrated = _calibrated(summary)
    fig, axes = plt.subplots(2, len(arms), figsize=(6 * len(arms), 8), squeeze=False)
    for column, arm in enumerate(arms):
        for line, (label, value) in enumerate(metrics):
            ax = axes[line][column]
            shown = []
            for spec in [*summary.datasets, MEAN_ROW]:
                values = [_value(summary.row(spec, arm, t), value) for t in summary.taus]
                mean = spec == MEAN_ROW
                drawn = ax.plot(summary.taus, values, marker="o", markersize=3,
                                color="black" if mean else None, linewidth=2.5 if mean else 1.2,
                                label=MEAN_ROW if mean else summary.names[spec])[0]
                shown += values
                for key, x in calibrated.items():
                    if key.startswith(f"{arm}/"):
                        y = _value(summary.variant_row(spec, key), value)
                        ax.scatter([x], [y], marker="*", s=160, color=drawn.get_color(),
                                   edgecolors="black", linewidths=0.6, zorder=4)
                        shown.append(y)
            if any(k.startswith(f"{arm}/") for k in calibrated):
                ax.scatter([], [], marker="*", s=160, color="white", edgecolors="black",
                           label="calibrated spec (x = its median site τ)")
            ax.set_xscale("log")
            _scale(ax, shown) if line == 0 else ax.axhline(0.0, color="0.4", linewidth=0.8)
            ax.set_xlabel("τ (every site of the arm)")
            ax.set_ylabel(label)
            ax.set_title(f"{_ARM_LABELS.get(arm, arm)}: {label}")
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    path = out / PLOT_NAMES[1]
    _save(fig, path)
    plt.close(fig)
    return path


def _value(row: Row | None, value) -> float:
    """``value(row)`` as a float, NaN where there is no row or no value."""
    found = value(row) if row is not None else None
    return np.nan if found is None else float(found)
