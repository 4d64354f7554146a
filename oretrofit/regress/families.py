"""The model families the runner regresses with: each family's ``make_regressor``, the vendor
arguments the runner's settings map to, and its checkpoint (``--host``).

TabPFN takes every setting (``random_state``, ``n_estimators``, ``inference_precision``,
variants, the ``demo``/``random`` checkpoints); TabICL and TabDPT take a checkpoint file in the
vendor's format (e.g. ``oretrofit.tabicl.write_random_checkpoint(path, "regressor")``) and the
vendor's own names: TabICL ``random_state`` and ``n_estimators``, TabDPT ``seed`` and
``n_ensembles`` at ``predict``. A family whose package cannot be imported is refused by name,
with the fix.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

import torch

HOSTS = ("tabpfn", "tabicl", "tabdpt")
_PACKAGES = {"tabpfn": "tabpfn", "tabicl": "tabicl", "tabdpt": "tabdpt"}
_MODULES = {"tabpfn": "oretrofit.tabpfn", "tabicl": "oretrofit.tabicl",
            "tabdpt": "oretrofit.tabdpt"}

__all__ = ["HOSTS", "check_host", "checkpoint_file", "make_regressor", "vendor_kwargs"]


def check_host(host: str) -> None:
    """Refuse an unknown family, or one whose vendor package does not import here."""
    if host not in HOSTS:
        raise ValueError(f"unknown --host {host!r}; choose one of {', '.join(HOSTS)}")
    try:
        importlib.import_module(_PACKAGES[host])
    except Exception as exc:              # an import that fails on a pin is as missing
        raise ValueError(
            f"--host {host} needs the {_PACKAGES[host]} package, which does not import in this "
            f"environment ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); run "
            f"oretrofit from an environment with it (pip install 'oretrofit[{host}]'"
            + (", in its own environment: tabdpt pins huggingface-hub; `make test-tabdpt` "
               "builds one" if host == "tabdpt" else "") + ")") from None


def vendor_kwargs(host: str, settings: dict[str, Any], seed: int
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The runner's ``settings`` (``device``, ``n_estimators``, ``inference_precision``) and
    the cell's ``seed`` under the family's own argument names: ``(constructor kwargs, predict
    kwargs)``. TabDPT takes its ensemble size and seed at ``predict`` (``n_ensembles``,
    ``seed``). A setting the family has no argument for is refused rather than dropped."""
    settings = dict(settings)
    if host == "tabpfn":
        return {**settings, "random_state": seed}, {}
    if settings.pop("inference_precision", torch.float32) != torch.float32:
        raise ValueError(f"--inference-precision is TabPFN's; --host {host} runs at its own "
                         "(float32 on a CPU)")
    n_estimators = settings.pop("n_estimators", 1)
    if host == "tabicl":
        return {**settings, "n_estimators": n_estimators, "random_state": seed}, {}
    return settings, {"n_ensembles": n_estimators, "seed": seed}


def make_regressor(host: str) -> Callable[..., Any]:
    """The family's ``make_regressor(checkpoint, arm=..., tau=..., eps=..., **vendor)``."""
    return importlib.import_module(_MODULES[host]).make_regressor


def checkpoint_file(host: str, model_path: str | None) -> Path:
    """The checkpoint a TabICL or TabDPT run reads: an existing file (no download here)."""
    path = Path(model_path) if model_path else None
    if path is None or not path.is_file():
        raise ValueError(
            f"--host {host} needs --model-path FILE, a checkpoint in the vendor's format "
            f"(e.g. oretrofit.{host}.write_random_checkpoint); got {model_path!r}")
    return path
