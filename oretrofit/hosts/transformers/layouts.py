"""Where transformers layers really differ: the table of layouts, and the structure derived
from a loaded model.

Derived from the model, for every architecture:

* **layers**: the elements of the outermost ``nn.ModuleList`` whose elements contain a module
  that calls the attention interface (``ALL_ATTENTION_FUNCTIONS``); where each element holds
  nothing but a list of layers (ALBERT's layer groups), that list's elements;
* **attention**: those modules; the first in a layer is its self-attention (carrier: the
  residual stream entering the layer), later ones attend to the encoder output;
* **output projection**: the attention module's ``o_proj`` / ``out_proj`` / ``c_proj`` /
  ``dense`` / ``o`` / ``out_lin`` / ``Wo`` (``nn.Linear`` or ``Conv1D``), else the one such child
  its forward calls after the attention interface (InternVL's ``projection_layer``), else its
  parent's ``output.dense`` (BERT, whose self-attention module has none) or ``output``
  (BigBird-Pegasus);
* **norms**: leaf modules whose class name ends in ``Norm`` (LayerNorm, RMSNorm, T5LayerNorm,
  Nemotron's LayerNorm1P, …),
  except per-head query/key norms (``q_norm``, ``k_layernorm``, …: they act on q/k, inside the
  attention site, not on the residual stream);
* **tables**: ``nn.Embedding`` lookups outside the layers that are not the word embedding
  (learned positions, token types), and leaf modules named ``…PositionalEmbedding`` that are
  not rotary (M2M100's sinusoidal table, a buffer), added to the word embedding inside the module that takes
  ``inputs_embeds``;
* **token mixers outside attention**: convolutions over more than one position and recurrent
  modules inside a layer (Mamba, short convolutions, linear attention), and layers with no
  attention module at all; the host cannot gate them, so a model holding one is refused.

The table below says, per layout, which module is the FFN branch and which module's input is
the residual stream entering it (and the cross-attention's); for the MLP layers no other row
describes, which stream that is is read from the layer's call (:mod:`.stream`: parallel residual,
pre-norm or post-norm), not from module names. Rows are tried in order; the first
whose ``applies`` holds wins. A row with ``refused`` set describes a family the host knows it
cannot cover; a layer it applies to is refused with that reason. :func:`register_layout` puts a
new row first.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from dataclasses import dataclass
from typing import Callable

from torch import nn

__all__ = ["Layout", "LAYOUTS", "register_layout", "unregister_layout", "layout_of",
           "calls_attention_interface", "computes_attention", "eager_class", "forward_source",
           "attention_modules", "child", "is_attention_named", "is_norm", "is_norm_named",
           "is_projection", "is_qk_norm", "output_projection", "sequence_first_output",
           "token_mixers", "is_additive_table"]

OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "c_proj", "dense", "o", "out_lin", "Wo", "wo")


@dataclass(frozen=True)
class Layout:
    """How one family of layers wires its branches.

    ``ffn``: candidate paths (relative to the layer) of the module whose output is the FFN
    branch, first present wins. ``ffn_carrier``: candidate paths of the module whose hidden-state
    input is the residual stream entering the FFN branch (``""`` = the layer itself).
    ``cross_carrier``: the same for cross-attention. ``applies(layer)``: whether the row
    describes this layer. Paths may index module lists (``layer.-1``). ``refused``: why the host
    cannot cover this family (then ``ffn`` / ``ffn_carrier`` are empty and the layer is refused).
    ``adapters``: paths of containers whose every child is a residual branch of its own, added
    to the stream it reads (X-MOD's per-language adapters): gated h + ρτ(h)·adapter(h), h its
    input. ``traced``: the FFN carrier is read from the layer's call (:mod:`.stream`), not named
    (``ffn_carrier`` is empty).
    """

    name: str
    examples: str
    applies: Callable[[nn.Module], bool]
    ffn: tuple[str, ...]
    ffn_carrier: tuple[str, ...]
    cross_carrier: tuple[str, ...] = ()
    refused: str = ""
    adapters: tuple[str, ...] = ()
    traced: bool = False


def child(module: nn.Module, path: str) -> nn.Module | None:
    """``module``'s descendant at dotted ``path`` (integers index lists, negative from the end);
    ``""`` is the module itself; None when absent."""
    for part in filter(None, path.split(".")):
        if part.lstrip("-").isdigit() and isinstance(module, (nn.ModuleList, nn.Sequential)):
            index = int(part)
            if not -len(module) <= index < len(module):
                return None
            module = module[index]
        else:
            module = getattr(module, part, None)
            if not isinstance(module, nn.Module):
                return None
    return module


def first_present(layer: nn.Module, paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if child(layer, p) is not None), None)


@functools.cache
def forward_source(cls: type) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


def calls_attention_interface(module: nn.Module) -> bool:
    """Whether ``module``'s forward dispatches through transformers' attention interface."""
    source = forward_source(type(module))
    return "ALL_ATTENTION_FUNCTIONS" in source or "attention_interface(" in source


_ATTENTION_CLASS = re.compile(r"Attention|Attn")


def is_attention_named(module: nn.Module) -> bool:
    """Whether ``module``'s class is named ``…Attention`` / ``…Attn``."""
    return _ATTENTION_CLASS.search(type(module).__name__) is not None

# softmax(x, dim) / x.softmax(dim) / nn.Softmax(dim=-1)(x) (ImageGPT)
_SOFTMAX_CALL = re.compile(r"softmax\(|Softmax\(")


@functools.cache
def _takes_softmax(cls: type) -> bool:
    """Whether ``cls``'s source, or a function of its modeling file that it calls by name (CTRL's
    ``scaled_dot_product_attention``), calls a softmax: linear attention (MiniMax's lightning
    attention) does not, and stays refused as a mixer outside attention."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    if _SOFTMAX_CALL.search(source):
        return True
    namespace = vars(inspect.getmodule(cls) or object)
    return any(inspect.isfunction(namespace.get(name))
               and _SOFTMAX_CALL.search(_source_of(namespace[name])) is not None
               for name in set(re.findall(r"(?<![.\w])(\w+)\(", source)))


@functools.cache
def eager_class(cls: type) -> type | None:
    """The class whose ``forward`` computes ``cls``'s attention weights by a softmax: ``cls``
    itself when it takes one; when ``cls.forward`` calls the fused kernel
    (``scaled_dot_product_attention``) instead, the nearest base class defining ``forward`` that
    takes a softmax (the eager implementation the model would have built with
    ``attn_implementation="eager"``, same weights: Data2Vec-vision's ``…SdpaSelfAttention``);
    None otherwise."""
    if _takes_softmax(cls):
        return cls
    if "scaled_dot_product_attention(" not in forward_source(cls):
        return None
    return next((base for base in cls.__mro__[1:]
                 if "forward" in vars(base) and _takes_softmax(base)), None)


def _source_of(function: Callable) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _own_class(module: nn.Module) -> type:
    """The module's class before a site swapped it (:func:`oretrofit._surgery.patching.set_site`)."""
    return module.__dict__.get("_oretrofit", {}).get("original_class", type(module))


def computes_attention(module: nn.Module) -> bool:
    """Whether ``module`` computes attention weights itself (the softmax route): its class is
    named ``…Attention`` / ``…Attn`` and takes a softmax (:func:`eager_class`), it does not call
    the attention interface, and no module inside it is attention-named (of ``BertAttention`` ⊃
    ``BertSelfAttention``, the inner one)."""
    return (is_attention_named(module) and not calls_attention_interface(module)
            and eager_class(_own_class(module)) is not None
            and not any(is_attention_named(m) for m in module.modules() if m is not module))


def attention_modules(layer: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of the attention modules in ``layer``, in call-site order: those that
    call the attention interface and those that compute their weights themselves, outside any
    of the former."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in layer.named_modules():
        if any(name.startswith(f + ".") for f, m in found if calls_attention_interface(m)):
            continue
        if calls_attention_interface(module) or computes_attention(module):
            found.append((name, module))
    return found


def _called_before(layer: nn.Module, first: str, second: str) -> bool:
    """Whether the layer's forward calls ``self.first(`` before ``self.second(`` (source order)."""
    source = forward_source(type(layer))
    a, b = source.find(f"self.{first}("), source.find(f"self.{second}(")
    return 0 <= a < b


_NORM_CLASS = re.compile(r"Norm(1P)?$")


def is_norm_named(module: nn.Module) -> bool:
    """Whether ``module``'s class name ends in ``Norm`` (or is Nemotron's ``LayerNorm1P``)."""
    return _NORM_CLASS.search(type(module).__name__) is not None


def is_norm(module: nn.Module) -> bool:
    """A token-local normalisation: a leaf whose class name ends in ``Norm`` (or Nemotron's
    ``LayerNorm1P``, weight stored as w − 1), not a weight parametrisation (torch's
    ``_WeightNorm`` computes a weight, not a hidden state)."""
    return (is_norm_named(module)
            and not type(module).__module__.startswith("torch.nn.utils")
            and not any(True for _ in module.children()))


_QK_NORM = re.compile(r"(q|k|query|key)_?(norm|layernorm|layer_norm)", re.IGNORECASE)


def is_qk_norm(path: str) -> bool:
    """A per-head query/key norm (``q_norm``, ``k_layernorm``, …), by its attribute name."""
    return _QK_NORM.fullmatch(path.rpartition(".")[2]) is not None


def output_projection(attention: nn.Module, parent: nn.Module | None) -> nn.Module | None:
    """The projection the attention output goes through: a child named as in
    :data:`OUTPUT_PROJECTIONS`, else the one projection the forward calls after the attention
    (:func:`_projection_called_after`), else the parent's ``output.dense`` / ``output``."""
    for name in OUTPUT_PROJECTIONS:
        projection = getattr(attention, name, None)
        if isinstance(projection, nn.Module):
            return projection
    called = _projection_called_after(attention)
    if called is not None or parent is None:
        return called
    return next((m for m in (child(parent, "output.dense"), child(parent, "output"))
                 if isinstance(m, nn.Linear)), None)


_SELF_CALL = re.compile(r"self\.(\w+)\(")


def is_projection(module: object) -> bool:
    """A token-wise projection: ``nn.Linear`` or transformers' ``Conv1D`` (GPT-2's)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def _projection_called_after(attention: nn.Module) -> nn.Module | None:
    """The projection child (``nn.Linear`` / ``Conv1D``) that ``attention``'s forward calls after
    its last call of the attention interface (InternVL's ``projection_layer``, GLM-Image's
    ``proj``): once the weights are applied, the only projection left is the one the output
    goes through. None when the forward calls no such child there, or more than one (which of
    them carries the output the source does not say)."""
    source = forward_source(_own_class(attention))
    start = _after_attention(source)
    if start < 0:
        return None
    called = {name for name in _SELF_CALL.findall(source, start)
              if is_projection(getattr(attention, name, None))}
    return getattr(attention, called.pop()) if len(called) == 1 else None


def _after_attention(source: str) -> int:
    """Where a forward's ``source`` last calls the attention interface (-1: it does not)."""
    return max(source.rfind("attention_interface("), source.rfind("ALL_ATTENTION_FUNCTIONS"))


_SWAP_LEADING_AXES = re.compile(r"\.(permute\(1, 0\b|transpose\(0, 1\))")


def sequence_first_output(attention: nn.Module, projection: nn.Module) -> bool:
    """Whether ``attention``'s forward hands ``projection`` its output sequence-first
    ``(tokens, batch, ·)``: between its last call of the attention interface and its call of
    the projection it swaps the output's two leading axes (MLCD's ``permute(1, 0, 2, 3)``)."""
    source = forward_source(_own_class(attention))
    name = next((n for n, m in attention.named_children() if m is projection), None)
    start = _after_attention(source)
    end = source.find(f"self.{name}(", start) if name is not None and start >= 0 else -1
    return end >= 0 and _SWAP_LEADING_AXES.search(source, start, end) is not None


_POSITION_TABLE = re.compile(r"Positional?Embeddings?$")


def is_additive_table(module: nn.Module) -> bool:
    """A per-token lookup added to the word embedding: an ``nn.Embedding``, or a leaf module
    whose class name ends in ``PositionalEmbedding`` and is not rotary (sinusoidal tables held
    as buffers)."""
    if isinstance(module, nn.Embedding):
        return True
    name = type(module).__name__
    return (_POSITION_TABLE.search(name) is not None and "Rotary" not in name
            and not any(True for _ in module.children()))


def token_mixers(layer: nn.Module) -> list[str]:
    """``'path (Class, kernel k)'`` of modules in ``layer`` that mix tokens outside the attention
    interface: convolutions whose kernel spans more than one position, recurrent modules."""
    found = []
    for name, module in layer.named_modules():
        if isinstance(module, nn.modules.conv._ConvNd) and math.prod(module.kernel_size) > 1:
            found.append(f"{name} ({type(module).__name__}, kernel {tuple(module.kernel_size)})")
        elif isinstance(module, nn.RNNBase):
            found.append(f"{name} ({type(module).__name__})")
    return found


def _has(*paths: str) -> Callable[[nn.Module], bool]:
    return lambda layer: all(child(layer, p) is not None for p in paths)


def _pre_norm_fc(layer: nn.Module) -> bool:
    """fc1/fc2 layers: OPT says so in ``do_layer_norm_before``; others by call order."""
    flag = getattr(layer, "do_layer_norm_before", None)
    return bool(flag) if flag is not None else _called_before(layer, "final_layer_norm", "fc1")


def _adds_own_residual(layer: nn.Module) -> bool:
    """The layer's MLP takes the residual and adds it (its forward has a ``residual``
    parameter), and that residual is the stream in front of the MLP's norm (BLOOM's
    ``apply_residual_connection_post_layernorm`` would make it the norm's output instead)."""
    mlp = child(layer, first_present(layer, ("ffn", "mlp")) or "ffn")
    return (mlp is not None and "residual" in inspect.signature(mlp.forward).parameters
            and not getattr(layer, "apply_residual_connection_post_layernorm", False))


_MLPS = ("mlp", "feed_forward", "block_sparse_moe")
_T5_FFNS = ("layer.-1.DenseReluDense", "layer.-1.mlp")

_FFN_NORMS = ("layernorm2", "rms_norm2", "ff_layer_norm")

_PER_LAYER_INPUTS = (
    "every layer adds a per-layer embedding looked up from the token ids (per_layer_input_gate / "
    "per_layer_projection), which no carrier presence gates, and Gemma3n's AltUp keeps several "
    "copies of the residual stream; a null token would not stay inert")
_PARALLEL_EXPERTS = (
    "the layer runs a router and experts next to its MLP (two FFN branches the layout cannot "
    "gate as one); a null token would not stay inert")

_GRID_MODULE = re.compile(r"PatchMerging|Subsample")


def _on_grid(layer: nn.Module) -> bool:
    """Whether ``layer`` holds its tokens as a 2-D grid of patches: it partitions them into
    windows (a ``window_partition`` in its modeling file or on one of its classes) or merges /
    subsamples neighbours (a ``…PatchMerging`` / ``…Subsample`` module)."""
    return any(_GRID_MODULE.search(type(m).__name__) or hasattr(type(m), "window_partition")
               or "window_partition" in vars(inspect.getmodule(type(m)) or object)
               for m in layer.modules())


_GRID = ("its layers hold the tokens as a 2-D grid of patches read by position: window "
         "attention partitions the grid into windows (zero-padded to whole windows, shifted "
         "between layers), and patch merging / subsampling pools neighbouring cells into one "
         "token; zero tokens cannot be inserted without moving the grid, the windows' padding is "
         "attended to without being a token with a presence, and a pooled null cell takes its "
         "neighbours' values; a null token would not stay inert")

LAYOUTS: list[Layout] = [
    Layout("per-layer inputs / AltUp", "Gemma3n, Gemma4 (hidden_size_per_layer_input > 0)",
           lambda layer: (child(layer, "per_layer_input_gate") is not None
                          or child(layer, "altup") is not None),
           ffn=(), ffn_carrier=(), refused=_PER_LAYER_INPUTS),
    Layout("MLP with parallel experts", "Gemma4 (enable_moe_block)",
           _has("mlp", "router", "experts"), ffn=(), ffn_carrier=(), refused=_PARALLEL_EXPERTS),
    # The layers read and write the residual stream as (tokens, batch, hidden): presences come
    # out (tokens, batch), and where tokens == batch no shape check could tell the axes apart.
    Layout("time-first layers", "FSMT, XLNet",
           lambda layer: type(layer).__module__.endswith((".modeling_fsmt", ".modeling_xlnet")),
           ffn=(), ffn_carrier=(),
           refused="its layers run the residual stream time-first (tokens, batch, hidden), so "
                   "the presences of its tokens cannot be placed on the attention scores' "
                   "(batch, tokens) axes; a null token would not stay inert"),
    # The same, channels-first: the layers read (batch, hidden, tokens) through 1x1 convolutions.
    Layout("channels-first layers", "SqueezeBERT",
           lambda layer: type(layer).__module__.endswith(".modeling_squeezebert"), ffn=(),
           ffn_carrier=(),
           refused="its layers run the residual stream channels-first (batch, hidden, tokens) "
                   "through 1x1 convolutions, so a norm or presence over the last axis would "
                   "read one channel of every token, not one token; a null token would not stay "
                   "inert"),
    # Per-token top-k sparse attention (DeepSeek-V3.2's indexer) is covered by .indexer; these
    # variants select keys that no presence describes.
    Layout("compressed sparse attention", "DeepSeek-V4",
           lambda layer: any(hasattr(m, "compress_rate") for m in layer.modules()), ffn=(),
           ffn_carrier=(),
           refused="its attention attends to compressed keys: a compressor pools each window of "
                   "compress_rate consecutive token slots into one key (a softmax over the "
                   "window), and an indexer picks the top-k of those; a null token inside a "
                   "window moves its key, an insertion shifts every later window, and a "
                   "compressed key has no presence of its own to weight or rank it by; a null "
                   "token would not stay inert"),
    Layout("block top-k sparse attention", "MiniMax-M3",
           lambda layer: any(hasattr(m, "indexer") and hasattr(m.indexer, "block_size")
                             for m in layer.modules()), ffn=(), ffn_carrier=(),
           refused="each query attends only to the blocks of index_block_size consecutive key "
                   "slots an indexer scores highest (max-pooled per block, the query's local "
                   "blocks always kept); an insertion shifts the block boundaries of every later "
                   "key, so which live keys a block holds, and whether it is kept, change with "
                   "it: no presence weighting of single keys keeps a whole-block selection; a "
                   "null token would not stay inert"),
    # Their layers also select keys by a top-k indexer; refused for the carrier, not the indexer.
    Layout("hyper-connection streams", "HY-V4, DeepSeek-V4", _has("attn_hc", "ffn_hc"), ffn=(),
           ffn_carrier=(),
           refused="the layer carries hc_mult copies of the residual stream per token "
                   "(hyper-connections: attn_hc / ffn_hc mix them into each branch's input and "
                   "spread the branch's output back over them), so a token's carrier is "
                   "(hc_mult, hidden) and the presence the host takes over a carrier's last axis "
                   "would be one per copy, not one per token: OAttention's key and receiver "
                   "gates are not defined for it"),
    Layout("2-D token grid", "Swin, Swin-v2, Donut-Swin, MaskFormer-Swin, SAM, ViTDet, LeViT",
           _on_grid, ffn=(), ffn_carrier=(), refused=_GRID),
    # X-MOD's output adds each language's adapter to the stream after the FFN: with
    # ln_before_adapter the stream is the norm's output, the adapter's own input; without, it
    # is the stream before that norm, inside XmodOutput.forward, which no module receives
    Layout("language adapters on the pre-norm stream", "X-MOD (ln_before_adapter=False)",
           lambda layer: (_has("output.adapter_modules")(layer)
                          and not getattr(child(layer, "output"), "ln_before_adapter", True)),
           ffn=(), ffn_carrier=(),
           refused="a per-language bottleneck adapter with biases is added to the residual "
                   "stream before the norm that feeds it (ln_before_adapter=False), a stream "
                   "computed inside the output module that no module receives, so no gate can "
                   "read its presence; a null token would not stay inert"),
    Layout("language adapters", "X-MOD", _has("intermediate", "output.dense",
                                              "output.adapter_modules"),
           ffn=("output.dense",), ffn_carrier=("intermediate",),
           cross_carrier=("crossattention",), adapters=("output.adapter_modules",)),
    # I-BERT's QuantLinear / QuantEmbedding return (value, scaling factor) pairs
    Layout("integer quantization", "I-BERT",
           lambda layer: any(type(m).__name__ == "QuantLinear" for m in layer.modules()),
           ffn=(), ffn_carrier=(),
           refused="its projections (QuantLinear), tables (QuantEmbedding) and norms "
                   "(IntLayerNorm) return (value, scaling factor) pairs, and with quant_mode they "
                   "compute in integers scaled by factors every token shares (QuantAct), where a "
                   "float presence gate is not defined; the host's projection and table gates "
                   "handle neither, so the attention's output bias and the position and "
                   "token-type tables would stay ungated; a null token would not stay inert"),
    # JetMoE's attention routes each token through its top-k of several (query, output)
    # projection pairs: experts.reduce, a method, projects and adds the mixture's bias
    Layout("mixture of attention heads", "JetMoE",
           lambda layer: any(type(m).__name__.endswith("MoA") for m in layer.modules()),
           ffn=(), ffn_carrier=(),
           refused="the attention output goes through a mixture of output projections routed "
                   "per token (experts.reduce, a method, not a module call) that adds its bias "
                   "inside, where no hook reaches it, so the bias stays ungated; a null token "
                   "would not stay inert"),
    Layout("T5 sub-layers", "T5, mT5, UMT5, Switch Transformers",
           lambda layer: first_present(layer, _T5_FFNS) is not None,
           ffn=_T5_FFNS, ffn_carrier=("layer.-1",), cross_carrier=("layer.1",)),
    Layout("intermediate/output split", "BERT, RoBERTa, ELECTRA, XLM-R",
           _has("intermediate", "output.dense"), ffn=("output.dense",),
           ffn_carrier=("intermediate",), cross_carrier=("crossattention",)),
    Layout("fc1/fc2 inline, pre-norm", "OPT, mBART",
           lambda layer: _has("fc1", "fc2", "final_layer_norm")(layer) and _pre_norm_fc(layer),
           ffn=("fc2",), ffn_carrier=("final_layer_norm",),
           cross_carrier=("encoder_attn_layer_norm",)),
    Layout("fc1/fc2 inline, post-norm", "BART", _has("fc1", "fc2"), ffn=("fc2",),
           ffn_carrier=("fc1",), cross_carrier=("encoder_attn",)),
    # the FFN runs inline (ff_chunk: ffn, activation, ffn_output), full_layer_layer_norm after
    Layout("ffn/ffn_output inline, post-norm", "ALBERT",
           _has("ffn", "ffn_output", "full_layer_layer_norm"), ffn=("ffn_output",),
           ffn_carrier=("ffn",)),
    Layout("FFN module, post-norm", "DistilBERT", _has("ffn", "output_layer_norm"),
           ffn=("ffn",), ffn_carrier=("ffn",)),
    Layout("sandwich norms", "Gemma2, Gemma3, T5Gemma", _has("mlp", "pre_feedforward_layernorm"),
           ffn=("mlp",), ffn_carrier=("pre_feedforward_layernorm",),
           cross_carrier=("pre_cross_attn_layernorm",)),
    # MptMLP and BloomMLP add the residual they are given: the branch is their down projection
    Layout("FFN adding its own residual", "MPT, BLOOM", _adds_own_residual,
           ffn=("ffn.down_proj", "mlp.dense_4h_to_h"),
           ffn_carrier=("norm_2", "post_attention_layernorm")),
    # which tensor the MLP's output is added to is read from the layer's call (.stream):
    # the input of the norm in front of it (pre-norm; the layer input where attention and MLP
    # read it side by side), or its own input (post-norm, or norms after the branches)
    Layout("MLP branch, stream traced",
           "Llama, GPT-2, GPT-J, Phi, GPT-NeoX, Falcon, DINOv2, CLIP, OLMo2, Wav2Vec2, OpenAI-GPT",
           lambda layer: first_present(layer, _MLPS) is not None, ffn=_MLPS, ffn_carrier=(),
           cross_carrier=("ln_cross_attn",), traced=True),
    Layout("pre-norm ffn", "CTRL, AIMv2, NLLB-MoE",
           lambda layer: _has("ffn")(layer) and first_present(layer, _FFN_NORMS) is not None,
           ffn=("ffn",), ffn_carrier=_FFN_NORMS, cross_carrier=("cross_attention_layer_norm",)),
]


def register_layout(layout: Layout) -> Layout:
    """Add a layout row ahead of the built-in ones (a row with the same name is replaced)."""
    LAYOUTS[:] = [layout] + [row for row in LAYOUTS if row.name != layout.name]
    return layout


def unregister_layout(name: str) -> None:
    """Remove the layout row called ``name`` (no error when there is none)."""
    LAYOUTS[:] = [row for row in LAYOUTS if row.name != name]


def layout_of(layer: nn.Module) -> Layout | None:
    return next((row for row in LAYOUTS if row.applies(layer)), None)
