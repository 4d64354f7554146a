"""The autogluon.tabular releases the Mitra host admits: exactly :data:`TESTED_RELEASES`, the
releases its tests (``make test-mitra``, in an environment of its own) have run on: the receipt
``results/autogluon-compat.md`` (``scripts/autogluon_compat.py``) runs them on every release
that ships Mitra. Every other release is refused by name with the fix, since an untested release
may have changed the layer the O-mixin replaces (:mod:`oretrofit.hosts.mitra.blocks`) and would
otherwise be patched silently wrong.
"""

from __future__ import annotations

import functools

from ..._files.provenance import package_version
from ..._surgery.host import check_tested_release

__all__ = ["TESTED_RELEASES", "installed_version", "check_release", "FIX"]

TESTED_RELEASES: tuple[str, ...] = ("1.6.0", "1.6.1", "1.6.2", "1.6.3")
FIX = f"pip install 'autogluon.tabular[mitra]=={TESTED_RELEASES[-1]}'"


@functools.cache
def installed_version() -> str | None:
    """The installed autogluon.tabular version (read once), or None when it is not installed."""
    return package_version("autogluon.tabular")


def check_release(version: str | None) -> None:
    """Refuse a autogluon.tabular release the host has not been shown to work with, naming the fix."""
    check_tested_release("Mitra", "autogluon.tabular", version, TESTED_RELEASES, FIX)
