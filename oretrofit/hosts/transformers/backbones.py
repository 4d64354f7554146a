"""Where a transformers model's layers are: its outermost ``PreTrainedModel`` s, their base models
(the backbones) and the module lists of layers inside them (those whose elements hold an attention
module of either route). The host (:mod:`.host`) derives its sites from these; the contracts
(:mod:`.contracts`) read the residual streams between them.
"""

from __future__ import annotations

import sys

from torch import nn

from ..._surgery.host import inside
from ..torch_nn import ATTENTION, TorchNNHost
from .boundary import join
from .layouts import attention_modules

__all__ = ["pretrained_models", "backbones", "layer_lists", "layers"]


def pretrained_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of every outermost transformers ``PreTrainedModel`` in ``model``
    (a head model such as ``BertForMaskedLM``, or a bare base model); a composite one
    (:func:`_composite`) gives way to the ``PreTrainedModel`` s inside it, so the plain torch.nn
    attention in its own code is left to the torch.nn host."""
    if "transformers" not in sys.modules:
        return []                        # a transformers model cannot exist without it
    return _outermost(model, "", top=True)


def _outermost(module: nn.Module, prefix: str, top: bool = False) -> list[tuple[str, nn.Module]]:
    from transformers import PreTrainedModel
    found: list[tuple[str, nn.Module]] = []
    for name, sub in module.named_modules():
        if (not isinstance(sub, PreTrainedModel) or (not top and not name)
                or any(name == f or name.startswith(f + ".") or not f for f in found)):
            continue
        found.append(name)
    pairs = [(join(prefix, name), module.get_submodule(name)) for name in found]
    return [pair for path, sub in pairs
            for pair in (_outermost(sub, path) if _composite(sub) else [(path, sub)])]


def _composite(pretrained: nn.Module) -> bool:
    """Whether ``pretrained``, a user's ``PreTrainedModel`` class (not one of transformers' own,
    whose heads this host owns whole), holds ``PreTrainedModel`` s and, outside them, attention
    the torch.nn host has a site for (a BERT text encoder and an ``nn.TransformerEncoder`` in one
    model, as TabSTAR): its transformers parts are this host's, the rest the torch.nn host's."""
    if type(pretrained).__module__.split(".")[0] == "transformers":
        return False
    inner = [path for path, _ in _outermost(pretrained, "")]
    return bool(inner) and any(
        site.kind == ATTENTION and not inside(site.scope[0], inner)
        for site in TorchNNHost().sites(pretrained) if site.scope)


def backbones(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, base model)`` of every outermost transformers ``PreTrainedModel`` in ``model``."""
    paths = {id(m): name for name, m in model.named_modules()}
    return [(paths.get(id(m.base_model), name), m.base_model)
            for name, m in pretrained_models(model)]


def layer_lists(backbone: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """Outermost module lists whose elements contain an attention module of either route; a
    list of layer groups (:func:`_groups`) gives way to the lists inside its groups."""
    lists: list[tuple[str, nn.ModuleList]] = []
    for name, module in backbone.named_modules():
        if any(name.startswith(f + ".") for f, _ in lists) or not isinstance(module, nn.ModuleList):
            continue
        if any(attention_modules(layer) for layer in module) and not _groups(module):
            lists.append((name, module))
    return lists


def _groups(module_list: nn.ModuleList) -> bool:
    """Whether every element holds nothing but one module list of layers that each attend: a
    group of layers (ALBERT's ``AlbertLayerGroup`` runs its ``albert_layers`` in order, and its
    groups are shared across the depth), whose own elements carry the residual stream. A T5
    block's list holds sub-layers, the FFN's without attention: the block is the layer."""
    return all([type(c) for c in group.children()] == [nn.ModuleList]
               and all(attention_modules(layer) for layer in next(group.children()))
               for group in module_list)


def layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, layer)`` of every layer the host finds in ``model``'s backbones."""
    return [(join(prefix, list_path, str(i)), layer) for prefix, backbone in backbones(model)
            for list_path, layer_list in layer_lists(backbone)
            for i, layer in enumerate(layer_list)]
