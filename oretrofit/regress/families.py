"""The model families the runner regresses with: each family's ``make_regressor``, the vendor
arguments the runner's settings map to, and its checkpoint (``--host``).

TabPFN takes every setting (``random_state``, ``n_estimators``, ``inference_precision``,
variants, the ``demo``/``random`` checkpoints); TabICL and TabDPT take a checkpoint file in the
vendor's format (e.g. ``oretrofit.tabicl.write_random_checkpoint(path, "regressor")``), Mitra a
checkpoint directory (``oretrofit.hosts.mitra.write_random_checkpoint(path, "regression")``),
and the vendor's own names: TabICL ``random_state`` and ``n_estimators``, TabDPT ``seed`` and
``n_ensembles`` at ``predict``, Mitra ``seed`` and ``n_estimators`` (its other arguments at the
vendor's defaults: fine-tuning at every fit, a bfloat16 autocast forward). A family whose
package cannot be imported is refused by name, with the fix.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

import torch

HOSTS = ("tabpfn", "tabicl", "tabdpt", "mitra")
_PACKAGES = {"tabpfn": "tabpfn", "tabicl": "tabicl", "tabdpt": "tabdpt",
             "mitra": "autogluon.tabular.models.mitra.sklearn_interface"}
_MODULES = {"tabpfn": "oretrofit.tabpfn", "tabicl": "oretrofit.tabicl",
            "tabdpt": "oretrofit.tabdpt", "mitra": "oretrofit.hosts.mitra"}
# where a family runs its own precision, and the fix where its package is pinned apart
_OWN_PRECISION = {"mitra": "bfloat16 autocast, the vendor's fixed precision"}
_OWN_ENVIRONMENT = {
    "tabdpt": ", in its own environment: tabdpt pins huggingface-hub; `make test-tabdpt` builds "
              "one",
    "mitra": ": pip install 'autogluon.tabular[mitra]==1.6.3', in its own environment: "
             "autogluon pins pandas<2.4; `make test-mitra` builds one"}

__all__ = ["HOSTS", "check_host", "checkpoint_file", "weights_file", "make_regressor",
           "vendor_kwargs"]


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
            f"oretrofit from an environment with it ("
            + ("" if host == "mitra" else f"pip install 'oretrofit[{host}]'")
            + _OWN_ENVIRONMENT.get(host, "") + ")") from None


def vendor_kwargs(host: str, settings: dict[str, Any], seed: int
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The runner's ``settings`` (``device``, ``n_estimators``, ``inference_precision``) and
    the cell's ``seed`` under the family's own argument names: ``(constructor kwargs, predict
    kwargs)``. TabDPT takes its ensemble size and seed at ``predict`` (``n_ensembles``,
    ``seed``), Mitra at construction (``n_estimators``, ``seed``). A setting the family has no
    argument for is refused rather than dropped."""
    settings = dict(settings)
    if host == "tabpfn":
        return {**settings, "random_state": seed}, {}
    if settings.pop("inference_precision", torch.float32) != torch.float32:
        raise ValueError(f"--inference-precision is TabPFN's; --host {host} runs at its own "
                         f"({_OWN_PRECISION.get(host, 'float32 on a CPU')})")
    n_estimators = settings.pop("n_estimators", 1)
    if host == "tabicl":
        return {**settings, "n_estimators": n_estimators, "random_state": seed}, {}
    if host == "mitra":
        return {**settings, "n_estimators": n_estimators, "seed": seed}, {}
    return settings, {"n_ensembles": n_estimators, "seed": seed}


def make_regressor(host: str) -> Callable[..., Any]:
    """The family's ``make_regressor(checkpoint, arm=..., tau=..., eps=..., **vendor)``."""
    return importlib.import_module(_MODULES[host]).make_regressor


def checkpoint_file(host: str, model_path: str | None) -> Path:
    """The checkpoint a TabICL, TabDPT or Mitra run reads: an existing file, for Mitra a
    directory holding its weights file (no download here)."""
    path = Path(model_path) if model_path else None
    if host == "mitra" and (path is None or not weights_file(host, path).is_file()):
        raise ValueError(
            f"--host mitra needs --model-path DIR, a checkpoint directory in the vendor's format "
            f"(config.json and model.safetensors, e.g. "
            f"oretrofit.hosts.mitra.write_random_checkpoint); got {model_path!r}")
    if path is None or not (path.is_file() or host == "mitra"):
        raise ValueError(
            f"--host {host} needs --model-path FILE, a checkpoint in the vendor's format "
            f"(e.g. oretrofit.{host}.write_random_checkpoint); got {model_path!r}")
    return path


def weights_file(host: str, checkpoint: Path) -> Path:
    """The file holding a checkpoint's weights (its digest is the run's): the checkpoint itself,
    or for Mitra its directory's ``model.safetensors``."""
    return checkpoint / "model.safetensors" if host == "mitra" else checkpoint
