"""The tabicl releases the TabICL host admits.

The gate admits exactly :data:`TESTED_RELEASES`, the rows of ``results/tabicl-compat.md`` that
pass (``scripts/tabicl_compat.py`` runs the host's tests on each release in its own
environment); every other release, older or newer, is refused by name with the fix. Before
2.1.0 the model class lived in ``tabicl.model`` (the host matches it there too, to refuse it by
name); before 2.2.0 ``TabICL`` takes no ``zero_init`` (see
:func:`oretrofit.hosts.tabicl.checkpoints.random_model`).
"""

from __future__ import annotations

import functools

from ..._files.provenance import package_version
from ..._surgery.host import check_tested_release

__all__ = ["TESTED_RELEASES", "installed_version", "check_release"]

TESTED_RELEASES: tuple[str, ...] = ("2.1.0", "2.1.1", "2.2.0")


@functools.cache
def installed_version() -> str | None:
    """The installed tabicl version (read once), or None when tabicl is not installed."""
    return package_version("tabicl")


def check_release(version: str | None) -> None:
    """Refuse a tabicl release the host has not been shown to work with, naming the fix."""
    check_tested_release("TabICL", "tabicl", version, TESTED_RELEASES,
                         f"pip install 'tabicl>={TESTED_RELEASES[0]},<={TESTED_RELEASES[-1]}' "
                         "(or pip install 'oretrofit[tabicl]')")
