"""The transformers host's sites at the token boundary, outside the layers (:mod:`.host`
derives the layers' own): norms and additive tables of the embeddings (OInject h + ρτ(h)·e,
gated by the word embedding, or the patch embedding where there is no ``inputs_embeds``; a
position term an embeddings module computes itself, gated by its patch projection's output),
attention-pooling heads (:mod:`.pooling`),
biased projections between the embedding and the first layer (W x + ρτ(x)·b), one positional
convolution next to the layers (h + ρτ(h)·conv(h)), and the refusal of learned states added to
every token where no site can gate them (an initial state, parameters added between layers).
Also :class:`Structure`, what one backbone's sites are built from.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Iterator

import torch
from torch import nn

from ..._surgery.host import Site
from ..._surgery.patching import set_site
from ..torch_nn import NORM, ONormSite
from .gates import POSITION_TERMS, gate_patch_table, gate_position_term, gate_projection
from .layouts import is_additive_table, is_norm, is_projection, token_mixers
from .pooling import pooling_attention, pooling_site
from .gates import INJECT, accepts_inputs_embeds, gate_branch, gate_table

__all__ = ["Structure", "UNGATED", "join", "norm_site", "outer_sites", "positional_convolutions",
           "initial_state_problems"]

UNGATED = ("the transformers host cannot gate (a null token would move its neighbours): no O "
            "form for this mixer exists here, so the model is refused; only models whose "
            "layers all mix tokens by softmax attention are covered")

def join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


@dataclass
class Structure:
    """What one backbone's sites are built from; ``problems`` refuse it, ``uncovered`` is
    reported."""

    sites: dict[int, list[Site]] = field(default_factory=dict)     # id(anchor module) -> sites
    problems: list[str] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)

    def add(self, anchor: nn.Module, site: Site) -> None:
        """Add ``site`` at ``anchor``, the module it patches (its ``modules`` unless named)."""
        self.sites.setdefault(id(anchor), []).append(
            site if site.modules else replace(site, modules=(anchor,)))


def norm_site(name: str, norm: nn.Module) -> Site:
    return Site(name, NORM, f"state entering {name}",
                functools.partial(set_site, norm, ONormSite, NORM))


def outer_sites(s: Structure, prefix: str, backbone: nn.Module, layer_paths: list[str]) -> None:
    """Norms and additive tables outside the layers (embeddings, final norms)."""
    inner = lambda n: any(n == p or n.startswith(p + ".") for p in layer_paths)   # noqa: E731
    word = _word_embedding(backbone)
    words = _word_embeddings(backbone)
    named = dict(backbone.named_modules())
    first_layer = list(named).index(f"{layer_paths[0]}.0")
    heads: list[str] = []
    terms: list[str] = []        # embeddings modules that compute their position term themselves
    for index, (name, module) in enumerate(named.items()):
        if inner(name) or any(name.startswith(h + ".") for h in heads):
            continue
        if pooling_attention(module) is not None:
            heads.append(name)
            _pooling_head_site(s, join(prefix, name), module)
            continue
        index = len(named) if _in_pooler(name) else index    # a head, whatever its order
        patches = _position_term_patches(module) if index < first_layer else None
        if patches is not None:
            terms.append(name)
            s.add(module, Site(join(prefix, name), INJECT,
                               f"patch embedding of {type(module).__name__} (its position term)",
                               functools.partial(gate_position_term, module, patches)))
        if index < first_layer and _biased_projection(module):
            _projection_site(s, join(prefix, name), module, word)
        elif is_norm(module):
            s.add(module, norm_site(join(prefix, name), module))
        elif any(name.startswith(t + ".") for t in terms) and is_additive_table(module):
            continue                          # its weight is read by the owner's position term
        elif (is_additive_table(module) and not any(_is_word(module, w) for w in words)
              and not _feeds_scores(module, word)):
            _table_site(s, prefix, name, module, named, word)
        elif index < first_layer and "Rotary" not in type(module).__name__:
            s.uncovered += [f"{join(prefix, name, b)} (float buffer of {type(module).__name__}: "
                            "a table added inline, no module to gate it by the carrier)"
                            for b in _inline_tables(module)]


def _inline_tables(module: nn.Module) -> list[str]:
    """Names of ``module``'s own 2-D float tensors that are not parameters: its buffers, and
    plain tensor attributes (CTRL's ``pos_encoding`` in transformers 4.x)."""
    plain = [(n, t) for n, t in vars(module).items() if isinstance(t, torch.Tensor)
             and not isinstance(t, nn.Parameter)]
    return [n for n, t in [*module.named_buffers(recurse=False), *plain]
            if t.is_floating_point() and t.dim() == 2]


def _position_term_patches(owner: nn.Module) -> nn.Module | None:
    """The patch projection of an embeddings module that computes its position term in a method
    of its own from a table's weight (:data:`~.gates.POSITION_TERMS`: SigLIP2's table resized per
    image, Gemma4's lookup by pixel positions): its one ``nn.Linear`` child, reading each row's
    flattened patch. None for any other module."""
    if not any(callable(getattr(type(owner), method, None)) for method in POSITION_TERMS):
        return None
    linears = [m for m in owner.children() if isinstance(m, nn.Linear)]
    return linears[0] if len(linears) == 1 else None


def _pooling_head_site(s: Structure, path: str, head: nn.Module) -> None:
    """An attention-pooling head (:mod:`.pooling`): one attention site, its norm and MLP a
    read-out of the pooled vector."""
    site = pooling_site(path, head)
    if isinstance(site, str):
        s.problems.append(site)
    else:
        s.add(head, site)


def _projection_site(s: Structure, name: str, projection: nn.Module,
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
    return is_projection(module) and module.bias is not None


def _is_word(embedding: nn.Module, word: nn.Module | None) -> bool:
    return word is not None and (embedding is word or (
        getattr(embedding, "weight", None) is not None and embedding.weight is word.weight))


def _table_site(s: Structure, prefix: str, name: str, table: nn.Module,
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
    s.add(table, Site(join(prefix, name), INJECT,
                      f"word embedding (inputs_embeds) of {join(prefix, owner) or 'root'}",
                      functools.partial(gate_table, table, lookup, named[owner])))


def _patches(owner: nn.Module) -> nn.Module | None:
    """The one patchifying convolution (kernel = stride > 1) in ``owner``, else None: 2-D
    patches (ViT) or 3-D tubelets of frames × patch (ViViT, V-JEPA 2, Qwen-VL's flattened
    patches); kernel = stride, so every output token reads its own patch and no other."""
    found = [m for m in owner.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d))
             and m.kernel_size == m.stride and math.prod(m.kernel_size) > 1]
    return found[0] if len(found) == 1 else None


def _patch_table_site(s: Structure, prefix: str, name: str, table: nn.Module,
                      owner: nn.Module) -> None:
    """A position table added to patch embeddings (no ``inputs_embeds`` to take the carrier
    from): gated by the patch embedding's presence (:func:`gate_patch_table`)."""
    patches = _patches(owner)
    if patches is None:
        s.uncovered.append(f"{join(prefix, name)} ({type(table).__name__}: an additive table "
                           "with no word embedding / inputs_embeds or patch embedding to gate it "
                           "by)")
        return
    width = getattr(table, "embedding_dim", None)
    learned = [w for w in owner.parameters(recurse=False) if w.shape[-1] == width]
    s.add(table, Site(join(prefix, name), INJECT, f"patch embedding of {type(owner).__name__}",
                      functools.partial(gate_patch_table, table, patches, owner, learned)))


def positional_convolutions(s: Structure, prefix: str, backbone: nn.Module,
                             lists: list[str]) -> None:
    """Modules next to a layer list (its parent's other children) that mix tokens: one
    convolution over positions, stride 1, no other weights (HuBERT's ``pos_conv_embed``, added to
    the stream) is gated h + ρτ(h)·conv(h); anything else is refused. Siblings that form the
    carrier boundary (the word embedding, a patchifying convolution) are not next to it."""
    word = _word_embedding(backbone)
    for parent_path, _, name, module, _ in _next_to_layers(backbone, lists):
        mixers = token_mixers(module)
        if (not mixers or _patches(module) is not None
                or any(m is word for m in module.modules())):
            continue                                       # no mixer, or the carrier boundary
        path = join(prefix, parent_path, name)
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
                f"where it read zero padding), which {UNGATED}")


def parameters_between_layers(s: Structure, prefix: str, backbone: nn.Module,
                              lists: list[str]) -> None:
    """Parameters a module registered after a layer list, next to it (its parent's other
    children), holds itself, where the module is no site of its own (a norm, a lookup, a
    projection, a convolution over positions) and no rotary table: the parent adds them to the
    stream between layers inside its forward (YOLOS's ``mid_position_embeddings``, one position
    table per layer), where no site gates them, so a null token's stream would turn non-zero
    there. A submodule's parameters are its own (Higgs Audio's ``embed_audio_tokens`` holds a
    lookup, not a table added between layers)."""
    for parent_path, parent, name, module, after in _next_to_layers(backbone, lists):
        if (not after or is_norm(module) or is_projection(module)
                or isinstance(module, (nn.Embedding, nn.modules.conv._ConvNd))
                or "Rotary" in type(module).__name__ or token_mixers(module) or _in_pooler(name)):
            continue
        s.uncovered += [f"{join(prefix, parent_path, name, weight)} (parameter of "
                        f"{type(module).__name__} next to the layers: added to the stream "
                        "between layers inside the forward of "
                        f"{type(parent).__name__}, no module to gate it by the carrier)"
                        for weight, _ in module.named_parameters(recurse=False)]


def _next_to_layers(backbone: nn.Module, lists: list[str]
                    ) -> Iterator[tuple[str, nn.Module, str, nn.Module, bool]]:
    """``(parent path, parent, name, module, after)`` for each module next to a layer list (its
    parent's other children, other layer lists left out); ``after``: registered after the list."""
    for list_path in lists:
        parent_path, _, list_name = list_path.rpartition(".")
        parent = backbone.get_submodule(parent_path) if parent_path else backbone
        after = False
        for name, module in parent.named_children():
            after = after or name == list_name
            if join(parent_path, name) not in lists:
                yield parent_path, parent, name, module, after


# states a backbone adds to every token's stream inside its forward, from no module a site can
# gate: {parameter name: what it is}
_INITIAL_STATES = {"z_L_init": "the low-level state every token's low cycle starts from "
                               "(HRM: the L stack reads z_L + x with z_L = z_L_init at first)"}


def initial_state_problems(prefix: str, backbone: nn.Module) -> list[str]:
    """A non-zero :data:`_INITIAL_STATES` parameter of ``backbone``: a null token's stream is
    never zero there, so its states move and its neighbours read it (zero, it adds nothing)."""
    return [f"{join(prefix, name)} ({type(backbone).__name__}) is non-zero: it is {what}, added "
            "to every token inside the model's forward where no site can gate it, so a null "
            "token's state is never zero; the host covers the model only with it zero (as HRM "
            "initialises it and never trains it): zero it, or leave the model unretrofitted"
            for name, what in _INITIAL_STATES.items()
            if isinstance(getattr(backbone, name, None), nn.Parameter)
            and bool(getattr(backbone, name).detach().any())]


