"""The transformers host: one host for every transformers model (of the releases the version gate
admits) whose attention goes through the attention interface or is the module's own code with one
softmax over the keys (:mod:`.softmax_route`), its sites derived from the loaded model (see
:mod:`.layouts`).

Sites, named by module path (``<layer>`` = one element of the layer list):

    <attention>          attention  OAttention (eq. 7) via AttentionInterface on the module that
                                    calls it, or by the softmax route on a module that computes
                                    its own weights; receivers' presences from the residual stream
                                    entering the layer (cross-attention: entering its branch,
                                    sources: the encoder output); KV-cached keys keep theirs;
                                    the output projection's bias is gated by p_i
    <norm>               norm       ONorm ρτ(h)·Norm(h) (eq. 16), every norm outside attention
    <ffn branch>         ffn        ρτ(h)·FFN(·) (eq. 15), h = the residual stream entering the
                                    FFN branch (per layout: parallel, sandwich, post-norm, …)
    <position table>     inject     OInject h + ρτ(h)·e (eq. 17) for learned position and
                                    token-type tables, h = the word embedding / inputs_embeds
                                    (vision: the patch embedding at that position)
    <input projection>   inject     W x + ρτ(x)·b for a biased projection between the embedding
                                    and the first layer (ELECTRA, HuBERT), x = its input
    <conv positions>     inject     h + ρτ(h)·conv(h) for one convolution over positions next to
                                    the layers (HuBERT's pos_conv_embed), h = its input

A zero carrier stays exactly zero through every ``full-o`` layer. Heads and poolers read the
final hidden states and are not residual branches; they are left as they are.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..._patching import SiteConfig, Undo, set_site
from ..._host import RetrofitError, Site, register_host
from ..torch_nn import ATTENTION, FFN, NORM, ONormSite, patch_all, uncovered_attention
from .attention import attach_o_attention
from .gates import gate_patch_table, gate_projection
from .softmax_route import attach_softmax_attention
from .releases import (INJECT, accepts_inputs_embeds, check_transformers, gate_branch,
                       gate_output_bias, gate_table, not_covered_yet, supported_text,
                       transformers_version)
from .layouts import (LAYOUTS, Layout, attention_modules, calls_attention_interface, child,
                      first_present,
                      is_norm, is_qk_norm, layout_of, output_projection,
                      token_mixers, is_additive_table)

__all__ = ["TransformersHost", "INJECT", "backbones", "layers", "forget_structures"]

_ATTENTION_NAME = re.compile(r"Attention|Attn")
_CACHE: dict[int, tuple[Any, tuple, list]] = {}     # id(model) -> (weakref, fingerprint, result)
_HOWTO = ("register a layout with oretrofit.hosts.transformers.layouts.register_layout("
          "Layout(...)) naming the FFN branch and the module whose input is the residual stream "
          "entering it (docs/transformers.md, 'Registering a layout')")
_REFUSED_HOWTO = ("this host has no O form for it, so the model cannot be retrofitted by it "
                  "(a layout registered for this layer with register_layout would be tried first)")
_UNGATED = ("the transformers host cannot gate (a null token would move its neighbours): no O "
            "form for this mixer exists here, so the model is refused; only models whose "
            "layers all mix tokens by softmax attention are covered "
            "(docs/transformers.md, 'Supported architectures')")


def forget_structures() -> None:
    """Drop every cached derivation (the next plan derives the sites afresh)."""
    _CACHE.clear()


def pretrained_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of every outermost transformers ``PreTrainedModel`` in ``model``
    (a head model such as ``BertForMaskedLM``, or a bare base model)."""
    if "transformers" not in sys.modules:
        return []                        # a transformers model cannot exist without it
    from transformers import PreTrainedModel
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, PreTrainedModel) and not any(
                name == f or name.startswith(f + ".") or not f for f, _ in found):
            found.append((name, module))
    return found


def backbones(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, base model)`` of every outermost transformers ``PreTrainedModel`` in ``model``."""
    paths = {id(m): name for name, m in model.named_modules()}
    return [(paths.get(id(m.base_model), name), m.base_model)
            for name, m in pretrained_models(model)]


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


@dataclass
class _Structure:
    """What one backbone's sites are built from; ``problems`` refuse it, ``uncovered`` is
    reported."""

    sites: dict[int, list[Site]] = field(default_factory=dict)     # id(anchor module) -> sites
    problems: list[str] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)

    def add(self, anchor: nn.Module, site: Site) -> None:
        self.sites.setdefault(id(anchor), []).append(site)


def _layer_lists(backbone: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """Outermost module lists whose elements contain an attention module of either route."""
    lists: list[tuple[str, nn.ModuleList]] = []
    for name, module in backbone.named_modules():
        if any(name.startswith(f + ".") for f, _ in lists) or not isinstance(module, nn.ModuleList):
            continue
        if any(attention_modules(layer) for layer in module):
            lists.append((name, module))
    return lists


def _self_attending_lists(backbone: nn.Module, interface_lists: list[str]
                          ) -> list[tuple[str, list[str]]]:
    """Outermost module lists outside ``interface_lists`` whose elements hold attention-named
    modules (e.g. an encoder stack that computes attention itself), with those class names."""
    found: list[tuple[str, list[str]]] = []
    for name, module in backbone.named_modules():
        if (not isinstance(module, nn.ModuleList)
                or any(name == f or name.startswith(f + ".")
                       for f in interface_lists + [f for f, _ in found])):
            continue
        own = sorted({type(m).__name__ for layer in module for m in layer.modules()
                      if _ATTENTION_NAME.search(type(m).__name__)})
        if own:
            found.append((name, own))
    return found


def layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, layer)`` of every layer the host finds in ``model``'s backbones."""
    return [(_join(prefix, list_path, str(i)), layer) for prefix, backbone in backbones(model)
            for list_path, layer_list in _layer_lists(backbone)
            for i, layer in enumerate(layer_list)]


def _attention_sites(s: _Structure, path: str, layer: nn.Module, layout: Layout,
                     attentions: list[tuple[str, nn.Module]]) -> None:
    for index, (name, attention) in enumerate(attentions):
        cross = index > 0
        carrier_path = first_present(layer, layout.cross_carrier) if cross else ""
        if carrier_path is None:
            s.problems.append(f"{path}.{name} ({type(attention).__name__}): a cross-attention the "
                              f"layout {layout.name!r} names no carrier for; {_HOWTO}")
            continue
        parent = layer.get_submodule(name.rpartition(".")[0]) if "." in name else layer
        projection = output_projection(attention, parent)
        if projection is None:
            s.uncovered.append(f"{path}.{name} (output projection not found: its bias stays "
                               "ungated)")
        s.add(attention, Site(
            _join(path, name), ATTENTION,
            f"residual stream entering {_join(path, carrier_path)}"
            + (" (sources: encoder output)" if cross else ""),
            functools.partial(_attention, _join(path, name), attention,
                              child(layer, carrier_path), projection, cross,
                              int(path.rpartition(".")[2]))))


def _layer_problem(path: str, layer: nn.Module,
                   attentions: list[tuple[str, nn.Module]]) -> str | None:
    """Why the host cannot cover ``layer`` at all (None when it may): a token mixer outside the
    attention interface, a layout row that refuses it, or no layout."""
    cls, names = type(layer).__name__, ", ".join(n for n, _ in layer.named_children())
    if not attentions:
        return (f"{path} ({cls}, children: {names}) has no module that calls the attention "
                f"interface: it mixes tokens some other way (a state-space, convolution or "
                f"linear-attention mixer), which {_UNGATED}")
    if attentions == [("", layer)]:
        return (f"{path} ({cls}) is an attention module itself: the model runs attention, FFN "
                "and norms inline from parallel module lists (XLM), so no layer module carries "
                "the residual stream and no layout describes this layer; this host has no O "
                "form for it")
    mixers = token_mixers(layer)
    if mixers:
        return (f"{path} ({cls}) mixes tokens outside the attention interface in "
                f"{', '.join(_join(path, m) for m in mixers)}, which {_UNGATED}")
    layout = layout_of(layer)
    if layout is None:
        return f"{cls} (children: {names}): no layout describes this layer; {_HOWTO}"
    if layout.refused:
        return f"{cls} (layout {layout.name!r}): {layout.refused}; {_REFUSED_HOWTO}"
    return None


def _layer_sites(s: _Structure, path: str, layer: nn.Module) -> None:
    named = list(layer.named_modules())
    attentions = attention_modules(layer)
    problem = _layer_problem(path, layer, attentions)
    if problem is not None:
        s.problems.append(problem)
        return
    layout = layout_of(layer)
    if len(attentions) > 2:
        s.problems.append(f"{type(layer).__name__}: {len(attentions)} attention modules in one "
                          f"layer (self + cross is the most a layout describes); {_HOWTO}")
        return
    _attention_sites(s, path, layer, layout, attentions)
    for name, norm in named:
        if is_norm(norm) and not is_qk_norm(name):
            s.add(norm, _norm_site(_join(path, name), norm))
    ffn_path, carrier_path = first_present(layer, layout.ffn), first_present(layer,
                                                                           layout.ffn_carrier)
    if ffn_path is None or carrier_path is None:
        s.problems.append(f"{type(layer).__name__}: layout {layout.name!r} finds no FFN branch "
                          f"or carrier in it; {_HOWTO}")
        return
    branch, carrier = child(layer, ffn_path), child(layer, carrier_path)
    full = _join(path, next(n for n, m in named if m is branch))
    s.add(branch, Site(full, FFN, f"residual stream entering {_join(path, carrier_path)}",
                       functools.partial(gate_branch, carrier, branch)))


def _norm_site(name: str, norm: nn.Module) -> Site:
    return Site(name, NORM, f"state entering {name}",
                functools.partial(set_site, norm, ONormSite, NORM))


def _attention(name: str, attention: nn.Module, carrier: nn.Module,
               projection: nn.Module | None, cross: bool, layer_index: int,
               config: SiteConfig) -> Undo:
    """The interface route where the module calls the attention interface, else the softmax
    route (:mod:`.softmax_route`; ``layer_index``: the layer's place in its list)."""
    if calls_attention_interface(attention):
        undo_attention, state = attach_o_attention(attention, carrier, config, cross)
    else:
        undo_attention, state = attach_softmax_attention(name, attention, carrier, config, cross,
                                                         layer_index)
    steps = [lambda: undo_attention]
    if projection is not None:
        steps.append(lambda: gate_output_bias(projection, state))
    return patch_all(*steps)


def _outer_sites(s: _Structure, prefix: str, backbone: nn.Module, layer_paths: list[str]) -> None:
    """Norms and additive tables outside the layers (embeddings, final norms)."""
    inner = lambda n: any(n == p or n.startswith(p + ".") for p in layer_paths)   # noqa: E731
    word = _word_embedding(backbone)
    words = _word_embeddings(backbone)
    named = dict(backbone.named_modules())
    first_layer = list(named).index(f"{layer_paths[0]}.0")
    for index, (name, module) in enumerate(named.items()):
        if inner(name):
            continue
        index = len(named) if _in_pooler(name) else index    # a head, whatever its order
        if index < first_layer and _biased_projection(module):
            _projection_site(s, _join(prefix, name), module, word)
        elif is_norm(module):
            s.add(module, _norm_site(_join(prefix, name), module))
        elif (is_additive_table(module) and not any(_is_word(module, w) for w in words)
              and not _feeds_scores(module, word)):
            _table_site(s, prefix, name, module, named, word)
        elif index < first_layer and "Rotary" not in type(module).__name__:
            s.uncovered += [f"{_join(prefix, name, b)} (float buffer of {type(module).__name__}: "
                            "a table added inline, no module to gate it by the carrier)"
                            for b, buffer in module.named_buffers(recurse=False)
                            if buffer.is_floating_point() and buffer.dim() == 2]


def _projection_site(s: _Structure, name: str, projection: nn.Module,
                     word: nn.Module | None) -> None:
    """A biased projection between the embedding and the first layer, gated W x + ρτ(x)·b when
    its input is one token's carrier: as wide as the word embedding (or no word embedding, as
    in an audio model's feature projection). A wider input may concatenate neighbours
    (MobileBERT's trigram input), so a null token's would not be zero: left uncovered."""
    width = projection.weight.shape[0 if type(projection).__name__ == "Conv1D" else 1]
    if word is not None and width != word.weight.shape[-1]:
        s.uncovered.append(f"{name} ({type(projection).__name__} with a bias between the "
                           f"embedding and the first layer whose input is {width} wide, not the "
                           f"word embedding's {word.weight.shape[-1]}: the host cannot tell it "
                           "is one token's carrier, and where it concatenates neighbours "
                           "(MobileBERT's trigram input) a null token's input is not zero)")
        return
    s.add(projection, Site(name, INJECT, f"input of {name}",
                           functools.partial(gate_projection, projection)))


def _word_embedding(backbone: nn.Module) -> nn.Module | None:
    """The backbone's word embedding: the lookup table ``get_input_embeddings()`` returns. None
    when it has none (a vision model), or when it returns a whole embeddings module with no
    ``weight`` of its own (Idefics3's and SmolVLM's SigLIP-style vision embeddings: a patch
    convolution plus a position table, not a lookup)."""
    try:
        found = backbone.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return found if isinstance(getattr(found, "weight", None), torch.Tensor) else None


def _word_embeddings(backbone: nn.Module) -> list[nn.Module]:
    """The word embeddings of the backbone and of every transformers model inside it (T5Gemma's
    decoder looks up its own): lookups of the inputs, not tables added to them."""
    from transformers import PreTrainedModel
    found = (_word_embedding(m) for m in backbone.modules() if isinstance(m, PreTrainedModel))
    return [w for w in found if w is not None]


def _feeds_scores(table: nn.Module, word: nn.Module | None) -> bool:
    """A lookup whose width is not the word embedding's is never added to the stream: it feeds
    the attention scores (MPNet's relative-position bias per head, RoFormer's rotary
    sinusoids), inside the attention sites."""
    width = getattr(word, "embedding_dim", None)
    return width is not None and getattr(table, "embedding_dim", width) != width


def _in_pooler(name: str) -> bool:
    return "pooler" in name.split(".")


def _biased_projection(module: nn.Module) -> bool:
    return ((isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D")
            and module.bias is not None)


def _is_word(embedding: nn.Module, word: nn.Module | None) -> bool:
    return word is not None and (embedding is word or (
        getattr(embedding, "weight", None) is not None and embedding.weight is word.weight))


def _table_site(s: _Structure, prefix: str, name: str, table: nn.Module,
                named: dict[str, nn.Module], word: nn.Module | None) -> None:
    """A table added to the word embedding (gated by its presence), or, where the table's
    embeddings module patchifies and holds no word lookup (a vision tower inside a multimodal
    model such as PaliGemma, whose root takes ``inputs_embeds`` of the text), to the patches."""
    parts = name.split(".")
    owners = [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]
    parent = named[name.rpartition(".")[0]]
    patches = _patches(parent) is not None and not any(_is_word(m, word) for m in parent.modules())
    owner = None if patches else next((o for o in owners if accepts_inputs_embeds(named[o])), None)
    lookup = None if owner is None else next(
        (m for n, m in named[owner].named_modules() if isinstance(m, nn.Embedding)
         and _is_word(m, word)), None)
    if lookup is None:
        _patch_table_site(s, prefix, name, table, parent)
        return
    s.add(table, Site(_join(prefix, name), INJECT,
                      f"word embedding (inputs_embeds) of {_join(prefix, owner) or 'root'}",
                      functools.partial(gate_table, table, lookup, named[owner])))


def _patches(owner: nn.Module) -> nn.Module | None:
    """The one patchifying convolution (kernel = stride > 1) in ``owner``, else None."""
    found = [m for m in owner.modules() if isinstance(m, nn.Conv2d)
             and m.kernel_size == m.stride and math.prod(m.kernel_size) > 1]
    return found[0] if len(found) == 1 else None


def _patch_table_site(s: _Structure, prefix: str, name: str, table: nn.Module,
                      owner: nn.Module) -> None:
    """A position table added to patch embeddings (no ``inputs_embeds`` to take the carrier
    from): gated by the patch embedding's presence (:func:`gate_patch_table`)."""
    patches = _patches(owner)
    if patches is None:
        s.uncovered.append(f"{_join(prefix, name)} ({type(table).__name__}: an additive table "
                           "with no word embedding / inputs_embeds or patch embedding to gate it "
                           "by)")
        return
    width = getattr(table, "embedding_dim", None)
    learned = [w for w in owner.parameters(recurse=False) if w.shape[-1] == width]
    s.add(table, Site(_join(prefix, name), INJECT, f"patch embedding of {type(owner).__name__}",
                      functools.partial(gate_patch_table, table, patches, owner, learned)))


def _positional_convolutions(s: _Structure, prefix: str, backbone: nn.Module,
                             lists: list[str]) -> None:
    """Modules next to a layer list (its parent's other children) that mix tokens: one
    convolution over positions, stride 1, no other weights (HuBERT's ``pos_conv_embed``, added to
    the stream) is gated h + ρτ(h)·conv(h); anything else is refused. Siblings that form the
    carrier boundary (the word embedding, a patchifying convolution) are not next to it."""
    word = _word_embedding(backbone)
    for list_path in lists:
        parent_path = list_path.rpartition(".")[0]
        parent = backbone.get_submodule(parent_path) if parent_path else backbone
        for name, module in parent.named_children():
            mixers = token_mixers(module)
            if (not mixers or _join(parent_path, name) in lists or _patches(module) is not None
                    or any(m is word for m in module.modules())):
                continue                                   # no mixer, or the carrier boundary
            path = _join(prefix, parent_path, name)
            convs = [(n, m) for n, m in module.named_modules()
                     if isinstance(m, nn.modules.conv._ConvNd) and math.prod(m.kernel_size) > 1]
            others = [n for n, _ in module.named_parameters()
                      if not (len(convs) == 1 and n.startswith(convs[0][0] + "."))]
            if len(convs) == 1 and len(mixers) == 1 and not others and set(
                    convs[0][1].stride) == {1}:
                s.add(module, Site(path, INJECT, f"input of {path}",
                                   functools.partial(gate_branch, module, module)))
            else:
                s.problems.append(
                    f"{path} ({type(module).__name__}) mixes tokens next to the layers in "
                    f"{', '.join(mixers)}{' with ' + ', '.join(others) if others else ''}: only "
                    "one stride-1 convolution with no other weights can be gated (a second "
                    "convolution or a norm would read a null token's non-zero intermediate "
                    f"where it read zero padding), which {_UNGATED}")


# states a backbone adds to every token's stream inside its forward, from no module a site can
# gate: {parameter name: what it is}
_INITIAL_STATES = {"z_L_init": "the low-level state every token's low cycle starts from "
                               "(HRM: the L stack reads z_L + x with z_L = z_L_init at first)"}


def _initial_state_problems(prefix: str, backbone: nn.Module) -> list[str]:
    """A non-zero :data:`_INITIAL_STATES` parameter of ``backbone``: a null token's stream is
    never zero there, so its states move and its neighbours read it (zero, it adds nothing)."""
    return [f"{_join(prefix, name)} ({type(backbone).__name__}) is non-zero: it is {what}, added "
            "to every token inside the model's forward where no site can gate it, so a null "
            "token's state is never zero; the host covers the model only with it zero (as HRM "
            "initialises it and never trains it): zero it, or leave the model unretrofitted"
            for name, what in _INITIAL_STATES.items()
            if isinstance(getattr(backbone, name, None), nn.Parameter)
            and bool(getattr(backbone, name).detach().any())]


def _structure(prefix: str, backbone: nn.Module) -> _Structure:
    s = _Structure()
    lists = _layer_lists(backbone)
    if not lists:
        own = sorted({type(m).__name__ for m in backbone.modules()
                      if "Attention" in type(m).__name__})
        why = (f"{', '.join(own)} computes attention itself without a softmax over the keys "
               "(linear, hashed or block attention), so neither the O attention function nor the "
               "softmax route applies" if own else "it has no attention module at all (a "
               "state-space or recurrent model), so there is no attention to take the O form")
        s.problems.append(
            f"{type(backbone).__name__}: no module calls transformers' attention interface "
            f"(ALL_ATTENTION_FUNCTIONS); {why}. Register a site for that class with "
            "oretrofit.hosts.torch_nn.register_module_site (docs/transformers.md)")
        return s
    for list_path, layers in lists:
        for i, layer in enumerate(layers):
            _layer_sites(s, _join(prefix, list_path, str(i)), layer)
    for list_path, attentions in _self_attending_lists(backbone, [p for p, _ in lists]):
        s.problems.append(
            f"{_join(prefix, list_path)}: {', '.join(attentions)} computes attention itself (no "
            "attention interface) without a softmax over the keys while other layers use it, so "
            "neither the O attention function nor the softmax route applies there. Register a site for that class with "
            "oretrofit.hosts.torch_nn.register_module_site (docs/transformers.md)")
    _positional_convolutions(s, prefix, backbone, [p for p, _ in lists])
    if s.problems:
        return s
    _outer_sites(s, prefix, backbone, [p for p, _ in lists])
    covered = [site.name for sites in s.sites.values() for site in sites if site.kind == ATTENTION]
    s.uncovered += uncovered_attention(backbone, [n[len(prefix) + 1:] if prefix else n
                                                  for n in covered])
    return s


class TransformersHost:
    """Every model of the tested transformers releases routed through the attention interface
    (module docstring).

    ``owned(model)`` lists the transformers models (module paths) whose subtrees this host
    answers for; the rest of a wrapping model is left to other hosts.
    """

    name = "transformers"
    specificity = 10
    supports = (f"transformers {supported_text()} models whose attention goes through the "
                "AttentionInterface (decoder-only, encoder-only, encoder-decoder, MoE, ViT; "
                "docs/transformers.md)")

    def matches(self, model: nn.Module) -> bool:
        return bool(backbones(model))

    def owned(self, model: nn.Module) -> list[str]:
        """Each outermost ``PreTrainedModel`` whole: its heads (LM head, pooler, classifier,
        ``final_logits_bias``) are per-token read-outs of the gated stream and mix no tokens."""
        return [path for path, _ in pretrained_models(model)]

    def _structures(self, model: nn.Module) -> list[tuple[str, nn.Module, _Structure]]:
        """Derived once per model (check, uncovered and sites each read it): kept while the
        model's modules and the layout rows are the same objects."""
        fingerprint = (tuple(map(id, model.modules())), tuple(map(id, LAYOUTS)))
        cached = _CACHE.get(id(model))
        if cached is not None and cached[0]() is model and cached[1] == fingerprint:
            return cached[2]
        for key in [k for k, v in _CACHE.items() if v[0]() is None]:
            del _CACHE[key]
        result = [(path, b, _structure(path, b)) for path, b in backbones(model)]
        _CACHE[id(model)] = (weakref.ref(model), fingerprint, result)
        return result

    def check(self, model: nn.Module) -> None:
        check_transformers()
        structures = self._structures(model)
        # a model the host covers only from a later release (results/transformers-compat.md)
        later = [why for _, backbone, _ in structures
                 for why in [not_covered_yet(type(backbone).__name__,
                                             getattr(backbone.config, "model_type", ""))] if why]
        # parameter values: read on every check (the cached structures hold module shapes only)
        values = [p for path, backbone, _ in structures
                  for p in _initial_state_problems(path, backbone)]
        problems = list(dict.fromkeys(later + [p for _, _, s in structures for p in s.problems]
                                      + values))
        if problems:
            raise RetrofitError("the transformers host cannot cover "
                                f"{type(model).__name__}: " + " | ".join(problems))

    def sites(self, model: nn.Module) -> list[Site]:
        return [site for path, backbone, s in self._structures(model)
                for module in backbone.modules() for site in s.sites.get(id(module), ())]

    def uncovered(self, model: nn.Module) -> list[str]:
        """Parts of the owned backbones no site reaches (attention modules outside the interface,
        output projections or additive tables it cannot gate)."""
        covered = [site.name for site in self.sites(model) if site.kind == ATTENTION]
        heads = uncovered_attention(model, covered, self.owned(model))   # attention in a head
        return list(dict.fromkeys([*(u for _, _, s in self._structures(model) for u in s.uncovered),
                                   *heads]))

    def version(self) -> dict[str, str]:
        return {"transformers": transformers_version(), "torch": torch.__version__}


HOST = register_host(TransformersHost())
