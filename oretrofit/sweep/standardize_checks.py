"""Per-case measurements of the OStandardize protocol (paper B.5).

τ = 1e-6, ε_var = 1e-6, token axis 1. A case is one shape and dtype: one zero token is inserted
at each boundary and in the interior; old support, mean, variance and outputs are compared
(L∞), inserted outputs must be exact zeros; permutation equivariance, finite gradients, and the
all-null, zero-length and singleton supports complete it.
"""

from __future__ import annotations

import torch
from torch import nn

from .._operators.components import OFFN, OStandardize, o_moments
from .._operators.presence import presence
from .measure import insert_zero_rows, linf

__all__ = ["standardize_case", "B5_CASES"]

B5_CASES: list[tuple[tuple[int, int, int], torch.dtype]] = [
    ((2, 5, 4), torch.float32), ((1, 7, 8), torch.float32), ((3, 4, 16), torch.float32),
    ((2, 5, 4), torch.bfloat16), ((2, 5, 4), torch.float16),
]


def standardize_case(shape: tuple[int, int, int], dtype: torch.dtype, seed: int, tau: float,
                     eps_var: float, device: str) -> dict[str, float | bool]:
    """Every B.5 measurement of one (shape, dtype, seed) case."""
    torch.manual_seed(seed)
    b, n, d = shape
    module = OStandardize(d, tau, eps_var).to(device)
    with torch.no_grad():
        module.weight.normal_()
        module.bias.normal_()
    h = torch.randn(shape, device=device).to(dtype)
    m: dict[str, float | bool] = {}
    with torch.no_grad():
        out = module(h)
        moments = o_moments(h, presence(h, tau))
        old_moment = old_out = inserted = 0.0
        for pos in (0, n // 2, n):                                          # boundaries, interior
            h2 = insert_zero_rows(h, [pos])
            moments2 = o_moments(h2, presence(h2, tau))
            old_moment = max([old_moment] + [linf(a, c) for a, c in zip(moments, moments2)])
            out2 = module(h2)
            kept = [i for i in range(n + 1) if i != pos]
            old_out = max(old_out, linf(out2[:, kept], out))
            inserted = max(inserted, linf(out2[:, pos]))
        perm = torch.randperm(n, device=device)
        m.update(old_moments=old_moment, old_output=old_out, inserted_output=inserted,
                 permutation=linf(module(h[:, perm]), out[:, perm]),
                 all_null=linf(module(torch.zeros_like(h))),
                 zero_length=linf(module(h[:, :0])),
                 finite=bool(torch.isfinite(out).all()))
        singleton = torch.zeros_like(h)
        singleton[:, n // 2] = h[:, n // 2]
        bare = OStandardize(d, tau, eps_var, affine=False)
        centred = bare(singleton)
        ffn = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d)).to(device, dtype)
        m["singleton_centred"] = linf(centred)
        m["singleton_next_offn"] = linf(OFFN(ffn, tau)(centred))
    leaf = insert_zero_rows(h, [n // 2]).detach().requires_grad_()
    module(leaf).float().square().sum().backward()
    m["gradients_finite"] = bool(torch.isfinite(leaf.grad).all())
    return m
