"""The tabdpt releases the TabDPT host admits: exactly :data:`TESTED_RELEASES`, the releases its
tests (``make test-tabdpt``, in an environment of its own) have run on. Every other release is
refused by name with the fix, since an untested release may have changed the layer the O-mixin
replaces (:mod:`oretrofit.hosts.tabdpt.blocks`) and would otherwise be patched silently wrong.
"""

from __future__ import annotations

import functools
import importlib.metadata as _md

from ..._surgery.host import check_tested_release

__all__ = ["TESTED_RELEASES", "installed_version", "check_release", "FIX"]

TESTED_RELEASES: tuple[str, ...] = ("1.3.1",)
FIX = f"pip install 'tabdpt=={TESTED_RELEASES[-1]}'"


@functools.cache
def installed_version() -> str | None:
    """The installed tabdpt version (read once), or None when tabdpt is not installed."""
    return next((found.version for found in _md.distributions(name="tabdpt")), None)


def check_release(version: str | None) -> None:
    """Refuse a tabdpt release the host has not been shown to work with, naming the fix."""
    check_tested_release("TabDPT", "tabdpt", version, TESTED_RELEASES, FIX)
