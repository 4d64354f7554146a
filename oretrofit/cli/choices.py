"""Options that take one of a fixed set of values, checked when the command line is parsed.

Every such option gets its callback from :func:`one_of` (a plain set of names) or
:func:`checked_by` (a name the domain code parses, such as an inference preset with its ``-xN``
suffix), so a value outside the set is refused before any work starts, as click's usage error
``Invalid value for '--FLAG': ...`` that names the value and the choices. The sets come from the
modules that own them, imported only when the option is given (``oretrofit --help`` imports no
torch).
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable, Optional

import typer

__all__ = ["ARMS", "O_ARMS", "INFERENCE_PRESET", "INFERENCE_PRECISIONS", "checked_by", "names_in",
           "one_of"]

Callback = Callable[[Optional[str]], Optional[str]]


def checked_by(check: Callable[[str], object]) -> Callback:
    """An option callback that passes None and every value ``check`` accepts; the ValueError
    ``check`` raises for any other value (its message names the choices) becomes a usage error."""
    def callback(value: Optional[str]) -> Optional[str]:
        if value is not None:
            try:
                check(value)
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from None
        return value
    return callback


def one_of(values: Callable[[], Iterable[str]]) -> Callback:
    """An option callback that passes None and the names ``values()`` gives, and refuses any other
    value naming them all (``values`` is called only when the option is given)."""
    def check(value: str) -> None:
        allowed = list(values())
        if value not in allowed:
            raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
    return checked_by(check)


def names_in(module: str, name: str) -> Callable[[], Iterable[str]]:
    """``values`` for :func:`one_of`: the names ``module.name`` holds, imported when called."""
    return lambda: getattr(importlib.import_module(module), name)


def _check_preset(value: str) -> None:
    from oretrofit.demo_host.inference import check_preset
    check_preset(value)


ARMS = one_of(names_in("oretrofit._surgery.registry", "ARMS"))           # base, oa, full-o
O_ARMS = one_of(lambda: ("oa", "full-o"))                           # the arms that patch sites
INFERENCE_PRECISIONS = one_of(lambda: ("float32", "float16", "bfloat16", "auto", "autocast"))
INFERENCE_PRESET = checked_by(_check_preset)                        # a preset, -xN members
