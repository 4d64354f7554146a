"""The paper's contracts measured on any transformers model the generic host covers: τ→0
agreement, exact revert, null insertion and mask-free padding. The architecture tests, the
``oretrofit check`` verb and the generated architecture table call these functions.

Hidden states are the residual streams the host sees: the input of each layer list's first
layer and the output of every layer (read with forward hooks, so every architecture is measured
the same way, encoder and decoder stacks included), and what the backbone returns after its
last layer (``last_hidden_state``, and ``encoder_last_hidden_state`` of an encoder–decoder), so
a final norm outside the layers is measured too. The ``pooler_output`` is measured where an
attention-pooling head (:mod:`.pooling`, a site) makes it; other poolers and heads are read-outs
the host leaves as they are (a mean over the tokens counts a null), and are not measured.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError
from ..._surgery.registry import apply_spec, retrofit, retrofitted
from .backbones import layers
from .inputs import GRIDS, PATCH_ROWS, accepts, example_inputs, zero_padded_inputs
from .layouts import calls_attention_interface, computes_attention
from .pooling import pooling_attention

__all__ = ["example_inputs", "hidden_states", "agreement", "insertion_point", "null_insertion",
           "padding_delta", "relative_max_diff", "require_finite_weights", "strict_load"]


def _layer_input(args: tuple, kwargs: dict[str, Any]) -> Tensor:
    """The stream a layer is called with: its first positional argument, else
    ``hidden_states=``, else its first tensor keyword (SAM's two-way layers take ``queries=``)."""
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next(v for v in kwargs.values() if isinstance(v, Tensor))


@contextlib.contextmanager
def _recording(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    states: dict[str, Tensor] = {}
    handles = []
    for path, layer in layers(model):
        if path.endswith(".0"):
            handles.append(layer.register_forward_pre_hook(
                lambda m, args, kwargs, key=path[:-2] + ".input": states.__setitem__(
                    key, _layer_input(args, kwargs)), with_kwargs=True))
        handles.append(layer.register_forward_hook(
            lambda m, args, output, key=path: states.__setitem__(
                key, output[0] if isinstance(output, (tuple, list)) else output)))
    pooled = any(pooling_attention(m) is not None for m in model.modules())
    handles.append(model.base_model.register_forward_hook(
        lambda m, args, output: states.update(_backbone_outputs(output, pooled))))
    try:
        yield states
    finally:
        for handle in handles:
            handle.remove()


def _backbone_outputs(output: Any, pooled: bool) -> dict[str, Tensor]:
    """The final states a backbone returns: ``{"output": (B, N, d)[, "encoder_output": …]
    [, "pooled": (B, d)]}``, the pooled vector where ``pooled`` (the model holds an attention-
    pooling head, a site of its own)."""
    found = {"output": getattr(output, "last_hidden_state", None),
             "encoder_output": getattr(output, "encoder_last_hidden_state", None),
             "pooled": getattr(output, "pooler_output", None) if pooled else None}
    return {key: state for key, state in found.items() if isinstance(state, Tensor)}


@torch.no_grad()
def hidden_states(model: nn.Module, call: Callable[[], Any]) -> dict[str, Tensor]:
    """Every layer's output (and each stack's input) while ``call()`` runs: ``{path: (B, N, d)}``."""
    with _recording(model) as states:
        call()
    return dict(states)


def require_finite_weights(model: nn.Module, source: str) -> None:
    """Refuse a model (loaded from ``source``) whose parameters hold NaN or ±inf, naming each such
    weight (module.param) and how many of its values: every hidden state would carry them, so
    no contract could be measured (agreement and exact revert compare NaN with NaN) and no
    carrier calibrated (a NaN norm is no carrier). ``oretrofit check`` and ``calibrate --model``
    call it on the model they load."""
    found = [(name, int((~torch.isfinite(p)).sum()), p.numel())
             for name, p in model.named_parameters() if p.is_floating_point()]
    found = [entry for entry in found if entry[1]]
    if found:
        named = ", ".join(f"{name} ({bad} of {total} values)" for name, bad, total in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        raise RetrofitError(
            f"{source}: {len(found)} weight(s) hold NaN or infinite values: {named}{more}; no "
            "contract can be measured and no τ calibrated on them. Load the weights the model "
            "was trained to (a re-download or re-export), or repair those tensors first")


def relative_max_diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """max over states of max|a − b| / max|b|."""
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)).item() for k in b)


def agreement(model: nn.Module, inputs: dict[str, Tensor], arm: str, tau: float = 1e-12,
              eps: float = 1e-12, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Relative max difference of every hidden state patched (``arm`` at ``tau`` and ``eps``,
    or ``spec`` applied) vs unpatched; whether ``revert()`` restores bit-identical states and
    the same ``state_dict`` keys."""
    call = lambda: model(**inputs)                                             # noqa: E731
    keys = list(model.state_dict())
    reference = hidden_states(model, call)
    r = apply_spec(model, spec) if spec is not None else retrofit(model, arm, tau, eps=eps)
    try:
        patched = hidden_states(model, call)
        same_keys = list(model.state_dict()) == keys
        sites = len(r.plan.entries)
    finally:
        r.revert()
    reverted = hidden_states(model, call)
    return {"arm": arm, "tau": tau, "eps": eps, "sites": sites,
            "relative_max_diff": relative_max_diff(patched, reference),
            "revert_bit_identical": all(torch.equal(reverted[k], reference[k]) for k in reference),
            "state_dict_keys_unchanged": same_keys}


def _insert(x: Tensor, at: int, count: int, value: int = 0) -> Tensor:
    """``x`` (B, N, …) with ``count`` rows of ``value`` (zero) inserted along the sequence before
    ``at``."""
    rows = x.new_full((x.shape[0], count, *x.shape[2:]), value)
    return torch.cat([x[:, :at], rows, x[:, at:]], dim=1)


def insertion_point(model: nn.Module, length: int) -> str:
    """Where a null insertion can keep the old tokens' relation: ``middle`` when old tokens keep
    their positions (``position_ids`` accepted, or positions added before the boundary), no
    sliding window (defined on sequence indices, not position ids) is shorter than ``length``
    and no relative-position bucket is taken from sequence indices; ``end`` otherwise. A
    window may be set on the text model's own config (Gemma3's ``text_config``)."""
    config = model.config
    windows = [getattr(c, k, None) for c in (config, config.get_text_config())
               for k in ("sliding_window", "local_attention", "window_size")
               if getattr(c, "use_sliding_window", True)]
    if any(isinstance(w, int) and w < length for w in windows):
        return "end"
    if getattr(config, "relative_attention_num_buckets", None) is not None:
        return "end"                     # relative positions bucketed by sequence index (MPNet)
    if getattr(config, "image_size", None) is not None:
        return "middle"
    return "middle" if accepts(model.base_model, "position_ids") else "end"


def _caught(register: Callable[..., Any], call: Callable[[], Any]) -> Any:
    """What the hook ``register`` installs sees first while ``call()`` runs: a pre-hook the
    module's first positional input, a forward hook its output."""
    seen: list[Any] = []
    handle = register(lambda m, args, *output: seen.append(output[0] if output else args[0]))
    try:
        call()
    finally:
        handle.remove()
    return seen[0]


def _first_tensor(output: Any) -> Tensor:
    """A module output's tensor: itself, the head of a tuple or a ``ModelOutput``'s first field."""
    if isinstance(output, Tensor):
        return output
    return next(iter(output.values())) if hasattr(output, "keys") else output[0]


def _replacing(module: nn.Module, h: Tensor) -> Any:
    """A forward hook handle making ``module`` return ``h`` in place of its (first) tensor output
    (a bare tensor, the head of a tuple, or the first field of a ``ModelOutput``)."""
    def hook(m: nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, Tensor):
            return h
        if hasattr(output, "keys"):
            output[next(iter(output.keys()))] = h
            return output
        return (h, *output[1:])
    # first of the module's hooks, so that a site's hook reading the output reads h
    return module.register_forward_hook(hook, prepend=True)


_PATCH_EMBEDDINGS = ("embeddings", "patch_embedder")     # Gemma4's tower: patch_embedder


def _patch_embeddings(module: nn.Module) -> nn.Module | None:
    found = (getattr(module, name, None) for name in _PATCH_EMBEDDINGS)
    return next((e for e in found if isinstance(e, nn.Module)), None)


def _embeddings_owner(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The shallowest module that holds the patch embeddings (``embeddings``, Gemma4's
    ``patch_embedder``), and those: the model itself (DINOv3's ``base_model`` is its encoder),
    its backbone, or a tower inside it (transformers 5.0's ``CLIPVisionModel.vision_model``)."""
    owners = [(0 if not name else name.count(".") + 1, module, embeddings)
              for name, module in model.named_modules()
              for embeddings in [_patch_embeddings(module)] if embeddings is not None]
    if not owners:
        raise ValueError(f"null insertion is not defined for this input: no module of "
                         f"{type(model).__name__} holds patch embeddings")
    return min(owners, key=lambda owner: owner[0])[1:]


def _patch_row_inputs(first: dict[str, Any], n: int) -> list[str]:
    """The inputs given one row per patch beside patch rows (SigLIP2's ``pixel_values`` and
    ``pixel_attention_mask``, Gemma4's ``pixel_values`` and ``pixel_position_ids``): ``(1, n, …)``
    tensors of a tower fed patch rows with their sizes or positions (:data:`PATCH_ROWS`)."""
    if not any(name in first for name in PATCH_ROWS):
        return []
    return [k for k, v in first.items() if isinstance(v, Tensor) and 2 <= v.dim() <= 3
            and v.shape[:2] == (1, n)]


_ROTARY = re.compile(r"Rope|Rotary")


def _rotates_by_index(owner: nn.Module) -> bool:
    """Whether a rotary table outside the patch embeddings (DINOv3's, Sapiens2's) positions the
    patches: computed from the pixel grid, it rotates the last patch-count tokens by sequence
    index and leaves the prefix tokens (class, registers) before them unrotated, so old tokens
    keep their positions only where the nulls go in front of every patch. An attention module
    that rotates by index itself (V-JEPA 2's ``VJEPA2RopeAttention``: every token, from index 0)
    is no such table: its old tokens keep their positions only with the nulls at the end."""
    return any(_ROTARY.search(type(m).__name__) and not name.startswith("embeddings")
               and not calls_attention_interface(m) and not computes_attention(m)
               for name, m in owner.named_modules())


def _require_no_patch_grid(first: dict[str, Any]) -> None:
    """Raise for a vision tower fed pre-flattened patches and their grid (``grid_thw``): its
    positions (rotary angles, interpolated position tables, window order) are computed from the
    grid and assigned to patches by sequence index, so inserted patches would take the old
    patches' positions, and no grid describes an image with patches inserted in its middle."""
    grid = next((name for name in GRIDS if name in first), None)
    if grid is not None:
        raise ValueError(f"null insertion is not defined for this input: the tower takes "
                         f"pre-flattened patches with their {grid}, from which it assigns "
                         f"positions by sequence index; inserted patches would move the old "
                         f"patches' positions, and no grid holds them")


Run = Callable[[Tensor, Tensor, Callable[[Tensor], Tensor]], Any]


def _carrier_and_run(model: nn.Module, first: dict[str, Any]) -> tuple[Tensor, Run]:
    """The carrier ``(1, n, d)`` of ``first`` and ``run(h, positions, grow)``, which runs the
    model with the carrier replaced by ``h``; ``grow`` lengthens the per-token side inputs (ids
    under a replaced embedding, boxes) as ``h`` was lengthened."""
    backbone = model.base_model
    if "input_values" in first:
        waveform, projection = first["input_values"], backbone.feature_projection
        carrier = _caught(projection.register_forward_pre_hook,
                          lambda: backbone(input_values=waveform))  # (1, n, c)

        def run(h: Tensor, positions: Tensor, grow: Callable[[Tensor], Tensor]) -> Any:
            # the feature encoder's frames are replaced by the carrier h
            handle = projection.register_forward_pre_hook(lambda m, args: (h, *args[1:]))
            try:
                return backbone(input_values=waveform)
            finally:
                handle.remove()
        return carrier, run
    if "input_ids" not in first:                            # pixels, images or videos
        _require_no_patch_grid(first)
        owner, embeddings = _embeddings_owner(model)
        carrier = _first_tensor(_caught(embeddings.register_forward_hook,
                                        lambda: owner(**first)))           # (1, n, d)
        rows = _patch_row_inputs(first, carrier.shape[1])

        def run(h: Tensor, positions: Tensor, grow: Callable[..., Tensor]) -> Any:
            # the patch embeddings are replaced by the carrier h (positions already added); the
            # rows given per patch grow with it, a mask's by ones (a null is inert by its
            # presence, not by the mask)
            kwargs = {**first, **{k: grow(first[k], value=int("mask" in k)) for k in rows}}
            handle = _replacing(embeddings, h)
            try:
                return owner(**kwargs)
            finally:
                handle.remove()
        return carrier, run
    ids, embedding = first["input_ids"], model.get_input_embeddings()
    carrier = embedding(ids)                                                      # (1, n, d)
    by_embeds = accepts(backbone, "inputs_embeds")
    per_token = {k for k, v in first.items() if isinstance(v, Tensor) and v.dim() >= 2
                 and v.shape[:2] == ids.shape and k != "attention_mask"}
    side = {k: v for k, v in first.items() if k != "attention_mask"
            and (k != "input_ids" or not by_embeds)}
    takes_positions = accepts(backbone, "position_ids")

    def run(h: Tensor, positions: Tensor, grow: Callable[[Tensor], Tensor]) -> Any:
        # an all-ones mask stops transformers reading gapped position ids as packed sequences
        kwargs = {k: grow(v) if k in per_token else v for k, v in side.items()}
        kwargs["attention_mask"] = torch.ones(h.shape[:2], dtype=torch.long)
        if takes_positions:
            kwargs["position_ids"] = positions[None]
        if by_embeds:
            return backbone(**kwargs, inputs_embeds=h)
        # no inputs_embeds (CLIP's text model): the word embedding's output is replaced by h
        handle = _replacing(embedding, h)
        try:
            return backbone(**kwargs)
        finally:
            handle.remove()
    return carrier, run


def _whole_cells(model: nn.Module, count: int) -> int:
    """``count`` rounded up to whole cells of k × k patches (k: ``pooling_kernel_size``) for a
    tower that averages its patches in such cells by their positions and sizes its output by the
    patch count (Gemma4's pooler): another count cannot be pooled. Nulls at a real position
    join that position's cell and add 0 to it, the average dividing by k² whatever the cell
    holds; the cell left without tokens at the end of the longer output is dropped by the
    pooler itself."""
    k = getattr(model.config, "pooling_kernel_size", None)
    return count if not isinstance(k, int) else -(-count // k ** 2) * k ** 2


@torch.no_grad()
def null_insertion(model: nn.Module, inputs: dict[str, Any], count: int = 2
                   ) -> dict[str, Any]:
    """Insert ``count`` zero carriers (whole pooling cells: :func:`_whole_cells`) into the first
    sequence at the carrier boundary (the word embedding, the patch embeddings of a vision model,
    or the frames an audio model's feature encoder hands its ``feature_projection``; inputs
    given one row per patch grow with it, :func:`_patch_row_inputs`) with the old tokens'
    position ids kept: in the middle when the model takes ``position_ids`` (or adds positions before the
    boundary), at the start where a rotary table rotates the last patch-count tokens by
    sequence index (:func:`_rotates_by_index`), else at the end; per-token side inputs (boxes)
    get zero rows there. Runs on the model as it is (patched or not); raises ValueError where
    the model does not run with the longer sequence.

    Returns ``where``, ``old_max_delta`` (relative max |Δ| of the old tokens' states over every
    hidden state; streams without the insertion, e.g. a decoder reading the encoder, and pooled
    vectors compared whole) and ``inserted_max_abs`` (max |h| of the inserted tokens over every hidden state).
    """
    first = {k: v[:1] if isinstance(v, Tensor) else v for k, v in inputs.items()}
    count = _whole_cells(model, count)
    carrier, run = _carrier_and_run(model, first)
    n = carrier.shape[1]
    pixels = "input_ids" not in first and "input_values" not in first
    where = "start" if pixels and _rotates_by_index(_embeddings_owner(model)[0]) \
        else insertion_point(model, n + count)
    at = {"start": 0, "middle": n // 2}.get(where, n)
    old_pos = torch.arange(n)
    positions = torch.cat([old_pos[:at], torch.full((count,), max(at - 1, 0)), old_pos[at:]])
    old = torch.cat([torch.arange(at), torch.arange(at + count, n + count)])
    # a copy: a model may add into the carrier it is given in place (GIT's embeddings:
    # `embeddings += position_embeddings` on inputs_embeds), which would move the carrier the
    # inserted run is built from
    reference = hidden_states(model, lambda: run(carrier.clone(), old_pos,
                                                     lambda x, value=0: x))
    try:
        inserted = hidden_states(model, lambda: run(_insert(carrier, at, count), positions,
                                                    lambda x, value=0: _insert(x, at, count,
                                                                               value)))
    except RuntimeError as error:       # the reference ran: the longer sequence does not fit
        raise ValueError(f"null insertion is not defined for this input: "
                         f"{type(model).__name__} does not run with {count} tokens more than "
                         f"its input has ({type(error).__name__}: {error}); something after "
                         f"the carrier is sized by the token count (a position table added "
                         f"by sequence index, a square grid of the patches)") from error
    deltas, new = [], []
    for key, ref in reference.items():
        state = inserted[key]
        if state.dim() == 3 and state.shape[1] == n + count:      # (B, N, d), not pooled
            new.append(state[:, at:at + count].abs().max().item())
            state = state[:, old]
        deltas.append(((state - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item())
    return {"where": where, "count": count, "old_max_delta": max(deltas),
            "inserted_max_abs": max(new), "layers": len(new)}


def strict_load(model: nn.Module, arm: str, tau: float = 1e-6) -> bool:
    """Whether the retrofitted model's ``state_dict`` loads strictly into the reverted model and
    the original ``state_dict`` into the retrofitted one (same keys, nothing added)."""
    original = {k: v.clone() for k, v in model.state_dict().items()}
    with retrofitted(model, arm, tau):
        patched = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(original, strict=True)
    model.load_state_dict(patched, strict=True)
    return list(patched) == list(original)


@torch.no_grad()
def padding_delta(model: nn.Module, sequences: Sequence[Sequence[int]]) -> float | None:
    """Mask-free right zero padding: relative max |Δ| of every real token's final state between
    the padded batch (no attention mask) and each sequence alone; None for vision models."""
    if getattr(model.config, "image_size", None) is not None:
        return None
    encoder = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) else None
    target = encoder if encoder is not None else model.base_model

    def run(batch: Sequence[Sequence[int]]) -> Tensor:
        given = zero_padded_inputs(model, batch, "right")
        if not accepts(target, "position_ids"):
            given.pop("position_ids", None)
        output = target(**given)
        # a backbone's states; the logits where base_model is the head model itself (its
        # base_model_prefix names no attribute: Gemma3ForCausalLM on transformers 4.x)
        state = getattr(output, "last_hidden_state", None)
        return output.logits if state is None else state                       # (B, N, ·)

    batched = run(sequences)
    deltas = []
    for row, ids in enumerate(sequences):
        alone = run([ids])[0]
        deltas.append(((batched[row, :len(ids)] - alone).abs().max()
                       / alone.abs().max().clamp_min(1e-30)).item())
    return max(deltas)
