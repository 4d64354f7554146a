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
                                    the output projection's bias is gated by p_i (by pᵀ where
                                    the module feeds it sequence-first, as MLCD)
    <norm>               norm       ONorm ρτ(h)·Norm(h) (eq. 16), every norm outside attention
    <ffn branch>         ffn        ρτ(h)·FFN(·) (eq. 15), h = the residual stream entering the
                                    FFN branch (per layout: sandwich, post-norm, …; an MLP's
                                    read from the layer's call, :mod:`.stream`)
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
import re
import weakref
from typing import Any, Callable

import torch
from torch import nn

from ..._kernels.routes import check_routes
from ..._surgery.patching import SiteConfig, Undo
from ..._surgery.host import RetrofitError, Site, register_host
from ..torch_nn import ATTENTION, FFN, patch_all, uncovered_attention
from .interface_route import attach_o_attention
from .backbones import backbones, layer_lists, pretrained_models
from .boundary import (UNGATED, Structure, initial_state_problems, join, norm_site,
                       outer_sites, parameters_between_layers, positional_convolutions)
from .cache import carry_presences_hook, carrying_classes
from .gates import INJECT, gate_branch, gate_output_bias, gate_sequence_first_bias
from .indexer import attach_indexer
from .overrides import overrides
from .layouts import (LAYOUTS, Layout, attention_modules, calls_attention_interface, child,
                      first_present, is_norm, is_qk_norm, layout_of, output_projection,
                      sequence_first_output, token_mixers)
from .releases import (check_transformers, not_covered_yet, supported_text, transformers_version,
                       untested_newer)
from .selfcheck import verify
from .pretrained import keep_spec_on_save
from .sdpa_route import attach_sdpa_attention, calls_sdpa
from .softmax_route import attach_softmax_attention
from .stream import gate_traced_branch

__all__ = ["TransformersHost", "INJECT", "forget_structures"]

_ATTENTION_NAME = re.compile(r"Attention|Attn")
# model -> (fingerprint, [(backbone path, Structure)]): keyed weakly and holding only submodules
# (never the model itself), so a dropped model is freed with its entry
_CACHE: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list]]" = weakref.WeakKeyDictionary()
_HOWTO = ("register a layout with oretrofit.hosts.transformers.layouts.register_layout("
          "Layout(...)) naming the FFN branch and the module whose input is the residual stream "
          "entering it")
_REFUSED_HOWTO = ("this host has no O form for it, so the model cannot be retrofitted by it "
                  "(a layout registered for this layer with register_layout would be tried first)")

def forget_structures() -> None:
    """Drop every cached derivation (the next plan derives the sites afresh)."""
    _CACHE.clear()


def prepare_kernels(model: nn.Module) -> None:
    """Check the attention kernels for ``model``'s device and dtype (its first floating
    parameter's) now, outside any compiled call (:func:`oretrofit._kernels.routes.check_routes`)."""
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    if weight is not None:
        check_routes(weight.device, weight.dtype)


def _self_attending_lists(backbone: nn.Module, interface_lists: list[str]
                          ) -> list[tuple[str, list[str]]]:
    """Outermost module lists outside ``interface_lists`` (and not holding one: a list of layer
    groups) whose elements hold attention-named modules (e.g. an encoder stack that computes
    attention itself), with those class names."""
    found: list[tuple[str, list[str]]] = []
    for name, module in backbone.named_modules():
        if (not isinstance(module, nn.ModuleList)
                or any(name == f or name.startswith(f + ".") or f.startswith(name + ".")
                       for f in interface_lists + [f for f, _ in found])):
            continue
        own = sorted({type(m).__name__ for layer in module for m in layer.modules()
                      if _ATTENTION_NAME.search(type(m).__name__)})
        if own:
            found.append((name, own))
    return found


def _attention_sites(s: Structure, path: str, layer: nn.Module, layout: Layout,
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
        gate = (gate_sequence_first_bias if projection is not None
                and sequence_first_output(attention, projection) else gate_output_bias)
        s.add(attention, Site(
            join(path, name), ATTENTION,
            f"residual stream entering {join(path, carrier_path)}"
            + (" (sources: encoder output)" if cross else ""),
            functools.partial(_attention, join(path, name), attention,
                              child(layer, carrier_path), projection, gate, cross,
                              int(path.rpartition(".")[2]))))


def _layer_problem(path: str, layer: nn.Module,
                   attentions: list[tuple[str, nn.Module]]) -> str | None:
    """Why the host cannot cover ``layer`` at all (None when it may): a token mixer outside the
    attention interface, a layout row that refuses it, or no layout."""
    cls, names = type(layer).__name__, ", ".join(n for n, _ in layer.named_children())
    if not attentions:
        return (f"{path} ({cls}, children: {names}) has no module that calls the attention "
                f"interface: it mixes tokens some other way (a state-space, convolution or "
                f"linear-attention mixer), which {UNGATED}")
    if attentions == [("", layer)]:
        return (f"{path} ({cls}) is an attention module itself: the model runs attention, FFN "
                "and norms inline from parallel module lists (XLM), so no layer module carries "
                "the residual stream and no layout describes this layer; this host has no O "
                "form for it")
    mixers = token_mixers(layer)
    if mixers:
        return (f"{path} ({cls}) mixes tokens outside the attention interface in "
                f"{', '.join(join(path, m) for m in mixers)}, which {UNGATED}")
    layout = layout_of(layer)
    if layout is None:
        return f"{cls} (children: {names}): no layout describes this layer; {_HOWTO}"
    if layout.refused:
        return f"{cls} (layout {layout.name!r}): {layout.refused}; {_REFUSED_HOWTO}"
    return None


def _layer_sites(s: Structure, path: str, layer: nn.Module) -> None:
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
            s.add(norm, norm_site(join(path, name), norm))
    ffn_path, carrier_path = first_present(layer, layout.ffn), first_present(layer,
                                                                           layout.ffn_carrier)
    if ffn_path is None or (carrier_path is None and not layout.traced):
        s.problems.append(f"{type(layer).__name__}: layout {layout.name!r} finds no FFN branch "
                          f"or carrier in it; {_HOWTO}")
        return
    branch = child(layer, ffn_path)
    full = join(path, next(n for n, m in named if m is branch))
    if layout.traced:
        s.add(branch, Site(full, FFN, f"residual stream entering {full} (traced at the call)",
                           functools.partial(gate_traced_branch, full, layer, attentions[0][1],
                                             branch)))
    else:
        s.add(branch, Site(full, FFN, f"residual stream entering {join(path, carrier_path)}",
                           functools.partial(gate_branch, child(layer, carrier_path), branch)))
    for container in filter(None, (child(layer, p) for p in layout.adapters)):
        for adapter in container.children():
            full = join(path, next(n for n, m in named if m is adapter))
            s.add(adapter, Site(full, FFN, f"residual stream entering {full} (its input)",
                                functools.partial(gate_branch, adapter, adapter)))


def _attention(name: str, attention: nn.Module, carrier: nn.Module,
               projection: nn.Module | None, gate: Callable[[nn.Module, Any], Undo],
               cross: bool, layer_index: int, config: SiteConfig) -> Undo:
    """The interface route where the module calls the attention interface, the fused-kernel
    route where it calls SDPA itself (:mod:`.sdpa_route`), else the softmax route
    (:mod:`.softmax_route`; ``layer_index``: the layer's place in its list); a top-k
    indexer inside it ranks by the same presences (:mod:`.indexer`); ``gate`` gates the output
    projection's bias by the captured presences."""
    if calls_attention_interface(attention):
        undo_attention, state = attach_o_attention(attention, carrier, config, cross)
    elif calls_sdpa(attention):
        undo_attention, state = attach_sdpa_attention(name, attention, carrier, config, cross,
                                                      layer_index)
    else:
        undo_attention, state = attach_softmax_attention(name, attention, carrier, config, cross,
                                                         layer_index)
    steps = [lambda: undo_attention, lambda: attach_indexer(name, attention, state)]
    if projection is not None:
        steps.append(lambda: gate(projection, state))
    return patch_all(*steps)


def _structure(prefix: str, backbone: nn.Module) -> Structure:
    s = Structure()
    lists = layer_lists(backbone)
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
            "oretrofit.register_module_site(ThatClass, 'attention', apply)")
        return s
    for list_path, layers in lists:
        for i, layer in enumerate(layers):
            _layer_sites(s, join(prefix, list_path, str(i)), layer)
    for list_path, attentions in _self_attending_lists(backbone, [p for p, _ in lists]):
        s.problems.append(
            f"{join(prefix, list_path)}: {', '.join(attentions)} computes attention itself (no "
            "attention interface) without a softmax over the keys while other layers use it, so "
            "neither the O attention function nor the softmax route applies there. Register a site for that class with "
            "oretrofit.register_module_site(ThatClass, 'attention', apply)")
    positional_convolutions(s, prefix, backbone, [p for p, _ in lists])
    parameters_between_layers(s, prefix, backbone, [p for p, _ in lists])
    if s.problems:
        return s
    outer_sites(s, prefix, backbone, [p for p, _ in lists])
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
                "AttentionInterface (decoder-only, encoder-only, encoder-decoder, MoE, ViT)")

    def matches(self, model: nn.Module) -> bool:
        return bool(backbones(model))

    def owned(self, model: nn.Module) -> list[str]:
        """Each outermost ``PreTrainedModel`` whole: its heads (LM head, pooler, classifier,
        ``final_logits_bias``) are per-token read-outs of the gated stream and mix no tokens."""
        return [path for path, _ in pretrained_models(model)]

    def _structures(self, model: nn.Module) -> list[tuple[str, nn.Module, Structure]]:
        """Derived once per model (check, uncovered and sites each read it): kept while the
        model's modules and the layout rows are the same objects."""
        fingerprint = (tuple(map(id, model.modules())), tuple(map(id, LAYOUTS)))
        cached = _CACHE.get(model)
        if cached is None or cached[0] != fingerprint:
            cached = _CACHE[model] = (fingerprint, [(path, _structure(path, b))
                                                    for path, b in backbones(model)])
        return [(path, model.get_submodule(path), s) for path, s in cached[1]]

    def check(self, model: nn.Module) -> None:
        # a release newer than every tested one: the model's architecture is checked on a tiny
        # copy once the host finds it can cover it (last), instead of refusing the release
        newer = untested_newer(transformers_version())
        if not newer:
            check_transformers()
        structures = self._structures(model)
        # a model the host covers only from a later release (results/transformers-compat.md)
        later = [why for _, backbone, _ in structures
                 for why in [not_covered_yet(type(backbone).__name__,
                                             getattr(backbone.config, "model_type", ""))] if why]
        # parameter values: read on every check (the cached structures hold module shapes only)
        values = [p for path, backbone, _ in structures
                  for p in initial_state_problems(path, backbone)]
        problems = list(dict.fromkeys(later + [p for _, _, s in structures for p in s.problems]
                                      + values))
        if problems:
            raise RetrofitError("the transformers host cannot cover "
                                f"{type(model).__name__}: " + " | ".join(problems))
        # a subclass redefining what transformers' tested code does: checked as a newer release is
        overridden = overrides(model)
        if newer or overridden:
            verify(model, overridden, newer)

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

    def attach_to_model(self, model: nn.Module) -> Undo:
        """What the retrofit adds to the retrofitted model as a whole, after its sites:
        ``save_pretrained`` writes the patch spec beside the weights (:mod:`.pretrained`); each
        transformers model's KV cache gets its presence layers before its forward runs
        (:func:`.cache.carry_presences`); the attention kernel is checked and the cache layers'
        carrying classes made now, not in a compiled call (:func:`prepare_kernels`)."""
        prepare_kernels(model)
        carrying_classes()
        return patch_all(lambda: keep_spec_on_save(model), *(
            lambda m=m: m.register_forward_pre_hook(carry_presences_hook, with_kwargs=True).remove
            for _, m in pretrained_models(model)))


HOST = register_host(TransformersHost())
