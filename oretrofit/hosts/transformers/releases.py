"""Shared transformers (5.x) plumbing of the generic transformers host: presence capture and
branch gating with hooks.

* transformers hands the attention function projected q/k/v, not the carrier. A forward
  pre-hook on the module that receives the carrier (the residual stream entering the branch)
  captures its presences (:class:`CarrierPresence`); the attention function
  (:mod:`.attention`) reads them from the attention module. Cross-attention takes
  its sources' presences from the encoder output the attention module is given.
* With a KV cache the presences of cached keys live in the cache, next to the keys
  (:mod:`.cache`), so generation after a prompt with null tokens still excludes them.
* :func:`gate_branch`, :func:`gate_output_bias` and :func:`gate_table` gate residual branches,
  biased output projections (``nn.Linear`` and GPT-2's ``Conv1D``) and additive position /
  token-type tables by the presence of the stream they belong to (:mod:`.gates`: the gates
  outside the layers that no ``inputs_embeds`` carrier reaches).
* :func:`zero_padded_inputs` builds a mask-free padded batch at the carrier boundary.
* :func:`check_transformers` is the version gate: it admits the releases
  ``results/transformers-compat.md`` shows passing (:data:`TESTED_RELEASES`) and the later patch
  releases of their minors, and refuses any other release naming the ``pip install`` that fixes it.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..._components import o_gate
from ..._patching import SiteConfig, Undo, noop, set_site, site_config
from ..._presence import presence
from ..._host import RetrofitError
from ..._presence_memo import carrier_presence
from ..torch_nn import ATTENTION, gated_linear, patch_all
from .cache import UNSEEN, cache_of, expect_keys

__all__ = ["CarrierPresence", "carrier_of", "gate_branch", "gate_branch_output",
           "gate_output_bias", "gate_table", "gated_projection", "INJECT",
           "zero_padded_inputs", "check_transformers", "transformers_version", "TESTED_RELEASES",
           "supported_range", "supported_text", "requirement", "admits", "COVERED_FROM",
           "INTERFACE", "SOFTMAX_ROUTE", "NEW_LAYOUT", "TOP_K_INDEXER",
           "covered_from", "before_covered", "not_covered_yet"]


INJECT = "inject"

# The passing rows of results/transformers-compat.md (scripts/transformers_compat.py runs the
# host's tests on the newest patch release of every minor from 4.53, each in its own environment).
TESTED_RELEASES: tuple[str, ...] = (
    "5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1", "5.9.0", "5.10.4",
    "5.11.0", "5.12.1", "5.13.1", "5.14.1", "5.15.1", "5.16.1", "5.17.0", "5.18.0", "5.19.0",
    "5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0")

# Where support starts, and why not earlier. The host registers the mask function of its attention
# implementation with AttentionMaskInterface (transformers.masking_utils), first shipped in 4.53.0
# (AttentionInterface alone, from 4.51, would leave transformers building no mask for it).
# 4.53 to 4.57 have both, but there the BERT family (MiniLM among it) and more compute attention
# themselves, so the host cannot cover them (results/transformers-compat.md, the 4.x rows).
FIRST_MASK_INTERFACE = "4.53.0"
_BEFORE_MASK_INTERFACE = (
    f"support starts at 5.0.0: transformers before {FIRST_MASK_INTERFACE} has no "
    "AttentionMaskInterface (transformers.masking_utils), where the host registers the mask "
    "function of its attention implementation (without it transformers builds no mask for the "
    "implementation, and padding and causality would be lost)")
_4X = ("support starts at 5.0.0: transformers 4.53 to 4.57 have the attention and mask interfaces, "
       "but there BERT and its family (all-MiniLM-L6-v2 among them), DistilBERT, StableLM, "
       "Qwen2-MoE, OLMoE and Phi-MoE compute attention themselves (BertSdpaSelfAttention, ...), so "
       "the host cannot cover them, and the host's tests fail on more")

# Minors the gate refuses because their rows fail, with why (named in the refusal); the compat
# sweep tries them every time, and a minor leaves this table once its row passes.
BLOCKED: dict[str, str] = {
    "5.4": "transformers 5.4.0 cannot build the configs of OLMo, OLMo2, OLMo3, OLMoE, mBART, "
           "M2M100, Cohere2, ERNIE 4.5, EuroBERT, Phi-MoE and more with the huggingface-hub it "
           "installs (strict field validation: 'tie_word_embeddings expected int, got bool'); "
           "5.5 fixed it",
    "5.25": "transformers 5.25 installs since kernels 0.19.1 is on the package index, but there "
            "Falcon routes attention through the interface, so the host no longer refuses it and "
            "no test covers it yet (Falcon's refusal tests fail on it)",
}


# Architectures the host covers only from some admitted release on: model type -> (the first
# tested release where it does, why not before). Almost all because their modeling code computes
# attention itself before that release (the host then finds no module calling the interface);
# model types missing here are covered in every admitted release that has them. Measured, not
# read from changelogs: scripts/transformers_compat.py probes every architecture of
# tests/hosts/transformers/zoo.py in each release's environment (per row of the receipt: how many
# are covered, refused, absent; per architecture in its .json) and prints this table from the
# probes; the other rows (ESM, Qwen3.5, UMT5, Doge) are where that release's tests failed, the
# release found by running the failing contract in each release's environment.
# tests/hosts/transformers/test_releases.py checks the table against the receipt.
INTERFACE = "does not route attention through the attention interface"
_ESM = ("rotates queries and keys by sequence index, not by position_ids, so a null token "
        "inserted mid-sequence would move the tokens after it")
_QWEN35 = ("fails in transformers' own forward with full-attention layers only (has_previous_state "
           "asked of a cache without linear-attention layers), and with linear-attention layers "
           "the host refuses it (a token mixer outside the interface)")
_UMT5 = ("disagrees with itself under the retrofit at τ→0 (relative difference 0.87 on the tiny "
         "model, eager and SDPA alike), though it routes attention through the interface")
_DOGE = ("computes other attention under SDPA than under eager (its dynamic mask; relative "
         "difference 1.2 on the tiny model), and the retrofit follows eager, so it would change "
         "an SDPA model's outputs")
# Not in results/transformers-compat.json yet (the sweep has not run since the softmax route):
# measured by this suite on the newest tested release only, refused before it.
SOFTMAX_ROUTE = ("its attention is the module's own code, covered by the softmax route "
                 "(softmax_route.py), which is measured on this release only so far")
NEW_LAYOUT = ("has layers (or a decoder word embedding, or an attention output projection) the "
              "host describes from a layout or rule added on the newest tested release, measured "
              "on that release only so far")
TOP_K_INDEXER = ("selects its attention's keys with a top-k indexer (DeepSeek sparse attention), "
                 "which the host ranks by presence (indexer.py), measured on this release only so "
                 "far")
COVERED_FROM: dict[str, tuple[str, str]] = {
    "modernbert": ("5.1.0", INTERFACE),
    "qwen3_5_text": ("5.15.1", _QWEN35),              # the model type is new in 5.2
    "eurobert": ("5.3.0", INTERFACE),                # new in 5.3
    "jina_embeddings_v3": ("5.5.4", INTERFACE),      # new in 5.4 (refused: BLOCKED)
    "nomic_bert": ("5.5.4", INTERFACE),              # new in 5.5
    "esm": ("5.6.2", _ESM),
    "beit": ("5.9.0", INTERFACE),
    "nemotron": ("5.13.1", INTERFACE),
    "diffllama": ("5.13.1", INTERFACE),
    "t5": ("5.15.1", INTERFACE),
    "mt5": ("5.15.1", INTERFACE),
    "umt5": ("5.18.0", _UMT5),                       # on the interface from 5.15
    "switch_transformers": ("5.15.1", INTERFACE),
    "gte": ("5.18.0", INTERFACE),                    # new in 5.18
    "gptj": ("5.24.0", INTERFACE),
    "codegen": ("5.24.0", INTERFACE),
    "doge": ("5.18.0", _DOGE),
    **{model_type: (TESTED_RELEASES[-1], SOFTMAX_ROUTE) for model_type in (
        "xglm", "openai-gpt", "mpt", "bloom", "falcon", "gpt_neo", "big_bird", "roformer",
        "megatron-bert", "deberta", "deberta-v2", "mpnet", "tapas", "luke", "bigbird_pegasus",
        "gpt_neox_japanese", "imagegpt", "mvp", "data2vec-vision")},
    **{model_type: (TESTED_RELEASES[-1], NEW_LAYOUT) for model_type in (
        "aimv2_vision_model", "nllb-moe", "t5gemma", "internvl_vision", "xmod", "albert",
        "vjepa2", "siglip_vision_model", "siglip2_vision_model", "gemma4_vision")},
    # the default minimax_m3_vl_text has dense layers only, which the refused row of indexers
    # matched too
    **{model_type: (TESTED_RELEASES[-1], TOP_K_INDEXER) for model_type in (
        "deepseek_v32", "glm_moe_dsa", "axk2", "mistral_large4", "mistral_large4_text")},
    "minimax_m3_vl_text": (TESTED_RELEASES[-1], NEW_LAYOUT),
}


def covered_from(model_type: str) -> str | None:
    """The first tested release where the host covers ``model_type`` (None: every admitted
    release that has the model type)."""
    return COVERED_FROM.get(model_type, (None, ""))[0]


def before_covered(model_type: str, version: str | None = None) -> str | None:
    """The release the host covers ``model_type`` from, when transformers ``version`` (default: the
    installed one) is older; else None."""
    from packaging.version import Version
    first = covered_from(model_type)
    version = version or transformers_version()
    return first if first is not None and Version(version) < Version(first) else None


def not_covered_yet(name: str, model_type: str, version: str | None = None) -> str | None:
    """Why a ``model_type`` model is refused in transformers ``version`` (installed by default)
    when the host covers it only from a later release; else None."""
    version = version or transformers_version()
    first = before_covered(model_type, version)
    if first is None:
        return None
    why, fix = COVERED_FROM[model_type][1], requirement().replace(TESTED_RELEASES[0], first, 1)
    if why == INTERFACE:
        said = f"{why} in transformers {version}; it does from {first}"
    else:
        said = (f"is not covered in transformers {version}: there it {why}; the host covers it "
                f"from {first}")
    return f'{name} (model type {model_type!r}) {said} (pip install "{fix}")'


def transformers_version() -> str:
    import transformers
    return transformers.__version__


def _minor(version: str) -> tuple[int, int]:
    from packaging.version import Version
    return Version(version).release[:2]


def supported_range() -> tuple[str, str]:
    """The admitted releases as pip bounds ``(oldest, below)``: from the oldest tested release
    up to, not including, the minor after the newest tested one (``"5.24.0", "5.25"``)."""
    major, minor = _minor(TESTED_RELEASES[-1])
    return TESTED_RELEASES[0], f"{major}.{minor + 1}"


def admits(version: str) -> bool:
    """Whether the gate admits transformers ``version``: at least the oldest tested release and
    of a tested minor (the receipt tests each minor's newest patch release), so the patch
    releases of a tested minor are admitted and a pre-release of the next minor is not."""
    from packaging.version import InvalidVersion, Version
    try:
        return (Version(version) >= Version(TESTED_RELEASES[0])
                and _minor(version) in {_minor(release) for release in TESTED_RELEASES})
    except InvalidVersion:
        return False


def _gaps() -> list[str]:
    """Minors between the oldest and the newest tested release that the gate refuses."""
    tested = {_minor(release) for release in TESTED_RELEASES}
    (major, low), (_, high) = _minor(TESTED_RELEASES[0]), _minor(TESTED_RELEASES[-1])
    return [f"{major}.{m}" for m in range(low, high + 1) if (major, m) not in tested]


def requirement() -> str:
    """The admitted releases as one pip requirement, e.g. ``transformers>=5.0.0,!=5.4.*,<5.25``
    (the hf extra of pyproject.toml and the fix each refusal names)."""
    oldest, below = supported_range()
    return ",".join([f"transformers>={oldest}", *(f"!={gap}.*" for gap in _gaps()), f"<{below}"])


def supported_text() -> str:
    """The admitted releases as the docs and refusals say them, e.g. ``5.0.0 to 5.24.x (not
    5.4)``."""
    major, minor = _minor(TESTED_RELEASES[-1])
    gaps = _gaps()
    return (f"{TESTED_RELEASES[0]} to {major}.{minor}.x"
            + (f" (not {', '.join(gaps)})" if gaps else ""))


def _why_not(version: str) -> str:
    """Why ``version`` is refused, beyond not being among the tested releases."""
    from packaging.version import InvalidVersion, Version
    try:
        minor = _minor(version)
        if Version(version) < Version(FIRST_MASK_INTERFACE):
            return f"; {_BEFORE_MASK_INTERFACE}"
    except InvalidVersion:
        return ""
    if minor[0] == 4:
        return f"; {_4X}"
    name = ".".join(map(str, minor))
    if name in BLOCKED:
        return f"; {BLOCKED[name]}"
    if name in _gaps():
        return f"; oretrofit's tests have not passed on transformers {name} yet"
    return ""


# scripts/transformers_compat.py measures releases the gate does not admit (yet): it names the
# installed release in this variable for the host's tests and probe, and for nothing else
SWEEP_RELEASE = "ORETROFIT_COMPAT_SWEEP_RELEASE"


def check_transformers() -> None:
    """Refuse a transformers release the host has not been shown to work with, naming the fix
    (the tested releases are results/transformers-compat.md's passing rows)."""
    version = transformers_version()
    if admits(version) or os.environ.get(SWEEP_RELEASE) == version:
        return
    raise RetrofitError(
        f"transformers {version} is not supported by the transformers host; it is tested on "
        f"{supported_text()}{_why_not(version)}: "
        f'pip install "{requirement()}"')


def carrier_of(args: tuple, kwargs: dict) -> Tensor:
    """The hidden-state input of a module call: its first positional argument or
    ``hidden_states=``."""
    if args and torch.is_tensor(args[0]):
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    raise RetrofitError("a carrier module was called without hidden states (first positional "
                        "argument or hidden_states=); its layout names the wrong module")


@dataclass
class CarrierPresence:
    """Presences ρτ of one attention module's carriers: ``query`` (B, Nq) for the current tokens,
    ``keys`` (B, Nk) for every key, cached ones included. For cross-attention (``cross``) the keys
    are the encoder output's presences, set by :meth:`capture_sources`. ``first_write``: the
    call's keys are the first its KV cache layer holds (:mod:`.cache`)."""

    config: SiteConfig
    layer_idx: int | None = None
    cross: bool = False
    query: Tensor | None = None
    keys: Tensor | None = None
    first_write: bool = False

    def capture(self, carrier: Tensor, cache: Any = None) -> None:
        """ρτ of the carrier; with a KV cache the keys' presences come from the cache layer the
        call writes its keys to (:mod:`.cache`), set when it writes them."""
        p = carrier_presence(carrier, self.config.tau)                           # (B, N)
        self.query = p
        if self.cross:
            return
        self.keys, self.first_write = p, False
        if cache is not None and expect_keys(cache, self.layer_idx or 0, p, self):
            self.keys = None
        elif cache is not None and cache.get_seq_length(self.layer_idx or 0) > 0:
            raise RetrofitError(UNSEEN)

    def capture_sources(self, sources: Tensor) -> None:
        self.keys = presence(sources, self.config.tau)                           # (B, Nk)

    def without_batch_axis(self, owner: str) -> str | None:
        """Why the captured presences cannot sit on the attention's (batch, tokens) axes (None
        when they can): a carrier without a batch axis, as packed sequences run; both routes
        refuse with it."""
        if self.query is None or self.query.dim() == 2:
            return None
        return (f"{owner} runs on a residual stream without a batch axis ({self.query.dim()}-D "
                "presences: packed sequences, as vision towers with cu_seqlens run), so its "
                "presences cannot be placed on the attention's (batch, tokens) axes; this host "
                "has no O form for it")

    def capture_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook on the carrier module: the hidden states and the KV cache."""
        self.capture(carrier_of(args, kwargs), cache_of(args, kwargs))

    def capture_sources_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook on a cross-attention module: its sources (the encoder output)."""
        sources = kwargs.get("key_value_states", kwargs.get("encoder_hidden_states"))
        if sources is None:
            raise RetrofitError(f"{type(module).__name__} is a cross-attention site but was "
                                "called without key_value_states / encoder_hidden_states")
        self.capture_sources(sources)

    def __getstate__(self) -> dict[str, Any]:
        """The settings only: captured presences belong to one call."""
        return {**self.__dict__, "query": None, "keys": None}


class OGatedBias:
    """Mixin for an attention output projection with a bias, ``nn.Linear`` or transformers'
    ``Conv1D`` (weight ``(in, out)``): ``W x + p·b``, p = the receivers' presences captured for
    the attention module (:func:`gated_linear`)."""

    def forward(self, x: Tensor) -> Tensor:
        p = site_config(self, ATTENTION).query                                   # (B, N)
        if p.shape != x.shape[:-1]:
            raise RetrofitError(
                f"{type(self).__name__} (an attention output projection) got {tuple(x.shape)} "
                f"for a carrier of {tuple(p.shape)} tokens: this model's attention does not keep "
                "the (batch, tokens, hidden) layout of its residual stream, so the host cannot "
                "gate it; exclude the model's attention sites or register a site for its class "
                "with oretrofit.hosts.torch_nn.register_module_site")
        return gated_projection(self, x, p)


def gated_projection(projection: nn.Module, x: Tensor, p: Tensor) -> Tensor:
    """``W x + p·b`` for an ``nn.Linear`` or transformers' ``Conv1D`` (weight ``(in, out)``)."""
    if isinstance(projection, nn.Linear):
        return gated_linear(projection, x, p)
    return x @ projection.weight + o_gate(p, projection.bias)                   # Conv1D


def gate_output_bias(projection: nn.Module, state: CarrierPresence) -> Undo:
    """Gate the bias of an attention output projection (no-op when it has none)."""
    if getattr(projection, "bias", None) is None:
        return noop
    return set_site(projection, OGatedBias, ATTENTION, state)


def _gate(p: Tensor, y: Tensor, branch: nn.Module) -> Tensor:
    """ρτ (B, N) · y (B, N, d); an MoE block that returns its tokens flattened (B·N, d), as
    Llama4's does, is gated row for row (the flattening is row-major over (B, N))."""
    if y.shape[:-1] != p.shape and y.shape[:-1].numel() == p.numel() and y.dim() == 2:
        return o_gate(p.reshape(-1), y)
    if y.shape[:-1] != p.shape:
        raise RetrofitError(f"{type(branch).__name__} returned {tuple(y.shape)} for a residual "
                            f"stream of {tuple(p.shape)} tokens; its layout names the wrong FFN "
                            "branch (register a layout: "
                            "oretrofit.hosts.transformers.layouts.register_layout)")
    return o_gate(p, y)


def gate_branch_output(p: Tensor, output: Any, branch: nn.Module) -> Any:
    """ρτ · branch output; a tuple output (MoE blocks: hidden, router logits) gates its first."""
    if isinstance(output, tuple):
        return (_gate(p, output[0], branch), *output[1:])
    return _gate(p, output, branch)


class _BranchGate:
    """The hooks of :func:`gate_branch`: :meth:`capture` ρτ of the carrier, :meth:`gate` the
    branch's output by it (methods of a plain object, so they pickle with the model)."""

    def __init__(self, config: SiteConfig) -> None:
        self.config, self.p = config, None

    def capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.p = carrier_presence(carrier_of(args, kwargs), self.config.tau)

    def gate(self, module: nn.Module, args: tuple, output: Any) -> Any:
        p, self.p = self.p, None
        return gate_branch_output(p, output, module)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "p": None}


def gate_branch(carrier_module: nn.Module, branch: nn.Module, config: SiteConfig) -> Undo:
    """OFFN gate (eq. 15) with hooks: ``branch`` outputs ρτ(h)·branch(·), h = the hidden-state
    input of ``carrier_module`` (the residual stream entering the branch)."""
    hooks = _BranchGate(config)
    return patch_all(
        lambda: carrier_module.register_forward_pre_hook(hooks.capture, with_kwargs=True).remove,
        lambda: branch.register_forward_hook(hooks.gate).remove)


def _inputs_embeds_index(owner: nn.Module) -> tuple[str, int]:
    """Name and positional index of ``owner.forward``'s ``inputs_embeds`` (or ``input_embeds``)."""
    names = list(inspect.signature(owner.forward).parameters)
    name = next(n for n in ("inputs_embeds", "input_embeds") if n in names)
    return name, names.index(name)


def accepts_inputs_embeds(module: nn.Module) -> bool:
    names = inspect.signature(module.forward).parameters
    return "inputs_embeds" in names or "input_embeds" in names


def gate_table(table: nn.Module, word: nn.Module, owner: nn.Module, config: SiteConfig) -> Undo:
    """OInject (eq. 17) with hooks: a position / token-type lookup added to the word embedding
    is gated by ρτ(word embedding) at the same position, h + ρτ(h)·e.

    ``owner`` is the module that receives ``inputs_embeds`` (then the word embedding is skipped
    and the given embeddings are the carrier); ``word`` is its word-embedding lookup.
    """
    hooks = _TableGate(config, *_inputs_embeds_index(owner))
    return patch_all(
        lambda: owner.register_forward_pre_hook(hooks.from_inputs_embeds, with_kwargs=True).remove,
        lambda: word.register_forward_hook(hooks.from_word_embedding).remove,
        lambda: table.register_forward_hook(hooks.gate).remove)


class _TableGate:
    """The hooks of :func:`gate_table` (a plain object's methods, so they pickle with the model):
    the carrier's presence from ``inputs_embeds`` or the word embedding, and the gate."""

    def __init__(self, config: SiteConfig, name: str, index: int) -> None:
        self.config, self.name, self.index, self.p = config, name, index, None

    def from_inputs_embeds(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        given = kwargs.get(self.name, args[self.index] if len(args) > self.index else None)
        self.p = None if given is None else presence(given, self.config.tau)

    def from_word_embedding(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.p = presence(output, self.config.tau)

    def gate(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return o_gate(self.p, output)                      # (B, N) x (B|1, N, d) -> (B, N, d)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "p": None}


def zero_padded_inputs(model: nn.Module, sequences: Sequence[Sequence[int]],
                       side: str = "right") -> dict[str, Tensor]:
    """Mask-free batch: token embeddings zero-padded to one length at the carrier boundary.

    Returns ``inputs_embeds`` ``(B, N, d)`` (exact zeros at padding) and ``position_ids``
    ``(B, N)`` that give every real token the position it has alone (padding continues the count,
    so left padding gets negative positions: use ``side="right"`` for learned position tables).
    Under a ``full-o`` retrofit the zero rows are inert: pass no attention mask.
    """
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("sequences must be a non-empty list of non-empty token id lists")
    embed = model.get_input_embeddings()
    width = max(len(s) for s in sequences)
    inputs = embed.weight.new_zeros(len(sequences), width, embed.embedding_dim)
    positions = torch.empty(len(sequences), width, dtype=torch.long, device=inputs.device)
    for row, ids in enumerate(sequences):
        start = 0 if side == "right" else width - len(ids)
        ids_t = torch.as_tensor(list(ids), dtype=torch.long, device=inputs.device)
        inputs[row, start:start + len(ids)] = embed(ids_t)
        positions[row] = torch.arange(width, device=inputs.device) - start
    return {"inputs_embeds": inputs, "position_ids": positions}
