"""transformers models: mask-free padded batches, the contracts and answers checked on a model at
the settings you run (``check``; ``failed`` names what a summary shows broken), τ calibrated
on text, retrofitted folders loaded back, and the transformers releases the host admits (on a
newer one, or for a subclass redefining a transformers class's methods, a retrofit checks itself
first: :class:`UntestedReleaseWarning`, :class:`SubclassCheckedWarning`).

The public entry points of the transformers host (:mod:`oretrofit.hosts.transformers`, where
its sites live); ``oretrofit.retrofit(model, ...)`` retrofits a model. Needs ``oretrofit[hf]``.
Every name is imported from its home module on first use (PEP 562), so importing this module
imports neither torch nor transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._surgery.lazy import lazy_attributes as _lazy_attributes

# public name -> (the module that defines it, its name there)
_HOMES = {
    "zero_padded_inputs": ("..hosts.transformers.inputs", "zero_padded_inputs"),
    "check": ("..hosts.transformers.check", "check"),
    "failed": ("..hosts.transformers.check", "failed"),
    "calibrate": ("..hosts.transformers.calibrate", "calibrate_text"),
    "from_pretrained": ("..hosts.transformers.pretrained", "from_pretrained"),
    "check_transformers": ("..hosts.transformers.releases", "check_transformers"),
    "supported_range": ("..hosts.transformers.releases", "supported_range"),
    "supported_text": ("..hosts.transformers.releases", "supported_text"),
    "requirement": ("..hosts.transformers.releases", "requirement"),
    "TESTED_RELEASES": ("..hosts.transformers.releases", "TESTED_RELEASES"),
    "UntestedReleaseWarning": ("..hosts.transformers.selfcheck", "UntestedReleaseWarning"),
    "SubclassCheckedWarning": ("..hosts.transformers.selfcheck", "SubclassCheckedWarning"),
}

__all__ = list(_HOMES)


__getattr__, __dir__ = _lazy_attributes(globals(), _HOMES)


if TYPE_CHECKING:  # what static checkers and IDEs see; at run time __getattr__ imports these
    from ..hosts.transformers.calibrate import calibrate_text as calibrate
    from ..hosts.transformers.check import check, failed
    from ..hosts.transformers.inputs import zero_padded_inputs
    from ..hosts.transformers.pretrained import from_pretrained
    from ..hosts.transformers.releases import (TESTED_RELEASES, check_transformers, requirement,
                                               supported_range, supported_text)
    from ..hosts.transformers.selfcheck import SubclassCheckedWarning, UntestedReleaseWarning
