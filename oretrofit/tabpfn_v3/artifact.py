"""The patched artifact: a TabPFN v3 checkpoint that carries its JSON patch spec inside.

The file is the source checkpoint (same ``state_dict``, ``config``, ``architecture_name``,
``inference_config``) plus an ``oretrofit_patch`` entry: the JSON text of
:meth:`oretrofit.Retrofit.spec` extended with the source checkpoint's SHA-256 and weights label.
tabpfn still loads it as the unpatched model (it ignores the extra entry);
:func:`load_patched_regressor` loads it back as a ready, retrofitted regressor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from .._registry import SPEC_VERSION, Retrofit, RetrofitError
from .checkpoints import check_checkpoint_name, load_checkpoint, save_atomic
from .regressor import regressor_from_checkpoint, spec_patch

__all__ = ["ARTIFACT_KEY", "write_patched_artifact", "read_patch_spec", "load_patched_regressor"]

ARTIFACT_KEY = "oretrofit_patch"


def write_patched_artifact(out: str | os.PathLike[str], source: str | os.PathLike[str],
                           spec: Mapping[str, Any]) -> Path:
    """Write ``source``'s checkpoint with ``spec`` (a patch spec dict) embedded, to ``out``.

    ``out`` must be named like a v3 checkpoint (``*v3*.ckpt`` or ``*v3*.safetensors``).
    """
    out = Path(out)
    check_checkpoint_name(out)
    if spec.get("schema_version") != SPEC_VERSION:
        raise RetrofitError(f"patch spec schema_version {spec.get('schema_version')!r} is not "
                            f"{SPEC_VERSION}; create it with Retrofit.spec()")
    checkpoint = dict(load_checkpoint(source))
    checkpoint[ARTIFACT_KEY] = json.dumps(dict(spec), sort_keys=True)
    return save_atomic(checkpoint, out)


def read_patch_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The patch spec embedded in a patched artifact (a clear error when there is none)."""
    checkpoint = load_checkpoint(path)
    raw = checkpoint.get(ARTIFACT_KEY)
    if raw is None:
        raise RetrofitError(f"{path} is a plain TabPFN checkpoint without an oretrofit patch "
                            "spec; write one with `oretrofit patch --out`, or use "
                            "oretrofit.tabpfn_v3.make_regressor for an unpatched checkpoint")
    try:
        spec = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as exc:
        raise RetrofitError(f"the patch spec inside {path} is corrupt ({exc}); re-create the "
                            "artifact with `oretrofit patch --out`") from exc
    if spec.get("schema_version") != SPEC_VERSION:
        raise RetrofitError(f"the patch spec inside {path} has schema_version "
                            f"{spec.get('schema_version')!r}; this oretrofit reads {SPEC_VERSION}")
    return spec


def load_patched_regressor(path: str | os.PathLike[str], **regressor_kwargs: Any
                           ) -> tuple[Any, Retrofit | None]:
    """``(regressor, retrofit)`` ready to fit/predict from a patched artifact.

    ``regressor_kwargs`` go to :func:`regressor_from_checkpoint` (device, seed, n_estimators,
    fit_mode, inference_precision, other TabPFNRegressor options).
    """
    spec = read_patch_spec(path)
    return regressor_from_checkpoint(path, spec_patch(spec), **regressor_kwargs)
