#!/usr/bin/env python3
"""Run the TabICL host's checks on every tabicl release, each in its own virtual environment,
and write ``results/tabicl-compat.md`` (the table the host's version gate rests on).

Per release ``X`` the environment ``VENVS/tabicl-X`` is the main environment (the interpreter
running this script) with ``tabicl==X`` installed on top, and whatever that release pins
(:func:`release_envs.layered_venv`), and:

1. the TabICL tests: ``tests/hosts/tabicl``;
2. a random tiny model of the release's ``TabICL`` class, both tasks, fp32: the largest
   |Δ| of its forward retrofitted under oa and full-o at τ = 1e-8 from the unpatched forward
   (must be ≤ 1e-5), ``revert`` bit-identical, and the largest |Δ| of a zero-padded forward of
   three ragged datasets under full-o from each dataset's own forward (must be ≤ 1e-6).

A release the host's gate refuses skips 1 and 2: its row is ``refused`` when retrofitting a
model of the release's own class raises naming the release (never a bare import error, never
"no registered host matches").

Usage: ``python scripts/tabicl_compat.py [--venvs DIR] [--releases 2.1.0,2.2.0] [--out FILE]``.
``--check`` is the in-environment step 2 (prints one JSON line).
"""

from __future__ import annotations

from pathlib import Path

from release_envs import (gated_main, gated_outcome, gated_release, receipt, refusal_cell)

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/hosts/tabicl"]
RELEASES = ["0.0.1", "0.0.2", "0.0.3", "0.0.4", "0.0.5", "0.0.6", "0.1.0", "0.1.1", "0.1.2",
            "0.1.3", "0.1.4", "2.0.0", "2.0.1", "2.0.2", "2.0.3", "2.1.0", "2.1.1", "2.2.0"]
TAU, MAX_TAU_DEV, MAX_PAD_DEV = 1e-8, 1e-5, 1e-6


def _release_class() -> type:
    """The release's ``TabICL`` (``tabicl._model`` from 2.1.0, ``tabicl.model`` before)."""
    import importlib
    for module in ("tabicl._model.tabicl", "tabicl.model.tabicl"):
        try:
            return importlib.import_module(module).TabICL
        except ModuleNotFoundError:
            continue
    raise RuntimeError("this tabicl release ships no TabICL model class")


def check() -> dict:
    """Step 2 inside one environment; on a release the gate refuses, the refusal instead."""
    import importlib.metadata
    import inspect

    import torch

    import oretrofit
    from oretrofit.hosts.tabicl import releases
    from oretrofit.hosts.tabicl.checkpoints import TINY_CONFIG
    found = {"tabicl": importlib.metadata.version("tabicl"), "torch": torch.__version__}
    try:
        releases.check_release(releases.installed_version())
    except oretrofit.RetrofitError:
        cls = _release_class()
        accepted = inspect.signature(cls).parameters
        model = cls(**{k: v for k, v in TINY_CONFIG.items() if k in accepted})
        try:
            oretrofit.retrofit(model, "oa")
        except oretrofit.RetrofitError as err:
            return {**found, "refused": str(err)}
        return {**found, "refused": "NOT refused"}
    return {**found, **_deviations()}


def _deviations() -> dict:
    """τ→0 and padding deviations of random tiny models, both tasks."""
    import torch
    from tabicl._model.inference_config import InferenceConfig

    import oretrofit
    from oretrofit.hosts.tabicl.checkpoints import random_model
    from oretrofit.hosts.tabicl.padding import padded_forward
    config = InferenceConfig()
    config.update_from_dict({stage: {"device": torch.device("cpu"), "use_amp": False}
                             for stage in ("COL_CONFIG", "ROW_CONFIG", "ICL_CONFIG")})
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 12, 8, 5), (1, 9, 5, 3), (2, 15, 9, 7)]          # lanes, rows, train, features
    out = {"tau": {"oa": 0.0, "full-o": 0.0}, "revert": True, "padding": 0.0}
    for task in ("classifier", "regressor"):
        xs = [torch.randn(b, r, f, generator=g) for b, r, _, f in shapes]
        ys = [(torch.arange(n) % 3).float().expand(b, n).clone() if task == "classifier"
              else torch.randn(b, n, generator=g) for b, _, n, _ in shapes]
        model = random_model(task, zero_init=False)[0]
        with torch.no_grad():
            base = [model(x, y, inference_config=config) for x, y in zip(xs, ys)]
            for arm in ("oa", "full-o"):
                handle = oretrofit.retrofit(model, arm, tau=TAU)
                patched = [model(x, y, inference_config=config) for x, y in zip(xs, ys)]
                out["tau"][arm] = max(out["tau"][arm], *((p - b).abs().max().item()
                                                          for p, b in zip(patched, base)))
                if arm == "full-o":
                    padded = padded_forward(model, xs, ys, inference_config=config)
                    out["padding"] = max(out["padding"], *((p - q).abs().max().item()
                                                          for p, q in zip(padded, patched)))
                handle.revert()
                out["revert"] &= all(torch.equal(model(x, y, inference_config=config), b)
                                     for x, y, b in zip(xs, ys, base))
    return out


def run_release(venv: Path, release: str, source: Path) -> dict:
    """Both checks for one release; ``ok`` when every one passes (or, for a release the gate
    refuses, when the refusal names the release)."""
    return gated_release(venv, release, source, "tabicl", TESTS, _deviations_ok)


def _deviations_ok(result: dict) -> bool:
    return (result["revert"] and max(result["tau"].values()) <= MAX_TAU_DEV
            and result["padding"] <= MAX_PAD_DEV)


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    def cell(row: dict, *path: str) -> str:
        value = row["result"]
        for key in path:
            value = value.get(key, {}) if isinstance(value, dict) else {}
        return f"{value:.1e}" if isinstance(value, float) else "-"

    return receipt(
        "TabICL host: tabicl release compatibility",
        "Written by `scripts/tabicl_compat.py`; do not edit by hand. One layered virtual "
        "environment per release (the main environment, torch 2.13.0 CPU, with `tabicl==X` "
        "installed on top), running an export of the commit below. A release passes when (1) "
        f"the TabICL tests pass ({', '.join(f'`{t}`' for t in TESTS)}) and (2) a random tiny "
        "model of the release's `TabICL`, both tasks, fp32, retrofitted at τ = "
        f"{TAU:g} stays within {MAX_TAU_DEV:g} of its unpatched forward under oa and full-o "
        "(max |Δ|), `revert` restores it bit for bit, and three ragged datasets zero-padded "
        f"into one forward under full-o stay within {MAX_PAD_DEV:g} of each dataset's own "
        "forward (no mask). The host's version gate admits exactly the passing releases; a "
        "release it refuses (`refused`) is not put through (1) and (2): its row shows that "
        "retrofitting a model of the release's own class is refused naming the release, with "
        "the `pip install` that fixes it.",
        command, commit,
        ["tabicl", "outcome", "TabICL tests", "τ→0 oa Δ", "τ→0 full-o Δ", "padding Δ",
         "refusal", "torch", "wall s"],
        [[row["release"], gated_outcome(row), row["tests"], cell(row, "tau", "oa"),
          cell(row, "tau", "full-o"), cell(row, "padding"), refusal_cell(row, 110),
          row["result"].get("torch", "-"), row["wall_s"]] for row in rows])


def main() -> None:
    gated_main(ROOT, __doc__.splitlines()[0], "tabicl", RELEASES, check, run_release, render)


if __name__ == "__main__":
    main()
