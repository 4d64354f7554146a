"""oretrofit: retrofit O-components into pretrained transformer hosts.

The operators follow "From Attention Masks to Inert Zero-Vector Tokens" (Gong, 2026):
a token's presence p = ‖h‖²/(τ+‖h‖²) gates what it emits and weights the mass it
contributes to anything shared between tokens.

Every public name is listed once in ``__all__`` and imported from its home module on first
use (PEP 562), so ``import oretrofit`` (and ``oretrofit --help``) does not import torch; the
public subpackages ``oretrofit.transformers``, ``oretrofit.tabpfn``, ``oretrofit.tabdpt`` and
``oretrofit.mitra`` likewise, on first use (:func:`oretrofit._surgery.lazy.lazy_attributes`,
which ``oretrofit.transformers`` and ``oretrofit.mitra`` share).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from typing import TYPE_CHECKING

try:                    # pyproject.toml's version, the one place it is set
    __version__ = importlib.metadata.version("oretrofit")
except importlib.metadata.PackageNotFoundError:                  # a source tree never installed
    __version__ = "0+unknown"

from ._surgery import moved  # noqa: E402
from ._surgery.lazy import lazy_attributes as _lazy_attributes  # noqa: E402

moved.install()                 # old module paths (a pickle written before a move) still load

# ``oretrofit.mitra`` is the Mitra host's package itself, which is its own facade (its names are
# imported on first use, so this imports neither torch nor autogluon): the public name without an
# 18th entry at the package root (tests/test_import_graph.py).
sys.modules[f"{__name__}.mitra"] = importlib.import_module(".hosts.mitra", __name__)

# public name -> the module that defines it
_HOMES = {
    "presence": "._operators.presence", "observe_presence": "._operators.presence",
    "observe_carrier_norms": "._operators.presence",
    "TAU_MODULES": "._operators.presence", "TAU_RETROFIT": "._operators.presence",
    "EPS_MODULES": "._operators.presence", "EPS_RETROFIT": "._operators.presence",
    "PresenceProfile": "._operators.presence_profile", "presence_by_module": "._operators.presence_profile",
    "o_attention": "._operators.attention", "o_attention_fused": "._operators.attention",
    "o_attention_reference": "._operators.attention",
    "HiddenCarrierOAttention": "._operators.attention_modules", "QKVOAttention": "._operators.attention_modules",
    "OFFN": "._operators.components", "ONorm": "._operators.components", "OInject": "._operators.components",
    "OStandardize": "._operators.components", "o_gate": "._operators.components", "o_moments": "._operators.components",
    "o_standardize": "._operators.components",
    "OTransformerBlock": "._operators.transformer",
    "SiteConfig": "._surgery.patching",
    "ARMS": "._surgery.registry", "KINDS": "._surgery.registry", "Host": "._surgery.registry", "PatchPlan": "._surgery.registry",
    "Retrofit": "._surgery.registry", "RetrofitError": "._surgery.registry", "Site": "._surgery.registry",
    "apply_spec": "._surgery.registry", "read_spec": "._surgery.registry", "plan_retrofit": "._surgery.registry",
    "register_host": "._surgery.registry",
    "registered_hosts": "._surgery.registry", "retrofit": "._surgery.registry", "retrofitted": "._surgery.registry",
    "register_module_site": ".hosts.torch_nn",
    "from_pretrained": ".hosts.transformers.pretrained",
    "calibrate": "._surgery.calibrate", "CarrierNormProfile": "._surgery.calibrate",
    "save": "._surgery.serialize",
}

__all__ = list(_HOMES)


__getattr__, __dir__ = _lazy_attributes(
    globals(), {name: (home, name) for name, home in _HOMES.items()},
    ("mitra", "tabdpt", "tabpfn", "transformers"))


if TYPE_CHECKING:  # what static checkers and IDEs see; at run time __getattr__ imports these
    from ._operators.attention import o_attention, o_attention_fused, o_attention_reference
    from ._operators.attention_modules import HiddenCarrierOAttention, QKVOAttention
    from ._operators.components import OFFN, OInject, ONorm, OStandardize, o_gate, o_moments, o_standardize
    from ._surgery.patching import SiteConfig
    from ._surgery.calibrate import CarrierNormProfile, calibrate
    from ._operators.presence import (EPS_MODULES, EPS_RETROFIT, TAU_MODULES, TAU_RETROFIT,
                                      observe_carrier_norms, observe_presence, presence)
    from ._operators.presence_profile import PresenceProfile, presence_by_module
    from ._surgery.registry import (ARMS, KINDS, Host, PatchPlan, Retrofit, RetrofitError, Site, apply_spec,
                            plan_retrofit, read_spec, register_host, registered_hosts, retrofit,
                            retrofitted)
    from ._surgery.serialize import save
    from ._operators.transformer import OTransformerBlock
    from .hosts.torch_nn import register_module_site
    from .hosts.transformers.pretrained import from_pretrained
