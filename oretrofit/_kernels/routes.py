"""Which kernel route serves a half-precision OAttention call: a chain of checked candidates.

:data:`ROUTES`, in the order issue 55 asks for them, each computing OAttention in q's dtype with
the softmax statistics in fp32:

1. ``triton``: the fused kernel pair of :mod:`oretrofit._kernels.triton` (also softcap, dropout);
2. ``cudnn``: cuDNN attention with the key bias and its LSE (:mod:`oretrofit._kernels.cudnn`);
3. ``flex``: compiled FlexAttention with a ``score_mod`` (:mod:`oretrofit._kernels.flex`;
   softcap);
4. ``efficient``: the memory-efficient kernel in the inputs' dtype.

Routes 2 and 4 are kernel backends of :func:`oretrofit._kernels.lse.o_attention_lse`, which
composes ``out_i = p_i σ(L_i − log ε) o_i`` and its backward in one place; route 3 composes the
same gate (:func:`oretrofit._kernels.lse.sink_gate`) under autograd.

:func:`route_for` gives the first route that serves the call (its device, dtype, head size and
features) and passes :func:`check_route` for that (device type, dtype, head-dim bucket, torch
version): output and every gradient against the operator's algebra in fp64 on the same rounded
inputs (a GQA case with a null source, a null receiver, empty rows and a broadcast mask) at the
call's head dim rounded up to a power of two (at least 16: the kernels' tile width, on which their
configuration and shared memory depend). A route that fails, or whose kernels do not compile for
the device (Triton's ``OutOfResources``, ``CompilationError``, ``PTXASError``), is reported once
(``RuntimeWarning``) and the next is tried; with none, OAttention computes in fp32.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from typing import Callable

import torch
from torch import Tensor

from . import lse as kernels

__all__ = ["Route", "ROUTES", "route_for", "check_route", "check_routes"]

# (q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p) -> out in q's dtype.
Run = Callable[..., Tensor]
# Half the bf16 spacing times a few roundings; fp32/fp64 compute the softmax statistics in fp32.
_CHECK_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 3e-2, torch.float32: 1e-4}


@dataclass(frozen=True)
class Route:
    """One candidate: where it can run and what it serves. ``ready()``: its package or ops are
    present; ``head_multiple``, ``max_head_size``: the head sizes it takes; ``softcap``/``dropout``: whether it
    computes those (a call with them skips routes without)."""

    name: str
    devices: tuple[str, ...]
    ready: Callable[[], bool]
    run: Run
    head_multiple: int = 1
    max_head_size: int | None = None
    softcap: bool = False
    dropout: bool = False


def _run_triton(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p) -> Tensor:
    from .triton import o_attention_triton
    return o_attention_triton(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p)


def _run_flex(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p) -> Tensor:
    from .flex import o_attention_flex
    return o_attention_flex(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap)


def backend_run(make: Callable[[], kernels.Backend | None]) -> Run:
    """A route's run on the :class:`oretrofit._kernels.lse.Backend` that ``make`` builds:
    :func:`oretrofit._kernels.lse.o_attention_lse` in q's dtype."""
    def run(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p) -> Tensor:
        return kernels.o_attention_lse(q, k, v, p_q, p_k, visible, bias, eps, scale, make())
    return run


@cache
def _cudnn() -> kernels.Backend | None:
    from .cudnn import cuda_cudnn_backend
    return cuda_cudnn_backend()


@cache
def _efficient() -> kernels.Backend | None:
    return kernels._cuda_backend(tiled=False)


def _flex_ready() -> bool:
    from .flex import compiled_flex
    return compiled_flex() is not None


ROUTES: tuple[Route, ...] = (
    Route("triton", ("cuda",), lambda: importlib.util.find_spec("triton") is not None,
          _run_triton, max_head_size=256, softcap=True, dropout=True),
    Route("cudnn", ("cuda",), lambda: _cudnn() is not None, backend_run(_cudnn), head_multiple=8),
    Route("flex", ("cuda",), _flex_ready, _run_flex, softcap=True),
    Route("efficient", ("cuda",), lambda: _efficient() is not None, backend_run(_efficient),
          head_multiple=8),
)

_CHECKED: dict[tuple[str, str, torch.dtype, int, str], bool] = {}


@cache
def _compile_errors() -> tuple[type[Exception], ...]:
    """Triton's errors for a kernel that does not compile or fit the device (its common base
    class), where Triton is installed."""
    if importlib.util.find_spec("triton") is None:
        return ()
    from triton.errors import TritonError
    return (TritonError,)


def head_bucket(head_size: int) -> int:
    """The head dim a route's check runs at for ``head_size``: the next power of two, ≥ 16."""
    return max(16, 1 << (head_size - 1).bit_length())


def route_for(device: torch.device, dtype: torch.dtype, head_size: int, softcap: bool = False,
              dropout: bool = False) -> Route | None:
    """The first of :data:`ROUTES` that serves the call and passes its check (module docstring);
    None: OAttention computes in fp32."""
    for route in ROUTES:
        if (device.type in route.devices and _takes(route, head_size)
                and (route.softcap or not softcap) and (route.dropout or not dropout)
                and _passes(route, device, dtype, head_bucket(head_size))):
            return route
    return None


def _takes(route: Route, head_size: int) -> bool:
    return head_size % route.head_multiple == 0 and (route.max_head_size is None
                                                     or head_size <= route.max_head_size)


def _passes(route: Route, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether ``route`` is ready and meets its check on (device type, dtype, head dim, torch
    version), decided once; a failure is reported once."""
    key = (route.name, device.type, dtype, head_dim, torch.__version__)
    if key not in _CHECKED:
        _check(route, key, device, dtype, head_dim)
    return _CHECKED[key]


@torch.compiler.disable
def _check(route: Route, key: tuple[str, str, torch.dtype, int, str], device: torch.device,
           dtype: torch.dtype, head_dim: int) -> None:
    """Check ``route`` for ``key`` into ``_CHECKED``; run eagerly even inside a compiled call
    (Dynamo cannot trace the check's seeded generator)."""
    passed = dtype in _CHECK_TOLERANCE and route.ready()
    if passed:
        # The first call may come from a frozen host's no_grad or inference_mode forward;
        # the check's gradients need autograd.
        with torch.inference_mode(False), torch.enable_grad():
            failure = check_route(route.run, device, dtype, head_dim)
        if failure:
            kernels._report_failed_check(f"the {route.name} OAttention route", device, dtype,
                                         f"head dim {head_dim}: {failure}",
                                         "OAttention tries the next route, or computes in "
                                         "fp32 there")
            passed = False
    _CHECKED[key] = passed


def check_routes(device: torch.device, dtype: torch.dtype, head_size: int = 16) -> None:
    """Run now the checks :func:`route_for` runs for a plain call of ``dtype`` and
    ``head_size`` on ``device`` (the routes in order, up to the first that passes), outside any
    compiled call."""
    for route in ROUTES:
        if (device.type in route.devices and _takes(route, head_size)
                and _passes(route, device, dtype, head_bucket(head_size))):
            return


def _exact(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor, visible: Tensor,
           eps: float, scale: float) -> Tensor:
    """``p_i σ(L_i − log ε) o_i`` with ``o, L`` the attention with key bias ``log p_j``
    (``_NULL_LOGIT`` for null or masked sources), all in the inputs' dtype (fp64 here)."""
    logit = kernels.source_logit(p_k, q.dtype)[:, :, None, :]
    o, lse = kernels._math_forward(q, k, v, torch.where(visible, logit, kernels._NULL_LOGIT),
                                   scale)
    return p_q[:, None, :, None] * kernels.sink_gate(lse, eps)[..., None] * o


def check_route(run: Run, device: torch.device, dtype: torch.dtype, head_dim: int = 16) -> str:
    """'' when ``run`` meets the operator's algebra (:func:`_exact` in fp64 on the same rounded
    inputs) on a tiny GQA case of head dim ``head_dim`` with a null source, a null receiver,
    empty rows and a broadcast mask, forward and every gradient; else what failed (a kernel
    that does not compile for the device included)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g).to(device, dtype)
               for shape in ((2, 2, 5, head_dim), (2, 1, 7, head_dim), (2, 1, 7, head_dim)))
    p_q, p_k = torch.rand(2, 5, generator=g) + 0.1, torch.rand(2, 7, generator=g) + 0.1
    p_q[0, 1] = p_k[0, 2] = 0.0
    p_k[1] = 0.0                                                            # batch 1: empty rows
    p_q, p_k = p_q.to(device), p_k.to(device)
    visible = torch.ones(1, 1, 5, 7, dtype=torch.bool, device=device)
    visible[..., 3] = False
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v, p_q, p_k)]
    reference = [t.detach().double().requires_grad_() for t in (q, k, v, p_q, p_k)]
    try:
        out = run(*inputs, visible, None, 1e-6, head_dim ** -0.5, None, 0.0)
        want = _exact(*reference, visible, 1e-6, head_dim ** -0.5)
        d_out = torch.randn(out.shape, generator=g).to(device, dtype)
        out.backward(d_out)
        want.backward(d_out.double())
    except (RuntimeError, TypeError, ValueError, NotImplementedError, AttributeError,
            *_compile_errors()) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    if out.dtype != dtype or out.shape != want.shape:
        return f"out is {out.dtype} {tuple(out.shape)}, not {dtype} {tuple(want.shape)}"
    if not bool((out[1] == 0).all()) or not bool((out[0, :, 1] == 0).all()):
        return "empty or null-receiver rows are not exact zeros"
    tol = _CHECK_TOLERANCE[dtype]
    pairs = [("out", out, want)] + [(name, a.grad, b.grad) for name, a, b in
                                    zip(("dq", "dk", "dv", "dp_q", "dp_k"), inputs, reference)]
    for name, got, expected in pairs:
        if got is None:
            return f"{name} is missing"
        error = ((got.detach().double() - expected.detach()).abs().max()
                 / expected.detach().abs().max().clamp_min(1e-30))
        if not bool(error <= tol):                                          # NaN fails too
            return f"{name} differs (relative error {float(error):.2g} > {tol})"
    return ""


def describe(device: torch.device, dtype: torch.dtype, head_size: int) -> str:
    """The route a plain call (no softcap, dropout or weights) of ``dtype`` and ``head_size``
    takes on ``device``: a route's name, or the fp32 path's kernel (what the GPU receipts
    record)."""
    if dtype in (torch.bfloat16, torch.float16):
        route = route_for(device, dtype, head_size)
        if route is not None:
            return route.name
    backend = kernels.backend_for(device, torch.float32 if dtype != torch.float64 else dtype)
    name = backend.name if backend is not None and head_size % backend.head_multiple == 0 \
        else "augmented-copy"
    return name + (" (fp32 compute)" if dtype in (torch.bfloat16, torch.float16) else "")
