"""The dtypes the O-operators compute in, and the numbers they compute with.

Every operator computes in fp32 (fp64 for fp64 inputs) whatever its inputs' precision; these
helpers convert without a copy where nothing changes and keep Python numbers as cached 0-dim
tensors, so a decode step pays no per-call conversion.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["compute_dtype", "as_dtype", "number_like"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision the O-operators compute in: fp64 stays fp64, everything else is fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_dtype(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``; ``t`` itself where it is in it already, without calling ``Tensor.to``,
    which parses its arguments (microseconds) even when it returns ``t``: a decode step calls
    the O-components once per layer and site."""
    return t if t.dtype == dtype else t.to(dtype)


# (number, dtype) -> the number as a 0-dim CPU tensor of that dtype (number_like)
_NUMBERS: dict[tuple[float, torch.dtype], Tensor] = {}


def number_like(value: float, like: Tensor) -> Tensor | float:
    """``value`` for an elementwise op with ``like`` (fp32 or fp64): a 0-dim CPU tensor of its
    dtype, made once per value. An op on a Python number wraps the number into a new tensor at
    every call, microseconds per layer and site in a decode step; a 0-dim tensor of the op's
    dtype promotes as the number does and gives the same bits (the op casts the number to that
    dtype either way). The number itself for other dtypes (a half-precision op computes with the
    number in fp32), for a tensor subclass (a fake tensor takes no real operand) and while
    torch.compile traces (a constant there)."""
    if (type(like) is not Tensor or like.dtype not in (torch.float32, torch.float64)
            or torch.compiler.is_compiling()):
        return value
    key = (value, like.dtype)
    number = _NUMBERS.get(key)
    if number is None:
        with torch.inference_mode(False):             # usable outside inference mode as well
            number = _NUMBERS[key] = torch.tensor(value, dtype=like.dtype, device="cpu")
    return number
