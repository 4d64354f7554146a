"""The TabDPT host: the named sites of a ``tabdpt.model.TabDPTModel`` (tabdpt 1.3.1; the releases
it admits are in :mod:`oretrofit.hosts.tabdpt.releases`, the O-mixin in
:mod:`oretrofit.hosts.tabdpt.blocks`, the token boundary in :mod:`oretrofit.hosts.tabdpt.padding`).

Rows are tokens: ``enc_norm(encoder(x))`` of each row's features (zero-padded to
``num_features``), after the model's learned thinking rows. Each layer ``k`` is one gated
attention of every row over the context rows, with the target embedding concatenated into the
context rows' values, then a SwiGLU FFN. Sites, in forward order:

=============  =========  ==========================================================
site           kind       carrier (presence read from it)
=============  =========  ==========================================================
icl.k.norm     norm       ``attn_norm`` and ``ff_norm``: the residual stream each reads
icl.k.te       inject     the context row's token, gating its target embedding
                          ``cls_y_encoders[k]`` / ``reg_y_encoders[k]`` in the values
icl.k.attn     attention  receivers: all rows; sources: the context rows (thinking rows
                          first); the length scale reads the sources' presence mass
icl.k.ffn      ffn        the residual stream before ``ff_norm``
=============  =========  ==========================================================

The row encoder (``encoder``, ``enc_norm``) is where tokens are born, the token boundary, not a
site; the head (``head``) is a per-row read-out of the test rows, not a residual branch, and
is left as is. The thinking rows are learned tokens, present in every forward.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ..._surgery.host import Site, check_known_modules, register_host, vendor_class
from ..._surgery.patching import SiteConfig, Undo, set_site
from . import releases

__all__ = ["TabDPTHost", "VENDOR_MODULE", "sites", "check_modules"]

VENDOR_MODULE = "tabdpt.model"
# the module types a TabDPTModel is built of: tabdpt's (gated by a site or token-local inside
# one) and torch.nn's token-local layers and containers
_KNOWN = {VENDOR_MODULE: {"TabDPTModel", "TransformerEncoderLayer", "RMSNorm", "SwiGLU"},
          "torch.nn": {"Linear", "LayerNorm", "Dropout", "Embedding", "Sequential", "GELU",
                       "ModuleList"}}


def check_modules(model: nn.Module) -> None:
    """Refuse a module of a type the sites do not account for, by path and class."""
    check_known_modules(model, "TabDPT", _KNOWN, "tabdpt", releases.FIX)


def _layer_site(layer: nn.Module, key: str) -> Callable[[SiteConfig], Undo]:
    from .blocks import OTransformerEncoderLayer
    return lambda config: set_site(layer, OTransformerEncoderLayer, key, config)


def sites(model: nn.Module) -> list[Site]:
    """The sites of a ``TabDPTModel`` (see the module docstring)."""
    found: list[Site] = []
    for k, layer in enumerate(model.transformer_encoder):
        found += [
            Site(f"icl.{k}.norm", "norm", "residual stream entering attn_norm and ff_norm",
                 _layer_site(layer, "norm")),
            Site(f"icl.{k}.te", "inject", "context row token, gating its target embedding in "
                 "the values", _layer_site(layer, "te")),
            Site(f"icl.{k}.attn", "attention", "receivers: all rows; sources: context rows "
                 "(length scale on their presence mass)", _layer_site(layer, "attn")),
            Site(f"icl.{k}.ffn", "ffn", "residual stream before ff_norm",
                 _layer_site(layer, "ffn"))]
    return found


class TabDPTHost:
    """Sites of a ``tabdpt.model.TabDPTModel`` (see the module docstring)."""

    name = "tabdpt"
    specificity = 20
    supports = f"tabdpt.model.TabDPTModel (tabdpt {', '.join(releases.TESTED_RELEASES)})"

    def matches(self, model: nn.Module) -> bool:
        """A model of tabdpt's class: one exists only where tabdpt imports."""
        cls = vendor_class(model, (VENDOR_MODULE,))
        return cls.__module__ == VENDOR_MODULE and cls.__name__ == "TabDPTModel"

    def check(self, model: nn.Module) -> None:
        releases.check_release(releases.installed_version())
        check_modules(model)

    def version(self) -> dict[str, str]:
        return {"tabdpt": releases.installed_version() or "missing"}

    def sites(self, model: nn.Module) -> list[Site]:
        return sites(model)


HOST = register_host(TabDPTHost())
