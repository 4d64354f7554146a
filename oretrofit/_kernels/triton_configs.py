"""The Triton OAttention kernels' tiles and launch settings per head-dim bucket
(:func:`configs_for`), chosen by their static metrics on sm_90a (benchmarks/kernel_static.py,
results/kernel_static.md); the kernels are :mod:`oretrofit._kernels.triton_kernels`."""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton

# Triton's interpreter (the CPU tests) runs the kernels in the smallest tiles
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class KernelConfig:
    """One kernel's tile (``bm`` query rows × ``bn`` key columns) and launch settings."""

    bm: int
    bn: int
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class Configs:
    """The configurations of the forward, the dq and the dk/dv kernels for one head-dim bucket."""

    forward: KernelConfig
    dq: KernelConfig
    dkdv: KernelConfig


# Per padded head dim (``BD``), chosen by their static metrics on sm_90a (benchmarks/
# kernel_static.py, results/kernel_static.md): no register spills and at least two 4-warp
# CTAs (or one 8-warp CTA: two warpgroups) per SM within the 227 KB of shared memory a CTA may
# use. The forward at d ≤ 64 takes 128 query rows (half the K/V traffic of 64); at d = 128 a
# 128-row tile needs 202 registers a thread (one CTA per SM), so it keeps 64. At d = 128 the
# backward's accumulators spill on 4 warps: dq takes 64 × 64 on 8 warps, and dk/dv (keys on the
# tile's rows, k and v held in registers) 128 keys × 16 queries on 8 warps, one warpgroup per 64
# keys (32 × 64 on 8 warps spills 24 B under GQA). At d = 256 the tiles shrink again.
_INTERPRETER_CONFIGS = Configs(*(KernelConfig(16, 16, 1, 1),) * 3)
_SMALL_HEADS = Configs(KernelConfig(128, 64, 8, 3), KernelConfig(64, 64, 4, 3),
                       KernelConfig(32, 64, 4, 3))
_CONFIGS: dict[int, Configs] = {
    16: _SMALL_HEADS, 32: _SMALL_HEADS, 64: _SMALL_HEADS,
    128: Configs(KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 8, 2),
                 KernelConfig(16, 128, 8, 2)),
    256: Configs(KernelConfig(64, 32, 4, 2), KernelConfig(32, 64, 8, 2),
                 KernelConfig(32, 32, 4, 2)),
}


def padded_head_dim(d: int) -> int:
    """``BD``: the head dim padded to a power of two of at least 16 (the kernels' tile width)."""
    return max(16, triton.next_power_of_2(d))


def configs_for(d: int) -> Configs:
    """The kernels' configurations at head dim ``d`` (ValueError above 256)."""
    if _INTERPRET:
        return _INTERPRETER_CONFIGS
    bd = padded_head_dim(d)
    if bd not in _CONFIGS:
        raise ValueError(f"the Triton OAttention kernels take head dims up to 256, not {d}; "
                         "use attn_precision='fp32' for this host")
    return _CONFIGS[bd]
