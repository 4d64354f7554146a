"""The ``--spec FILE`` of `check` and `patch`: read and checked by :func:`oretrofit.read_spec`,
its refusal named by the flag and the file (as `regress` names its ``--tau-spec``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["read_spec_option"]


def read_spec_option(path: Path, flag: str = "--spec") -> dict[str, Any]:
    """The patch spec at ``path``; a :class:`RetrofitError` that starts ``FLAG PATH:`` otherwise."""
    from oretrofit import RetrofitError, read_spec
    try:
        return dict(read_spec(path))
    except RetrofitError as exc:
        raise RetrofitError(f"{flag} {path}: {exc}") from None
