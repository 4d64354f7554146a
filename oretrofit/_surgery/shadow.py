"""Shadows: per-call copies of a module that share its weights, so what one forward hooks or
sets on its shadow stays out of the module and out of other threads' forwards (the padded
forwards of the tabular hosts zero the padding's tokens on shadows of the model's token
makers)."""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

__all__ = ["shadow"]


def shadow(module: nn.Module, children: dict[str, nn.Module] | None = None,
           **attributes: Any) -> nn.Module:
    """A shallow copy of ``module`` for one call: it shares the parameters, buffers and
    submodules but has its own attribute dict, hook tables and (with ``children``) its own
    table of submodules, so what is set on it, hooked on it or swapped in leaves ``module``
    untouched and other threads running ``module`` see nothing of it."""
    copied = copy.copy(module)
    for name, value in module.__dict__.items():
        if name.endswith("hooks") and isinstance(value, dict):
            copied.__dict__[name] = type(value)(value)
    if children:
        copied.__dict__["_modules"] = {**module._modules, **children}
    copied.__dict__.update(attributes)
    return copied
