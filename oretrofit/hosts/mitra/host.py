"""The Mitra host: the named sites of autogluon's ``Tab2D`` (the Mitra model; the releases it
admits are in :mod:`oretrofit.hosts.mitra.releases`, the O-mixin in
:mod:`oretrofit.hosts.mitra.blocks`, the token boundary in :mod:`oretrofit.hosts.mitra.padding`).

Tokens are cells ``(b, s, f + 1, d)``, born at one boundary: per row, the label token
(``y_embedding``: the support row's label, or the learned mask token of a query row) packed
before the row's feature tokens (``x_embedding`` of the quantile-normalised values). The label is
a token of its own, not an addition to another token, so the model has no inject site. Each
layer ``k``: attention across rows, FFN, attention across features, FFN, pre-norm. Sites, in
forward order:

=================  =========  ==========================================================
site               kind       carrier (presence read from it)
=================  =========  ==========================================================
rows.k.norm        norm       the cells entering ``layer_norm1`` and ``layer_norm2``
rows.k.attn        attention  receivers: a column's support and query cells; sources: the
                              column's support cells
rows.k.ffn         ffn        the cells before ``layer_norm2``
features.k.norm    norm       the cells entering ``layer_norm3`` and ``layer_norm4``
features.k.attn    attention  one row's cells (label and features), self-attention
features.k.ffn     ffn        the cells before ``layer_norm4``
out_norm           norm       query cells entering ``final_layer_norm``
=================  =========  ==========================================================

The head (``final_layer``) is a per-cell read-out of the query label cells, not a residual
branch, and is left as is.
"""

from __future__ import annotations

from torch import nn

from ..._surgery.host import (RetrofitError, Site, check_known_modules, register_host,
                              vendor_class)
from ..torch_nn import norm_site, patch
from . import releases

__all__ = ["MitraHost", "VENDOR_MODULE", "sites", "check_model"]

VENDOR_MODULE = "autogluon.tabular.models.mitra._internal.models.tab2d"
_EMBEDDING_MODULE = "autogluon.tabular.models.mitra._internal.models.embedding"
# the module types a Tab2D is built of: Mitra's (gated by a site, or where tokens are born) and
# torch.nn's token-local layers and containers
_KNOWN = {VENDOR_MODULE: {"Tab2D", "Layer", "MultiheadAttention"},
          _EMBEDDING_MODULE: {"Tab2DQuantileEmbeddingX", "Tab2DEmbeddingX",
                              "Tab2DEmbeddingYClasses", "Tab2DEmbeddingYRegression"},
          "torch.nn": {"Linear", "LayerNorm", "Embedding", "ModuleList"}}


def check_model(model: nn.Module) -> None:
    """Refuse the flash-attn path and any module of a type the sites do not account for."""
    if getattr(model, "use_flash_attn", False):
        raise RetrofitError("this Mitra model runs its flash-attn path (built on CUDA with "
                            "flash_attn installed); the Mitra host retrofits the dense path "
                            "only: build it without flash_attn installed, or on the CPU")
    check_known_modules(model, "Mitra", _KNOWN, "autogluon", releases.FIX)


def _axis_sites(axis: str, k: int, layer: nn.Module, norms: tuple[nn.Module, nn.Module],
                attention: str) -> list[Site]:
    from .blocks import OLayer
    return [norm_site(f"{axis}.{k}.norm", f"cells entering the {axis} attention and FFN norms",
                      *norms),
            Site(f"{axis}.{k}.attn", "attention", attention, patch(layer, OLayer, f"{axis}.attn"),
                 modules=(layer,)),
            Site(f"{axis}.{k}.ffn", "ffn", f"cells before the {axis} FFN",
                 patch(layer, OLayer, f"{axis}.ffn"), modules=(layer,))]


def sites(model: nn.Module) -> list[Site]:
    """The sites of a ``Tab2D`` (see the module docstring)."""
    found: list[Site] = []
    for k, layer in enumerate(model.layers):
        found += _axis_sites("rows", k, layer, (layer.layer_norm1, layer.layer_norm2),
                             "receivers: a column's support and query cells; sources: its "
                             "support cells")
        found += _axis_sites("features", k, layer, (layer.layer_norm3, layer.layer_norm4),
                             "one row's cells (label and features)")
    found.append(norm_site("out_norm", "query cells entering final_layer_norm",
                           model.final_layer_norm))
    return found


class MitraHost:
    """Sites of autogluon's Mitra model ``Tab2D`` (see the module docstring)."""

    name = "mitra"
    specificity = 20
    supports = (f"autogluon's Mitra model {VENDOR_MODULE}.Tab2D (autogluon.tabular "
                f"{', '.join(releases.TESTED_RELEASES)})")

    def matches(self, model: nn.Module) -> bool:
        """A model of Mitra's class: one exists only where autogluon's Mitra imports."""
        cls = vendor_class(model, (VENDOR_MODULE,))
        return cls.__module__ == VENDOR_MODULE and cls.__name__ == "Tab2D"

    def check(self, model: nn.Module) -> None:
        releases.check_release(releases.installed_version())
        check_model(model)

    def version(self, model: nn.Module | None = None) -> dict[str, str]:
        """The autogluon.tabular release, and the ``model``'s task."""
        out = {"autogluon.tabular": releases.installed_version() or "missing"}
        if model is not None:
            out["task"] = str(getattr(model.task, "name", model.task)).lower()
        return out

    def sites(self, model: nn.Module) -> list[Site]:
        return sites(model)


HOST = register_host(MitraHost())
