"""The TabPFN host: one host for every TabPFN model version, dispatching on the table of
:mod:`oretrofit.hosts.tabpfn.versions` (the sites of each version are documented in its own
module: :mod:`~oretrofit.hosts.tabpfn.v2_5` (v2.5, v2.6), :mod:`~oretrofit.hosts.tabpfn.v3`,
:mod:`~oretrofit.hosts.tabpfn.v3_5`); the tabpfn
releases it admits are in :mod:`oretrofit.hosts.tabpfn.releases`.
"""

from __future__ import annotations

from torch import nn

from ..._surgery.host import Site, register_host
from . import releases, versions

__all__ = ["TabPFNHost"]


class TabPFNHost:
    """Sites of any supported ``tabpfn.architectures`` model (see :mod:`.versions`)."""

    name = "tabpfn-v3"            # the name specs and calibration records carry (kept as is)
    specificity = 20

    def matches(self, model: nn.Module) -> bool:
        """Any tabpfn architecture, so that the other versions get a clear refusal in check."""
        return any(versions.is_vendor_class(c) for c in type(model).__mro__)

    def check(self, model: nn.Module) -> None:
        row = versions.version_of(model)
        releases.check_release(releases.installed_version())
        versions.check_modules(model, row)

    def version(self, model: nn.Module | None = None) -> dict[str, str]:
        """The tabpfn release, and the ``model``'s architecture (``tabpfn_v2_5`` … ``tabpfn_v3_5``)."""
        out = {"tabpfn": releases.installed_version() or "missing"}
        if model is not None:
            out["architecture"] = versions.version_of(model).architecture_name
        return out

    def sites(self, model: nn.Module) -> list[Site]:
        return versions.sites(model, versions.version_of(model))


HOST = register_host(TabPFNHost())
