"""Which kernel route serves an OAttention call: one table, one decision, one check cache.

:data:`ROUTES`, in order of preference. The first four compute OAttention in q's dtype with
the softmax statistics in fp32 (bf16/fp16 under ``precision="auto"``; fp32 only for a softcap
or dropout, which the later routes lack):

1. ``triton``: the fused kernel pair of :mod:`oretrofit._kernels.triton` (also softcap, dropout;
   causality as a flag, the tiles above the diagonal skipped);
2. ``cudnn``: cuDNN attention with the key bias and its LSE (:mod:`oretrofit._kernels.cudnn`);
3. ``flex``: compiled FlexAttention with a ``score_mod`` (:mod:`oretrofit._kernels.flex`;
   softcap);
4. ``efficient``: the memory-efficient kernel in the inputs' dtype.

In the compute dtype (fp32, fp64 for fp64 inputs; half-precision inputs on upcast copies):

5. ``cpu-flash``: the CPU flash kernel pair (fp32, fp64);
6. ``cuda-efficient``: the memory-efficient kernel (fp32);
7. ``augmented-copy``: one ``scaled_dot_product_attention`` call on augmented copies
   (:mod:`oretrofit._kernels.sdpa`): any device, dtype and shape.

Routes 2, 4, 5 and 6 are kernel backends of :func:`oretrofit._kernels.lse.o_attention_lse`, which
composes ``out_i = p_i σ(L_i − log ε) o_i`` and its backward in one place; route 3 composes the
same gate (:func:`oretrofit._kernels.lse.sink_gate`) under autograd.

:func:`route_for` decides every call: the first route that serves it (device, dtype, head size,
shapes, softcap, dropout) and passes its check for (device type, dtype, torch version), decided
once into one cache; None where only the operator's reference path serves it (weights asked
for, or a softcap or dropout no route computes). A kernel backend is checked against the
kernel contract (:func:`.lse.check_backend`), the other routes against the operator's algebra
in fp64 on the same rounded inputs (:func:`check_route`: a GQA case with a null source, a null
receiver, empty rows and a broadcast mask) at the call's head dim rounded up to a power of two
(:func:`head_bucket`: the fused kernels' tile width, on which their configuration and shared
memory depend), one check per bucket. A route that fails, or whose kernels do not compile for the
device (Triton's ``OutOfResources``, ``CompilationError``, ``PTXASError``), is reported once
(``RuntimeWarning``) and the next is tried.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass
from functools import cache
from typing import Callable

import torch
from torch import Tensor

from . import lse as kernels
from .dtypes import as_dtype, compute_dtype
from .sdpa import o_attention_sdpa

__all__ = ["Route", "ROUTES", "PRECISIONS", "route_for", "check_route", "check_routes",
           "describe"]

# (q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p[, causal=True]) -> out in
# q's dtype.
Run = Callable[..., Tensor]
# Half the bf16 spacing times a few roundings; fp32/fp64 compute the softmax statistics in fp32.
_CHECK_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 3e-2, torch.float32: 1e-4}
HALF = (torch.bfloat16, torch.float16)
# "auto": half precision takes the routes in q's dtype; "fp32": it is computed in fp32
PRECISIONS = ("auto", "fp32")


@dataclass(frozen=True)
class Route:
    """One candidate: where it can run and what it serves. ``ready()``: its package or ops are
    present; ``head_multiple``, ``max_head_size``: the head sizes it takes; ``softcap``/``dropout``: whether it
    computes those (a call with them skips routes without); ``causal``: whether its run takes
    causality as a flag (``causal=True``; for the others the caller builds the relation into the
    mask). ``devices``: device types (None:
    any); ``dtypes``: the dtypes it computes in; ``in_q_dtype``: in q's dtype, else on copies
    in the compute dtype; ``any_shape``: it also serves empty inputs, a value head size unlike
    q's and a mask that requires grad; ``check(device, dtype)``: '' or what failed (default:
    :func:`check_route` on ``run``)."""

    name: str
    devices: tuple[str, ...] | None
    ready: Callable[[], bool]
    run: Run
    head_multiple: int = 1
    max_head_size: int | None = None
    softcap: bool = False
    dropout: bool = False
    dtypes: tuple[torch.dtype, ...] = (*HALF, torch.float32)
    in_q_dtype: bool = True
    any_shape: bool = False
    causal: bool = False
    check: Callable[[torch.device, torch.dtype], str] | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                 visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                 softcap: float | None, dropout_p: float, causal: bool = False) -> Tensor:
        """OAttention on this route, out in q's dtype (``visible``/``bias`` in the compute
        dtype; ``causal`` only on a route that takes it)."""
        flags = {"causal": True} if causal else {}
        if self.in_q_dtype:
            return self.run(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p,
                            **flags)
        ct = compute_dtype(q.dtype)
        out = self.run(as_dtype(q, ct), as_dtype(k, ct), as_dtype(v, ct), as_dtype(p_q, ct),
                       as_dtype(p_k, ct), visible, bias, eps, scale, softcap, dropout_p, **flags)
        return as_dtype(out, q.dtype)


def _run_triton(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p,
                causal=False) -> Tensor:
    from .triton import o_attention_triton
    return o_attention_triton(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p,
                              None, causal)


def _run_flex(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p) -> Tensor:
    from .flex import o_attention_flex
    return o_attention_flex(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap)


def backend_run(make: Callable[[], kernels.Backend | None]) -> Run:
    """A route's run on the :class:`oretrofit._kernels.lse.Backend` that ``make`` builds:
    :func:`oretrofit._kernels.lse.o_attention_lse` in q's dtype."""
    def run(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p) -> Tensor:
        return kernels.o_attention_lse(q, k, v, p_q, p_k, visible, bias, eps, scale, make())
    return run


def backend_check(make: Callable[[], kernels.Backend | None]
                  ) -> Callable[[torch.device, torch.dtype], str]:
    """A kernel backend route's check: the kernel contract (:func:`.lse.check_backend`)."""
    return lambda device, dtype: kernels.check_backend(make(), device, dtype)


@cache
def _cudnn() -> kernels.Backend | None:
    from .cudnn import cuda_cudnn_backend
    return cuda_cudnn_backend()


@cache
def _efficient() -> kernels.Backend | None:
    return kernels._cuda_backend(tiled=False)


@cache
def _cpu_flash() -> kernels.Backend | None:
    return kernels._cpu_backend()


@cache
def _cuda_efficient() -> kernels.Backend | None:
    return kernels._cuda_backend(tiled=True)


def _flex_ready() -> bool:
    from .flex import compiled_flex
    return compiled_flex() is not None


def _public_sdpa(device: torch.device, dtype: torch.dtype) -> str:
    """The augmented-copy route's check: none, it calls public torch only."""
    return ""


ROUTES: tuple[Route, ...] = (
    Route("triton", ("cuda",), lambda: importlib.util.find_spec("triton") is not None,
          _run_triton, max_head_size=256, softcap=True, dropout=True, causal=True),
    Route("cudnn", ("cuda",), lambda: _cudnn() is not None, backend_run(_cudnn), head_multiple=8),
    Route("flex", ("cuda",), _flex_ready, _run_flex, softcap=True),
    Route("efficient", ("cuda",), lambda: _efficient() is not None, backend_run(_efficient),
          head_multiple=8),
    Route("cpu-flash", ("cpu",), lambda: _cpu_flash() is not None, backend_run(_cpu_flash),
          dtypes=(torch.float32, torch.float64), in_q_dtype=False,
          check=backend_check(_cpu_flash)),
    Route("cuda-efficient", ("cuda",), lambda: _cuda_efficient() is not None,
          backend_run(_cuda_efficient), head_multiple=8, dtypes=(torch.float32,),
          in_q_dtype=False, check=backend_check(_cuda_efficient)),
    Route("augmented-copy", None, lambda: True, o_attention_sdpa,
          dtypes=(torch.float32, torch.float64), in_q_dtype=False, any_shape=True,
          check=_public_sdpa),
)

# (route, device type, dtype it computes in, head-dim bucket, torch version) -> whether it
# passed its check
_CHECKED: dict[tuple[str, str, torch.dtype, int, str], bool] = {}


@cache
def _compile_errors() -> tuple[type[Exception], ...]:
    """Triton's errors for a kernel that does not compile or fit the device (their common base
    class), where Triton is installed."""
    if importlib.util.find_spec("triton") is None:
        return ()
    from triton.errors import TritonError
    return (TritonError,)


def head_bucket(head_size: int) -> int:
    """The head dim a route's check runs at for ``head_size``: the next power of two, ≥ 16."""
    return max(16, 1 << (head_size - 1).bit_length())


def route_for(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
              softcap: bool = False, dropout: bool = False, need_weights: bool = False,
              precision: str = "auto") -> Route | None:
    """The route of an OAttention call on these (validated) inputs: the first of
    :data:`ROUTES` that serves it and passes its check (module docstring); None where only the
    reference path serves it (``need_weights``, or a softcap or dropout no route computes)."""
    if need_weights:
        return None
    dtype, head = q.dtype, q.shape[-1]
    kernel_shapes = (q.numel() > 0 and k.numel() > 0 and v.shape[-1] == head
                     and not (mask is not None and mask.requires_grad))
    in_q_dtype = k.dtype == v.dtype == dtype and (
        (dtype in HALF and precision == "auto")
        or (dtype == torch.float32 and (softcap or dropout)))
    for route in ROUTES:
        if ((route.in_q_dtype and not in_q_dtype) or not (route.any_shape or kernel_shapes)
                or (softcap and not route.softcap) or (dropout and not route.dropout)):
            continue
        computes_in = dtype if route.in_q_dtype else compute_dtype(dtype)
        if ((route.devices is None or q.device.type in route.devices)
                and computes_in in route.dtypes and head % route.head_multiple == 0
                and (route.max_head_size is None or head <= route.max_head_size)
                and _passes(route, q.device, computes_in, head_bucket(head))):
            return route
    return None


def _passes(route: Route, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether ``route`` is ready and meets its check on (device type, dtype, head-dim bucket,
    torch version), decided once; a failure is reported once. A route with its own check (a
    kernel backend's) is checked once for every head dim."""
    head_dim = head_dim if route.check is None else 16
    key = (route.name, device.type, dtype, head_dim, torch.__version__)
    if key not in _CHECKED:
        _check(route, key, device, dtype, head_dim)
    return _CHECKED[key]


@torch.compiler.disable
def _check(route: Route, key: tuple[str, str, torch.dtype, int, str], device: torch.device,
           dtype: torch.dtype, head_dim: int) -> None:
    """Check ``route`` for ``key`` into ``_CHECKED``; run eagerly even inside a compiled call
    (Dynamo cannot trace the check's seeded generator)."""
    passed = route.ready()
    if passed:
        # The first call may come from a frozen host's no_grad or inference_mode forward (the
        # check's gradients need autograd) or from inside an autocast region (the check computes
        # in the dtype it is asked about, not the region's: a bf16 autocast on a CPU would fail
        # an fp32 check and turn the route off for the whole process).
        with torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast(device.type, enabled=False):
            failure = (route.check(device, dtype) if route.check is not None
                       else check_route(route.run, device, dtype, head_dim))
        if failure:
            at = "" if route.check is not None else f"head dim {head_dim}: "
            warnings.warn(f"oretrofit: the {route.name} OAttention route fails its check on "
                          f"{device.type} {dtype} ({at}{failure}); OAttention takes the next "
                          "route there", RuntimeWarning, stacklevel=6)
            passed = False
    _CHECKED[key] = passed


def check_routes(device: torch.device, dtype: torch.dtype) -> None:
    """Run now the checks :func:`route_for` runs for plain calls of ``dtype`` on ``device``
    under either precision (the routes in order, up to the first that passes), outside any
    compiled call: there a first check breaks the graph, and the next call recompiles."""
    q = torch.zeros(1, 1, 1, 16, dtype=dtype, device=device)
    for precision in PRECISIONS:
        route_for(q, q, q, precision=precision)


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
    empty rows and a broadcast mask, forward and every gradient; else what failed (a kernel that
    does not compile for the device included)."""
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
    takes on ``device``, marked ``(fp32 compute)`` where half precision is computed in fp32
    (what the GPU receipts record)."""
    q = torch.zeros(1, 1, 1, head_size, dtype=dtype, device=device)
    route = route_for(q, q, q)
    return route.name + (" (fp32 compute)" if dtype in HALF and not route.in_q_dtype else "")
