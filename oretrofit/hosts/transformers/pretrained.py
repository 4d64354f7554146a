"""Saving and loading a retrofitted transformers model as a folder, as PEFT does an adapter.

``model.save_pretrained(folder)`` of a retrofitted model writes the weights (the retrofit adds
none) and the patch spec beside them, :data:`SPEC_FILE`; :func:`from_pretrained` loads the folder
and re-applies the spec (checked against the loaded model by ``apply_spec``), so one call gives
the retrofitted model back. The folder also says it to a loader that does not know oretrofit:
its weights hold one marker tensor, :data:`MARKER`, which transformers' own ``from_pretrained``
lists as an UNEXPECTED key in its load report, naming the call that restores the retrofit.
:func:`from_pretrained` refuses a folder without a spec (not saved from a retrofitted model).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._surgery.host import RetrofitError
from ..._surgery.patching import PopAttribute, Undo, noop
from .loading import from_pretrained as load_offline

__all__ = ["SPEC_FILE", "MARKER", "keep_spec_on_save", "from_pretrained"]

SPEC_FILE = "oretrofit_spec.json"
MARKER = "oretrofit_retrofit_not_applied.load_with_oretrofit_from_pretrained"
_SAVE = "save_pretrained"


class SavePretrainedWithSpec:
    """A retrofitted ``PreTrainedModel``'s ``save_pretrained`` (an instance attribute over the
    class's method; the model's class is left alone, as transformers reads it when it records
    outputs): the class's own ``save_pretrained`` with the marker tensor added to the weights,
    then the patch spec written beside them (module docstring). A plain object, so it pickles
    with the model."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, save_directory: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
        from ..._surgery.registry import Retrofit
        model = self.model
        state = kwargs.pop("state_dict", None) or model.state_dict()
        marker = torch.ones(1, device=next(iter(state.values())).device)
        result = type(model).save_pretrained(model, save_directory, *args,
                                             state_dict={**state, MARKER: marker}, **kwargs)
        Retrofit.of(model).save_spec(Path(save_directory) / SPEC_FILE)
        return result


def keep_spec_on_save(model: nn.Module) -> Undo:
    """Make ``model.save_pretrained`` write the patch spec while the retrofit is on (nothing to
    do for a model that is not a transformers ``PreTrainedModel``)."""
    from transformers import PreTrainedModel
    if not isinstance(model, PreTrainedModel):
        return noop
    model.__dict__[_SAVE] = SavePretrainedWithSpec(model)
    return PopAttribute(model, _SAVE)


def _model_class(folder: Path, model_class: type | None) -> type:
    """``model_class``, else the class the folder's config names (``architectures``)."""
    import transformers
    if model_class is not None:
        if not (isinstance(model_class, type)
                and issubclass(model_class, transformers.PreTrainedModel)):
            raise RetrofitError(f"model_class={model_class!r} is not a transformers model class; "
                                "pass one such as LlamaForCausalLM, or leave it out to use the "
                                "class the folder's config names")
        return model_class
    config = load_offline(transformers.AutoConfig, folder)
    names = getattr(config, "architectures", None) or []
    found = getattr(transformers, names[0], None) if names else None
    if found is None:
        raise RetrofitError(f"{folder}/config.json names no transformers model class "
                            f"(architectures: {names}); pass model_class=, e.g. "
                            "oretrofit.from_pretrained(folder, model_class=LlamaForCausalLM)")
    return found


def from_pretrained(folder: str | os.PathLike[str], model_class: type | None = None,
                    **kwargs: Any) -> nn.Module:
    """Load a folder written by ``save_pretrained`` of a retrofitted model and restore its
    retrofit: ``model_class.from_pretrained(folder, **kwargs)`` (default: the class its config
    names), then ``apply_spec`` with :data:`SPEC_FILE`. ``Retrofit.of(model)`` is the restored
    retrofit. The transformers release the folder was saved under is provenance: the folder loads
    under any release the host admits when its sites match the spec's records, and is refused
    naming the site that differs when they do not. Refuses a folder without a spec."""
    from ..._surgery.registry import apply_spec
    path = Path(folder)
    spec = path / SPEC_FILE
    if not spec.is_file():
        raise RetrofitError(
            f"{folder} holds no {SPEC_FILE}: it was not saved from a retrofitted model, so there "
            "is no retrofit to restore; load it with transformers' from_pretrained (and "
            "oretrofit.retrofit it if you want one)")
    cls = _model_class(path, model_class)
    ignored = [*(getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or []),
               re.escape(MARKER)]
    # a subclass that expects the marker (no UNEXPECTED row), given back its class once loaded
    quiet = type(cls.__name__, (cls,), {"_keys_to_ignore_on_load_unexpected": ignored})
    model = load_offline(quiet, path, **kwargs)   # never the folder's own code
    model.__class__ = cls
    apply_spec(model, spec)
    return model
