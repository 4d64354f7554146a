"""The paper's published TabPFN v3 retrofit values (Tables 2 and 7), keyed by OpenML dataset id.

Transcribed from ``shared/paper/tables.md`` (Table 2, Table 7) and ``fulltext.txt`` (§6.2 mean
changes over the 18 dataset-seed cells; Table 7's "Mean over 18 cells" row). These are the
paper's reported numbers, shown beside measured ones; nothing here is measured by oretrofit.
"""

from __future__ import annotations

__all__ = ["PAPER_DATASETS", "PAPER_SEEDS", "PAPER_ARMS", "TABLE2", "TABLE2_MEAN_DELTA",
           "TABLE7", "TABLE7_MEAN_DELTA", "paper_absolute", "paper_delta",
           "paper_mean_delta"]

# OpenML id -> the paper's row name, in the paper's order (B.4).
PAPER_DATASETS: dict[int, str] = {560: "bodyfat", 44959: "concrete", 505: "tecator",
                                  507: "space_ga", 227: "cpu_small", 189: "kin8nm"}
PAPER_SEEDS = (11, 23, 37)
PAPER_ARMS = ("base", "oa", "full-o")

# Table 2 (τ = 1e-8): per-dataset means over three seeds, {id: {arm: (RMSE, R²)}}.
TABLE2: dict[int, dict[str, tuple[float, float]]] = {
    560: {"base": (1.231549, .961179), "oa": (1.230964, .961228), "full-o": (1.232571, .961112)},
    44959: {"base": (4.127869, .936922), "oa": (4.133669, .936758), "full-o": (4.129971, .936862)},
    227: {"base": (3.023569, .971290), "oa": (3.022008, .971319), "full-o": (3.023061, .971299)},
    189: {"base": (.091274, .877050), "oa": (.091292, .877005), "full-o": (.091278, .877038)},
    507: {"base": (.093484, .740970), "oa": (.093366, .741612), "full-o": (.093445, .741182)},
    505: {"base": (.422813, .999087), "oa": (.424202, .999082), "full-o": (.424954, .999078)},
}
# §6.2: mean change over the 18 dataset-seed cells at τ = 1e-8, {arm: (ΔRMSE %, ΔR²)}.
TABLE2_MEAN_DELTA: dict[str, tuple[float, float]] = {"oa": (0.088, 8.4e-5),
                                                     "full-o": (0.177, 1.2e-5)}

# Table 7 (τ = 1): per-dataset means over seeds of the change against base,
# {id: {arm: (ΔRMSE %, ΔR²)}}.
TABLE7: dict[int, dict[str, tuple[float, float]]] = {
    560: {"oa": (0.532, 0.000028), "full-o": (95.354, 0.005431)},
    44959: {"oa": (0.162, -0.000178), "full-o": (24.442, -0.034037)},
    227: {"oa": (-0.054, 0.000031), "full-o": (5.238, -0.002766)},
    189: {"oa": (-0.112, 0.000277), "full-o": (39.797, -0.117006)},
    507: {"oa": (-0.126, 0.000649), "full-o": (17.324, -0.096142)},
    505: {"oa": (0.429, -0.000008), "full-o": (100.143, -0.002602)},
}
TABLE7_MEAN_DELTA: dict[str, tuple[float, float]] = {"oa": (0.138, 0.000133),
                                                     "full-o": (47.050, -0.041187)}

_ABSOLUTE = {1e-8: TABLE2}
_DELTA = {1e-8: ({}, TABLE2_MEAN_DELTA), 1.0: (TABLE7, TABLE7_MEAN_DELTA)}


def paper_absolute(openml_id: int | None, arm: str, tau: float) -> tuple[float, float] | None:
    """The paper's (RMSE, R²) mean for this dataset, arm and τ, or None where it reports none."""
    return _ABSOLUTE.get(tau, {}).get(openml_id, {}).get(arm) if openml_id is not None else None


def paper_delta(openml_id: int | None, arm: str, tau: float) -> tuple[float, float] | None:
    """The paper's per-dataset (ΔRMSE %, ΔR²) against base, or None where it reports none."""
    return _DELTA.get(tau, ({}, {}))[0].get(openml_id, {}).get(arm)


def paper_mean_delta(arm: str, tau: float) -> tuple[float, float] | None:
    """The paper's mean (ΔRMSE %, ΔR²) over its 18 dataset-seed cells at this τ, or None."""
    return _DELTA.get(tau, ({}, {}))[1].get(arm)
