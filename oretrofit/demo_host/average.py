"""Uniform weight averaging of demo-host checkpoints trained from the same starting weights.

Runs that share their starting weights (e.g. several final stages from one earlier stage,
trained in parallel on separate cores) can be averaged parameter by parameter:

    θ_avg = (1/N) · Σ_n θ_n

(a "model soup", Wortsman et al. 2022). Averaging is only meaningful for runs of the same
architecture that started from one set of weights; the architecture and inference config of
every input must match, and non-float buffers must be identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .._files.provenance import portable
from ..hosts.tabpfn.checkpoints import check_checkpoint_name, checkpoint_sha256, load_checkpoint, save_atomic

__all__ = ["average_checkpoints"]


def _check_compatible(first: dict[str, Any], other: dict[str, Any], path: Path) -> None:
    """Raise a ValueError naming what differs between ``other`` (at ``path``) and the first input."""
    for key in ("architecture_name", "config", "inference_config"):
        if first.get(key) != other.get(key):
            raise ValueError(f"{path} has another {key} than the first checkpoint; average only "
                             "checkpoints of one architecture exported with one --inference preset")
    a, b = first["state_dict"], other["state_dict"]
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        raise ValueError(f"{path} has other parameter names or shapes than the first checkpoint")


def average_checkpoints(paths: list[Path], dest: Path) -> Path:
    """Write the uniform average of the tabpfn-format checkpoints at ``paths`` to ``dest``.

    Float tensors become θ_avg = (1/N) Σ_n θ_n (accumulated in float64); other tensors must be
    equal in every input and are copied. The ``oretrofit`` entry records each input's path,
    sha256 and own entry, and the steps and wall time summed over the inputs.
    """
    paths, dest = [Path(p) for p in paths], Path(dest)
    check_checkpoint_name(dest, "v3")  # the name tabpfn needs; the same check as for patched artifacts
    if len(paths) < 2:
        raise ValueError("give at least two checkpoints to average")
    checkpoints = [load_checkpoint(p) for p in paths]
    first = checkpoints[0]
    for ckpt, path in zip(checkpoints[1:], paths[1:]):
        _check_compatible(first, ckpt, path)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in first["state_dict"].items():
        values = [c["state_dict"][name] for c in checkpoints]
        if tensor.is_floating_point():
            total = torch.stack([v.to(torch.float64) for v in values]).sum(0)
            state[name] = (total / len(values)).to(tensor.dtype)
        elif all(torch.equal(tensor, v) for v in values[1:]):
            state[name] = tensor.clone()
        else:
            raise ValueError(f"non-float tensor {name!r} differs between the checkpoints; they "
                             "are not runs of one host")
    metas = [c.get("oretrofit") or {} for c in checkpoints]
    steps = sum(int(m.get("steps", 0)) for m in metas)
    elapsed_s = sum(float(m.get("elapsed_s", 0.0)) for m in metas)
    meta = {"weights": f"demo (uniform average of {len(paths)} checkpoints, {steps} steps in all)",
            "steps": steps, "elapsed_s": round(elapsed_s, 1),
            "averaged_from": [{"path": portable(Path(p)), "sha256": checkpoint_sha256(p), "oretrofit": m}
                              for p, m in zip(paths, metas)]}
    for key in ("inference", "seed"):
        if key in metas[0]:
            meta[key] = metas[0][key]
    averaged = {**{k: v for k, v in first.items() if k not in ("state_dict", "oretrofit")},
                "state_dict": state, "oretrofit": meta}
    return save_atomic(averaged, dest)
