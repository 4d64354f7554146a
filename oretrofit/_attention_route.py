"""Which OAttention route serves a call: the fused Triton kernels, checked before use.

:func:`triton_for` answers once per (device type, dtype, torch version) whether
:func:`oretrofit._attention_triton.o_attention_triton` serves there: Triton is installed, the
device type is in :data:`TRITON_DEVICES`, and the kernels pass :func:`check_triton` against the
operator's algebra evaluated in fp64 (:func:`oretrofit._attention_kernels._math_forward` with the
key bias ``log p_j``, gated by ``p_i σ(L_i − log ε)``). A failure is reported once as a
``RuntimeWarning``; OAttention then computes in fp32 on its other paths.
"""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import Tensor

from . import _attention_kernels as kernels

__all__ = ["TRITON_DEVICES", "triton_for", "check_triton"]

# Device types the Triton route serves. The tests add "cpu": with TRITON_INTERPRET=1 set before
# Triton is imported, Triton's interpreter runs the kernels on CPU tensors.
TRITON_DEVICES: tuple[str, ...] = ("cuda",)
# Half the bf16 spacing times a few roundings; fp32/fp64 compute the softmax statistics in fp32.
_CHECK_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 3e-2, torch.float32: 1e-4}

_CHECKED: dict[tuple[str, torch.dtype, str], bool] = {}


def triton_for(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the Triton kernels serve inputs of ``dtype`` on ``device`` (module docstring)."""
    key = (device.type, dtype, torch.__version__)
    if key not in _CHECKED:
        _check(key, device, dtype)
    return _CHECKED[key]


@torch.compiler.disable
def _check(key: tuple[str, torch.dtype, str], device: torch.device, dtype: torch.dtype) -> None:
    """Check the kernels for ``key`` into ``_CHECKED``; run eagerly even inside a compiled call
    (Dynamo cannot trace the check's seeded generator)."""
    ready = (device.type in TRITON_DEVICES and dtype in _CHECK_TOLERANCE
             and importlib.util.find_spec("triton") is not None)
    if ready:
        failure = check_triton(device, dtype)
        if failure:
            kernels._report_failed_check("the Triton OAttention kernel", device, dtype,
                                         failure, "OAttention computes in fp32 there")
            ready = False
    _CHECKED[key] = ready


def _exact(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor, visible: Tensor,
           eps: float, scale: float) -> Tensor:
    """``p_i σ(L_i − log ε) o_i`` with ``o, L`` the attention with key bias ``log p_j``
    (``_NULL_LOGIT`` for null or masked sources), all in the inputs' dtype (fp64 here)."""
    pk = p_k[:, None, None, :]
    live = pk != 0
    logit = torch.where(live, torch.log(torch.where(live, pk, torch.ones_like(pk))),
                        kernels._NULL_LOGIT)
    o, lse = kernels._math_forward(q, k, v, torch.where(visible, logit, kernels._NULL_LOGIT),
                                   scale)
    return p_q[:, None, :, None] * torch.sigmoid(lse - math.log(eps))[..., None] * o


def check_triton(device: torch.device, dtype: torch.dtype) -> str:
    """'' when the kernels meet the operator's algebra (:func:`_exact` in fp64 on the same
    rounded inputs) on a tiny GQA case with a null source, a null receiver, empty rows and a
    broadcast mask, forward and every gradient; else what failed."""
    from ._attention_triton import o_attention_triton
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g).to(device, dtype)
               for shape in ((2, 2, 5, 16), (2, 1, 7, 16), (2, 1, 7, 16)))
    p_q, p_k = torch.rand(2, 5, generator=g) + 0.1, torch.rand(2, 7, generator=g) + 0.1
    p_q[0, 1] = p_k[0, 2] = 0.0
    p_k[1] = 0.0                                                            # batch 1: empty rows
    p_q, p_k = p_q.to(device), p_k.to(device)
    visible = torch.ones(1, 1, 5, 7, dtype=torch.bool, device=device)
    visible[..., 3] = False
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v, p_q, p_k)]
    reference = [t.detach().double().requires_grad_() for t in (q, k, v, p_q, p_k)]
    try:
        out = o_attention_triton(*inputs, visible, None, 1e-6, 0.25)
        want = _exact(*reference, visible, 1e-6, 0.25)
        d_out = torch.randn(out.shape, generator=g).to(device, dtype)
        out.backward(d_out)
        want.backward(d_out.double())
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    if not bool((out[1] == 0).all()) or not bool((out[0, :, 1] == 0).all()):
        return "empty or null-receiver rows are not exact zeros"
    tol = _CHECK_TOLERANCE[dtype]
    pairs = [("out", out, want)] + [(name, a.grad, b.grad) for name, a, b in
                                    zip(("dq", "dk", "dv", "dp_q", "dp_k"), inputs, reference)]
    for name, got, expected in pairs:
        error = ((got.detach().double() - expected.detach()).abs().max()
                 / expected.detach().abs().max().clamp_min(1e-30))
        if not bool(error <= tol):
            return f"{name} differs (relative error {float(error):.2g} > {tol})"
    return ""
