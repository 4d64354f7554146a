"""The patched artifact: a TabPFN v3 checkpoint that carries its JSON patch spec inside.

The file is the source checkpoint (same ``state_dict``, ``config``, ``architecture_name``,
``inference_config``) plus an ``oretrofit_patch`` entry: the JSON text of
:meth:`oretrofit.Retrofit.spec` extended with the source checkpoint's SHA-256 and weights label.
tabpfn alone loads it as the unpatched model (it ignores the extra entry); once
:mod:`oretrofit.tabpfn` is imported, tabpfn loads it patched (:mod:`.reload`);
:func:`oretrofit.tabpfn.load_patched_regressor` / ``load_patched_classifier`` load it back as
a ready, retrofitted tabpfn estimator whose ``model_path`` is the artifact.

A second entry, ``oretrofit_patch_sha256``, is the checksum

    sha256(spec JSON ‖ 0x00 ‖ weights digest),   weights digest = sha256 over the sorted
                                                 state_dict of (name, dtype, shape, bytes)

so an artifact whose spec (source SHA-256, site list, τ, …) or weights were changed after it was
written is refused on load. Loading also re-applies the spec and checks the result against it
(host, site list, each site's modules: :func:`oretrofit.apply_spec`; the package versions it
records are provenance, so an artifact written under one admitted tabpfn release loads under
another).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from ..._files.reading import FileRefused, parse_json
from ..._files.provenance import weights_digest
from ..._surgery.registry import SPEC_VERSION, RetrofitError, check_schema_version
from .checkpoints import check_checkpoint_name, checkpoint_sha256, load_checkpoint, save_atomic

__all__ = ["ARTIFACT_KEY", "DIGEST_KEY", "write_patched_artifact", "read_patch_spec",
           "weights_digest"]

ARTIFACT_KEY = "oretrofit_patch"
DIGEST_KEY = "oretrofit_patch_sha256"
_RECREATE = "re-create the artifact with `oretrofit patch --out` from its source checkpoint"


def _checksum(spec_json: str, state_dict: Mapping[str, torch.Tensor]) -> str:
    return hashlib.sha256(spec_json.encode() + b"\0" + weights_digest(state_dict).encode()
                          ).hexdigest()


def write_patched_artifact(out: str | os.PathLike[str], source: str | os.PathLike[str],
                           spec: Mapping[str, Any]) -> Path:
    """Write ``source``'s checkpoint with ``spec`` (a patch spec dict) embedded, to ``out``.

    ``out`` must be named like a checkpoint of the source's version (tabpfn reads the version
    from the name: ``*v3*.ckpt``, ``*v3.5*.safetensors``, …).
    """
    from .versions import version_of_checkpoint
    out = Path(out)
    check_checkpoint_name(
        out, version_of_checkpoint(load_checkpoint(source)["architecture_name"]).label)
    if spec.get("schema_version") != SPEC_VERSION:
        raise RetrofitError(f"patch spec schema_version {spec.get('schema_version')!r} is not "
                            f"{SPEC_VERSION}; create it with Retrofit.spec()")
    recorded = spec.get("source_checkpoint_sha256")
    if recorded is not None and recorded != checkpoint_sha256(source):
        raise RetrofitError(f"the spec names source checkpoint SHA-256 {str(recorded)[:12]}…, "
                            f"but {source} has {checkpoint_sha256(source)[:12]}…; make the spec "
                            "from this checkpoint")
    checkpoint = dict(load_checkpoint(source))
    checkpoint[ARTIFACT_KEY] = json.dumps(dict(spec), sort_keys=True)
    checkpoint[DIGEST_KEY] = _checksum(checkpoint[ARTIFACT_KEY], checkpoint["state_dict"])
    return save_atomic(checkpoint, out)


def read_patch_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The patch spec embedded in a patched artifact (a clear error when there is none)."""
    checkpoint = load_checkpoint(path)
    raw = checkpoint.get(ARTIFACT_KEY)
    if raw is None:
        raise RetrofitError(f"{path} is a plain TabPFN checkpoint without an oretrofit patch "
                            "spec; write one with `oretrofit patch --out`, or use "
                            "oretrofit.tabpfn.make_regressor for an unpatched checkpoint")
    if not isinstance(raw, str) or checkpoint.get(DIGEST_KEY) != _checksum(
            raw, checkpoint["state_dict"]):
        state = "has no checksum" if DIGEST_KEY not in checkpoint else "was modified after it " \
            "was written (its spec or weights do not match the checksum written with them)"
        raise RetrofitError(f"the patched artifact {path} {state}; {_RECREATE}")
    try:
        spec = parse_json(raw, f"the patch spec inside {path}", _RECREATE)
    except FileRefused as exc:
        raise RetrofitError(str(exc)) from None
    if not isinstance(spec, dict):
        raise RetrofitError(f"the patch spec inside {path} is not a JSON object; {_RECREATE}")
    check_schema_version(spec, f"the patch spec inside {path}")
    return spec
