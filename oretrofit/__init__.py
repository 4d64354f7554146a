"""oretrofit: retrofit O-components into pretrained transformer hosts.

The operators follow "From Attention Masks to Inert Zero-Vector Tokens" (Gong, 2026):
a token's presence p = ‖h‖²/(τ+‖h‖²) gates what it emits and weights the mass it
contributes to anything shared between tokens.
"""

from ._attention import o_attention, o_attention_fused, o_attention_reference
from ._attention_modules import HiddenCarrierOAttention, QKVOAttention
from ._components import OFFN, OInject, ONorm, OStandardize, o_gate, o_moments, o_standardize
from ._presence import observe_presence, presence
from ._presence_profile import PresenceProfile, presence_by_module
from ._transformer import OTransformerBlock

__version__ = "0.1.0"

__all__ = [
    "presence", "observe_presence", "PresenceProfile", "presence_by_module", "o_attention",
    "o_attention_fused", "o_attention_reference", "o_gate", "o_moments", "o_standardize",
    "HiddenCarrierOAttention", "QKVOAttention", "OFFN", "ONorm", "OInject", "OStandardize",
    "OTransformerBlock",
]

from ._patching import SiteConfig
from ._serialize import save
from ._registry import (ARMS, KINDS, Host, PatchPlan, Retrofit, RetrofitError, Site, apply_spec,
                        plan_retrofit, register_host, registered_hosts, retrofit, retrofitted)

__all__ += [
    "ARMS", "KINDS", "Host", "PatchPlan", "Retrofit", "RetrofitError", "Site", "SiteConfig",
    "apply_spec", "plan_retrofit", "register_host", "registered_hosts", "retrofit", "retrofitted",
    "save",
]
