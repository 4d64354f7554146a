"""The TabICL host: the sites of a ``tabicl._model.tabicl.TabICL`` model
(:mod:`oretrofit.hosts.tabicl.sites`) for the tabicl releases it admits
(:mod:`oretrofit.hosts.tabicl.releases`).

A model the O-mixins cannot retrofit exactly is refused by name in :meth:`TabICLHost.check`:
post-norm blocks (``norm_first=False``) and the affine column embedding (``col_affine=True``,
whose ``features · W(h) + b(h)`` emits ``b`` for a null cell token).
"""

from __future__ import annotations

from torch import nn

from ..._surgery.host import RetrofitError, Site, register_host
from . import releases

__all__ = ["TabICLHost"]

# the model class, where each tabicl release defines it (2.1.0+: ``_model``; before: ``model``),
# so that a release the gate refuses is refused by name rather than matched by no host
VENDOR_CLASSES = ("tabicl._model.tabicl.TabICL", "tabicl.model.tabicl.TabICL")


class TabICLHost:
    """Sites of a TabICL model (classifier or regressor: one class, ``max_classes`` tells)."""

    name = "tabicl"
    specificity = 20

    def matches(self, model: nn.Module) -> bool:
        return any(f"{c.__module__}.{c.__qualname__}" in VENDOR_CLASSES
                   for c in type(model).__mro__)

    def check(self, model: nn.Module) -> None:
        """The release gate first, then what the O-mixins cannot retrofit exactly."""
        releases.check_release(releases.installed_version())
        if not model.norm_first:
            raise RetrofitError("this TabICL model has post-norm blocks (norm_first=False); the "
                                "TabICL host retrofits pre-norm models only, as every released "
                                "checkpoint is")
        if model.col_affine:
            raise RetrofitError("this TabICL model has the affine column embedding "
                                "(col_affine=True), which gives a null cell token a non-zero "
                                "embedding; the TabICL host retrofits col_affine=False models "
                                "only")

    def version(self, model: nn.Module | None = None) -> dict[str, str]:
        """The tabicl release, and the ``model``'s task (``classifier`` or ``regressor``)."""
        out = {"tabicl": releases.installed_version() or "missing"}
        if model is not None:
            out["task"] = "classifier" if model.max_classes > 0 else "regressor"
        return out

    def sites(self, model: nn.Module) -> list[Site]:
        from .sites import sites
        return sites(model)


HOST = register_host(TabICLHost())
