"""Matplotlib PNGs of ΔRMSE % against base: per dataset and arm, and against τ when several τ."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .summary import MEAN_ROW, Summary

__all__ = ["plot_delta_rmse"]

_ARM_LABELS = {"oa": "OA", "full-o": "Full-O"}


def _o_arms(summary: Summary) -> list[str]:
    return [a for a in summary.arms if a != "base"]


def _scale(ax, values: list[float]) -> None:
    """Symmetric-log y when changes span orders of magnitude (Full-O at τ = 1)."""
    finite = [abs(v) for v in values if v is not None and np.isfinite(v)]
    if finite and max(finite) > 10:
        ax.set_yscale("symlog", linthresh=0.1)
    ax.axhline(0.0, color="0.4", linewidth=0.8)


def plot_delta_rmse(summary: Summary, out: Path) -> dict[str, Path]:
    """Write ``delta_rmse.png`` (and ``delta_rmse_vs_tau.png`` for several τ); returns paths.

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
    fig, axes = plt.subplots(1, len(summary.taus), figsize=(max(5, 1.3 * len(names)) *
                             len(summary.taus), 4), squeeze=False)
    for ax, tau in zip(axes[0], summary.taus):
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
    files["delta_rmse.png"] = out / "delta_rmse.png"
    fig.savefig(files["delta_rmse.png"], dpi=120, metadata={"Software": None})
    plt.close(fig)
    if len(summary.taus) > 1:
        files["delta_rmse_vs_tau.png"] = _plot_against_tau(plt, summary, arms, out)
    return files


def _plot_against_tau(plt, summary: Summary, arms: list[str], out: Path) -> Path:
    fig, axes = plt.subplots(1, len(arms), figsize=(5.5 * len(arms), 4), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        shown = []
        for spec in [*summary.datasets, MEAN_ROW]:
            values = [(r.d_rmse_pct if (r := summary.row(spec, arm, t)) else None)
                      for t in summary.taus]
            mean = spec == MEAN_ROW
            ax.plot(summary.taus, [np.nan if v is None else v for v in values], marker="o",
                    color="black" if mean else None, linewidth=2.5 if mean else 1.2,
                    label=MEAN_ROW if mean else summary.names[spec])
            shown += values
        ax.set_xscale("log")
        _scale(ax, shown)
        ax.set_xlabel("τ")
        ax.set_ylabel("ΔRMSE % vs base")
        ax.set_title(_ARM_LABELS.get(arm, arm))
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = out / "delta_rmse_vs_tau.png"
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return path
