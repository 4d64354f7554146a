"""oretrofit: retrofit O-components into pretrained transformer hosts.

The operators follow "From Attention Masks to Inert Zero-Vector Tokens" (Gong, 2026):
a token's presence p = ‖h‖²/(τ+‖h‖²) gates what it emits and weights the mass it
contributes to anything shared between tokens.

Every public name is listed once in ``__all__`` and imported from its home module on first
use (PEP 562), so ``import oretrofit`` (and ``oretrofit --help``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes
from ._version import __version__

# public name -> the module that defines it
_HOMES = {
    "presence": "._presence", "observe_presence": "._presence",
    "observe_carrier_norms": "._presence",
    "TAU_MODULES": "._presence", "TAU_RETROFIT": "._presence",
    "EPS_MODULES": "._presence", "EPS_RETROFIT": "._presence",
    "PresenceProfile": "._presence_profile", "presence_by_module": "._presence_profile",
    "o_attention": "._attention", "o_attention_fused": "._attention",
    "o_attention_reference": "._attention",
    "HiddenCarrierOAttention": "._attention_modules", "QKVOAttention": "._attention_modules",
    "OFFN": "._components", "ONorm": "._components", "OInject": "._components",
    "OStandardize": "._components", "o_gate": "._components", "o_moments": "._components",
    "o_standardize": "._components",
    "OTransformerBlock": "._transformer",
    "SiteConfig": "._patching",
    "ARMS": "._registry", "KINDS": "._registry", "Host": "._registry", "PatchPlan": "._registry",
    "Retrofit": "._registry", "RetrofitError": "._registry", "Site": "._registry",
    "apply_spec": "._registry", "read_spec": "._registry", "plan_retrofit": "._registry",
    "register_host": "._registry",
    "registered_hosts": "._registry", "retrofit": "._registry", "retrofitted": "._registry",
    "register_module_site": ".hosts.torch_nn",
    "from_pretrained": ".hosts.transformers.pretrained",
    "calibrate": "._calibrate", "CarrierNormProfile": "._calibrate",
    "save": "._serialize",
}

__all__ = list(_HOMES)


__getattr__, __dir__ = lazy_attributes(
    globals(), {name: (home, name) for name, home in _HOMES.items()})


if TYPE_CHECKING:  # what static checkers and IDEs see; at run time __getattr__ imports these
    from ._attention import o_attention, o_attention_fused, o_attention_reference
    from ._attention_modules import HiddenCarrierOAttention, QKVOAttention
    from ._components import OFFN, OInject, ONorm, OStandardize, o_gate, o_moments, o_standardize
    from ._patching import SiteConfig
    from ._calibrate import CarrierNormProfile, calibrate
    from ._presence import (EPS_MODULES, EPS_RETROFIT, TAU_MODULES, TAU_RETROFIT,
                            observe_carrier_norms, observe_presence, presence)
    from ._presence_profile import PresenceProfile, presence_by_module
    from ._registry import (ARMS, KINDS, Host, PatchPlan, Retrofit, RetrofitError, Site, apply_spec,
                            plan_retrofit, read_spec, register_host, registered_hosts, retrofit,
                            retrofitted)
    from ._serialize import save
    from ._transformer import OTransformerBlock
    from .hosts.torch_nn import register_module_site
    from .hosts.transformers.pretrained import from_pretrained
