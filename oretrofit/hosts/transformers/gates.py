"""The host's gates by presence, outside the attention function (:mod:`.interface_route`).

* Residual branches, biased attention output projections and additive tables, in every layer:
  :func:`gate_branch` (OFFN, eq. 15: ρτ(h)·branch(·)), :func:`gate_output_bias` (``nn.Linear`` and
  GPT-2's ``Conv1D``: W x + p·b) and :func:`gate_table` (OInject, eq. 17: a position / token-type
  table added to the word embedding, h + ρτ(h)·e), by the presence of the stream they belong to
  (captured by hooks, :mod:`.capture`).
* Gates the host's usual hooks do not reach: between the carrier boundary and the first layer,
  where no ``inputs_embeds`` carrier reaches, a biased projection (:func:`gate_projection`,
  W x + ρτ(x)·b), a position table added to patch embeddings (:func:`gate_patch_table`,
  h + ρτ(h)·e with h the patch embedding) and a position term an embeddings module computes in a
  method of its own (:func:`gate_position_term`: SigLIP2's table resized per image, Gemma4's
  lookup by pixel positions); and an attention output projection fed its input sequence-first
  (:func:`gate_sequence_first_bias`, W x + pᵀ·b).

The host (:mod:`.host`, :mod:`.boundary`) decides where they apply.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from ..._operators.components import o_gate, o_gate_column
from ..._surgery.host import RetrofitError
from ..._surgery.patching import SiteConfig, Undo, noop, set_site, site_config
from ..._surgery.per_call import PerCall, PerCallState
from ..._operators.presence import presence
from ..._operators.presence_memo import carrier_presence
from ..torch_nn import ATTENTION, gated_linear, patch_all
from .capture import CarrierPresence, carrier_of

__all__ = ["INJECT", "gate_branch", "gate_branch_output", "gate_output_bias", "gate_table",
           "gated_projection", "accepts_inputs_embeds",
           "OGatedProjection", "OSequenceFirstBias", "OResizedPositions", "OPositionLookup",
           "POSITION_TERMS", "gate_projection", "gate_patch_table", "gate_position_term",
           "gate_sequence_first_bias"]

INJECT = "inject"


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


def _gate(column: Tensor, y: Tensor, branch: nn.Module) -> Tensor:
    """ρτ as the column (B, N, 1) · y (B, N, d); an MoE block that returns its tokens flattened
    (B·N, d), as Llama4's does, is gated row for row (the flattening is row-major over (B, N)).
    The usual layout is tested first: every FFN gate checks it at every call of every layer."""
    if y.shape[:-1] == column.shape[:-1]:
        return o_gate_column(column, y)
    if y.dim() == 2 and y.shape[0] == column.numel():
        return o_gate_column(column.reshape(-1, 1), y)
    raise RetrofitError(f"{type(branch).__name__} returned {tuple(y.shape)} for a residual "
                        f"stream of {tuple(column.shape[:-1])} tokens; its layout names the wrong "
                        "FFN branch (register a layout: "
                        "oretrofit.hosts.transformers.layouts.register_layout)")


def gate_branch_output(column: Tensor, output: Any, branch: nn.Module) -> Any:
    """ρτ (the column (B, N, 1) of :func:`~oretrofit._operators.presence_memo.carrier_presence`) · branch
    output; a tuple output (MoE blocks: hidden, router logits) gates its first."""
    if isinstance(output, tuple):
        return (_gate(column, output[0], branch), *output[1:])
    return _gate(column, output, branch)


class _BranchGate(PerCallState):
    """The hooks of :func:`gate_branch`: :meth:`capture` ρτ of the carrier, :meth:`gate` the
    branch's output by it (methods of a plain object, so they pickle with the model)."""

    p = PerCall()

    def __init__(self, config: SiteConfig) -> None:
        self.config, self.p = config, None

    def capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.p = carrier_presence(carrier_of(args, kwargs), self.config.tau, column=True)

    def gate(self, module: nn.Module, args: tuple, output: Any) -> Any:
        p, self.p = self.p, None
        return gate_branch_output(p, output, module)


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


class _TableGate(PerCallState):
    """The hooks of :func:`gate_table` (a plain object's methods, so they pickle with the model):
    the carrier's presence from ``inputs_embeds`` or the word embedding, and the gate."""

    p = PerCall()

    def __init__(self, config: SiteConfig, name: str, index: int) -> None:
        self.config, self.name, self.index, self.p = config, name, index, None

    def from_inputs_embeds(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        given = kwargs.get(self.name, args[self.index] if len(args) > self.index else None)
        self.p = None if given is None else presence(given, self.config.tau)

    def from_word_embedding(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.p = presence(output, self.config.tau)

    def gate(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return o_gate(self.p, output)                      # (B, N) x (B|1, N, d) -> (B, N, d)


class OGatedProjection:
    """Mixin for a biased projection between the embedding and the first layer (ELECTRA's
    ``embeddings_project``, an audio model's ``feature_projection``): ``W x + ρτ(x)·b``.

    A biased projection is a linear map of the carrier plus a constant table b; OInject (eq. 17)
    gates the table by the carrier's presence. Gating the whole output, ``ρτ(x)·(W x + b)``, also
    sends a zero input to 0 and agrees at τ→0, but scales the linear part of a weak carrier a
    second time (ρτ(x)·W x is O(‖x‖³/τ) near 0, no longer linear in x); ``W x + ρτ(x)·b`` keeps
    ``W x`` exact for every carrier and differs from the host's projection only by the bias a
    weak carrier emits. x: ``(…, N, d)``, ρτ over its last axis.
    """

    def forward(self, x: Tensor) -> Tensor:
        return gated_projection(self, x, presence(x, site_config(self, INJECT).tau))


def gate_projection(projection: nn.Module, config: SiteConfig) -> Undo:
    """Gate a biased projection between the embedding and the first layer by the presence of
    its input (:class:`OGatedProjection`)."""
    return set_site(projection, OGatedProjection, INJECT, config)


def gate_patch_table(table: nn.Module, patches: nn.Module, owner: nn.Module,
                     learned: list[nn.Parameter], config: SiteConfig) -> Undo:
    """OInject (eq. 17) with hooks for a position table added to patch embeddings (CLIP's and
    SigLIP's vision embeddings, whose forward takes no ``inputs_embeds``): h + ρτ(h)·e, h = the
    patch embedding ``patches`` emits at the same position (``(B, d, *grid)``, flattened), or, for
    the ``learned`` tokens placed before the patches (CLIP's class embedding), that vector.
    ``owner`` (the embeddings module) refuses a call that adds the table without calling it (an
    interpolated table read from its weight)."""
    hooks = _PatchTableGate(config, learned)
    return patch_all(
        lambda: patches.register_forward_hook(hooks.from_patches).remove,
        lambda: table.register_forward_hook(hooks.gate).remove,
        lambda: owner.register_forward_hook(hooks.check).remove)


class _PatchTableGate(PerCallState):
    """The hooks of :func:`gate_patch_table` (a plain object's methods, so they pickle)."""

    p = PerCall()
    gated = PerCall(False)

    def __init__(self, config: SiteConfig, learned: list[nn.Parameter]) -> None:
        self.config, self.learned, self.p, self.gated = config, learned, None, False

    def from_patches(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.p = presence(output.flatten(2).transpose(1, 2), self.config.tau)   # (B, N)
        self.gated = False

    def gate(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        p, extra = self.p, output.shape[-2] - self.p.shape[1]
        if extra:
            rows = [w.reshape(-1, w.shape[-1]) for w in self.learned]
            lead = torch.cat(rows) if rows else output.new_zeros(0, output.shape[-1])
            if lead.shape[0] != extra:
                raise RetrofitError(
                    f"{type(module).__name__} (a position table) has {output.shape[-2]} rows for "
                    f"{p.shape[1]} patches and {lead.shape[0]} learned tokens, so the host cannot "
                    "tell which carrier each row is added to; exclude this inject site")
            p = torch.cat([presence(lead, self.config.tau).expand(p.shape[0], -1), p], dim=1)
        self.gated = True
        return o_gate(p, output)                           # (B, N) x (B|1, N, d) -> (B, N, d)

    def check(self, module: nn.Module, args: tuple, output: Any) -> None:
        called, self.p = self.gated, None
        if not called:
            raise RetrofitError(
                f"{type(module).__name__} added its position table without calling it (positions "
                "interpolated from the table's weight), so the host cannot gate them by the patch "
                "presences; call the model at its configured image size, without "
                "interpolate_pos_encoding")


class _PositionTerm:
    """Mixin base of :func:`gate_position_term`: the embeddings module's own position method
    (``_position_method``) returns ``ρτ(h)·e``, h the patch embedding's output in the same call."""

    _position_method = ""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = super().forward(*args, **kwargs)
        site_config(self, INJECT).check(type(self).__name__, output)
        return output

    def _o_gated_term(self, *args: Any, **kwargs: Any) -> Tensor:
        term = getattr(super(), self._position_method)(*args, **kwargs)
        return site_config(self, INJECT).gate(type(self).__name__, term)


class OResizedPositions(_PositionTerm):
    """SigLIP2's ``resize_positional_embeddings``: the table resized to each image's
    ``spatial_shapes`` (padding rows take the first cell's), gated row by row."""

    _position_method = "resize_positional_embeddings"

    def resize_positional_embeddings(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._o_gated_term(*args, **kwargs)


class OPositionLookup(_PositionTerm):
    """Gemma4's ``_position_embeddings``: the (column, row) tables looked up by
    ``pixel_position_ids`` and summed (0 at padding positions), gated row by row."""

    _position_method = "_position_embeddings"

    def _position_embeddings(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._o_gated_term(*args, **kwargs)


# the method an embeddings module computes its position term in -> the mixin that gates it
POSITION_TERMS = {mixin._position_method: mixin for mixin in (OResizedPositions, OPositionLookup)}


def gate_position_term(owner: nn.Module, patches: nn.Module, config: SiteConfig) -> Undo:
    """OInject (eq. 17) for a position term an embeddings module computes in a method of its own
    from a table's weight (:data:`POSITION_TERMS`; no table module is called) and adds to its
    patch embedding ``patches`` (one ``nn.Linear`` over each row's flattened patch):
    h + ρτ(h)·e, h = the patch embedding of the row. The module's output must be exactly
    h + ρτ(h)·e; any other use of the term is refused at the call."""
    method = next(name for name in POSITION_TERMS if hasattr(owner, name))
    gate = _PositionTermGate(config)
    return patch_all(
        lambda: patches.register_forward_hook(gate.from_patches).remove,
        lambda: set_site(owner, POSITION_TERMS[method], INJECT, gate))


class _PositionTermGate(PerCallState):
    """The state of :func:`gate_position_term` (a plain object, so it pickles): the patch
    embedding's output of the current call and the gated term; the site config of the mixin."""

    h = PerCall()
    gated = PerCall()

    def __init__(self, config: SiteConfig) -> None:
        self.tau, self.eps = config.tau, config.eps
        self.h: Tensor | None = None
        self.gated: Tensor | None = None

    def from_patches(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.h, self.gated = output, None

    def gate(self, owner: str, term: Tensor) -> Tensor:
        if self.h is None or term.shape != self.h.shape:
            raise RetrofitError(
                f"{owner} computed a position term {tuple(term.shape)} for patch embeddings "
                f"{None if self.h is None else tuple(self.h.shape)}: not one row per patch, so "
                "the host cannot gate each row by its patch's presence")
        self.gated = o_gate(presence(self.h, self.tau), term)
        return self.gated

    def check(self, owner: str, output: Any) -> None:
        h, gated, self.h, self.gated = self.h, self.gated, None, None
        if gated is None or not (isinstance(output, Tensor) and torch.equal(output, h + gated)):
            raise RetrofitError(
                f"{owner} did not return its patch embeddings plus the gated "
                "position term (it skipped the term, or transformed the sum), so the host cannot "
                "tell that each row is h + ρτ(h)·e")


class OSequenceFirstBias:
    """Mixin for a biased attention output projection whose module hands it the attention output
    sequence-first, ``(tokens, batch, ·)`` (MLCD permutes it before projecting and back after;
    :func:`~.layouts.sequence_first_output` reads that from the forward): ``W x + pᵀ·b``, p the
    receivers' presences ``(B, N)`` captured for the attention module. The call confirms the
    order by shape; where the batch holds as many images as tokens, ``(N, B)`` and ``(B, N)``
    look alike and nothing at the call could confirm it, so that call is refused."""

    def forward(self, x: Tensor) -> Tensor:
        p = site_config(self, ATTENTION).query                                   # (B, N)
        owner = f"{type(self).__name__} (an attention output projection fed sequence-first)"
        if p.shape[0] == p.shape[1]:
            raise RetrofitError(
                f"{owner}: the batch holds as many items as tokens ({p.shape[0]}), so a (tokens, "
                "batch) input cannot be told from a (batch, tokens) one and the presences could "
                "sit on the wrong axis; call the model with a batch size other than its token "
                "count")
        if x.shape[:-1] != p.T.shape:
            raise RetrofitError(
                f"{owner} got {tuple(x.shape)} for a carrier of {tuple(p.shape)} (batch, tokens): "
                "not the (tokens, batch, hidden) its module's forward hands it, so the host "
                "cannot place the presences on it")
        return gated_projection(self, x, p.T)


def gate_sequence_first_bias(projection: nn.Module, state: CarrierPresence) -> Undo:
    """Gate the bias of an attention output projection fed sequence-first
    (:class:`OSequenceFirstBias`; no-op when it has none)."""
    if getattr(projection, "bias", None) is None:
        return noop
    return set_site(projection, OSequenceFirstBias, ATTENTION, state)
