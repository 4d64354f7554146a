"""Top-k sparse attention (DeepSeek sparse attention, the "lightning indexer") in the O form.

An indexer scores every key j for every query i and hands the attention only the k keys it
scores highest. In DeepSeek-V3.2 and the models copied from it (GLM-MoE-DSA, AXK2,
Mistral-Large-4; HY-V4 is refused by layout for its hyper-connections) the score is
``s_ij = Σ_h w_ih · ReLU(c · q_ih · k_j)`` (index heads h, head weights w_ih from the query's
stream, index keys from the same layer input as the attention's keys, cached next to them), −∞
where the causal / padding mask hides j; then
``index_scores.topk(k, dim=-1).indices`` goes to the attention function as ``indices`` (eager
and SDPA fold it into the mask instead). A null token's index key is not zero (the indexer's
``k_norm`` adds its bias), so its score can outrank a live key's and take its place.

The O form ranks by ``s_ij + log p_j``, p_j the presence OAttention weights key j with (the
key token's carrier entering the layer; KV-cached keys keep theirs):

* a null key (p_j = 0, so −∞) never displaces a live key; where fewer than k keys are live and
  visible, the nulls that fill the k carry no mass in OAttention (p_j = 0);
* a live key's score depends only on its own token and the query's (positions kept), so
  inserting nulls leaves the live keys' scores, in their order, unchanged. The host's own
  ``torch.topk`` runs over each row's live keys alone (:func:`o_top_k`), so the selection is
  exactly the host's on the sequence without the nulls, ties included (``torch.topk`` breaks
  ties in an order of its own, which depends on the whole row: ranking nulls at −∞ in the same
  row could let them move a tie among live keys);
* τ → 0: log p_j → 0 for live keys (exactly 0 in fp32 once τ < 2⁻²⁴‖h‖²) and no key is null,
  so the scores and the call are the host's.

Mechanism: while a patched attention module's ``indexer`` runs, a ``TorchFunctionMode``
replaces its one top-k by :func:`o_top_k`, and the indexer must return exactly those indices;
the attention function honours ``indices`` as ``m_ij ∧ [j ∈ top-k_i]`` (:func:`selected_keys`),
as the model's eager path folds them (a layer reusing the previous layer's indices, "shared",
gets them the same way). Refused, naming the module: more than one top-k per call, one that is
not the largest k over the last axis of ``(batch, queries, keys)`` scores (compressed or
block-pooled keys), or indices the indexer changes before returning them (a −1 sentinel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..._surgery.host import RetrofitError
from ..._surgery.patching import Undo, noop, set_site, site_config
from ..torch_nn import ATTENTION
from .capture import CarrierPresence

__all__ = ["o_index_scores", "o_top_k", "selected_keys", "attach_indexer", "OIndexer"]

_TOPK = {torch.topk, torch.Tensor.topk}


def o_index_scores(scores: Tensor, p_keys: Tensor) -> Tensor:
    """``s_ij + log p_j`` for index scores ``(B, Nq, Nk)`` and key presences ``p_keys`` (B, Nk):
    −∞ at a null key."""
    return scores + torch.log(p_keys.to(scores.dtype))[:, None, :]


def o_top_k(scores: Tensor, p_keys: Tensor, k: int, sorted: bool = True) -> Any:  # noqa: A002
    """``torch.topk`` of :func:`o_index_scores` over the last axis, taken over each row's live
    keys (p_j > 0) alone and mapped back, the rest of the ``k`` filled with null keys (value
    −∞): without nulls, the host's call on the same scores; with nulls, the host's call on the
    scores it would have without them."""
    scores = o_index_scores(scores, p_keys)
    live = p_keys > 0
    if bool(live.all()):
        return torch.topk(scores, k, dim=-1, sorted=sorted)
    values = scores.new_full((*scores.shape[:2], k), float("-inf"))
    indices = torch.empty(values.shape, dtype=torch.long, device=scores.device)
    for b in range(scores.shape[0]):
        keys, nulls = live[b].nonzero()[:, 0], (~live[b]).nonzero()[:, 0]
        k_live = min(k, keys.numel())
        top = torch.topk(scores[b:b + 1, :, keys], k_live, dim=-1, sorted=sorted)
        values[b, :, :k_live] = top.values[0]
        indices[b, :, :k_live] = keys[top.indices[0]]
        indices[b, :, k_live:] = nulls[:k - k_live]
    return torch.return_types.topk((values, indices))


def selected_keys(attention_mask: Tensor | None, indices: Tensor, n_q: int, n_k: int,
                  owner: str) -> Tensor:
    """The relation ``m_ij ∧ [j ∈ indices_i]`` for top-k ``indices`` (B, Nq, k) over ``n_k``
    keys, as the DSA modules' eager path folds them into their mask: boolean where the mask is,
    else the mask with the dtype's minimum at unselected keys."""
    if attention_mask is None:
        raise RetrofitError(f"{owner} passes top-k indices without an attention mask, so the "
                            "keys its queries may see are not defined; build the model's masks "
                            "with its own masking utilities")
    if (indices.dim() != 3 or indices.shape[1] != n_q
            or (indices.numel() and (indices.min() < 0 or indices.max() >= n_k))):
        raise RetrofitError(f"{owner} passes indices {tuple(indices.shape)} that are not top-k "
                            f"key positions (batch, {n_q} queries, k) in [0, {n_k}): the "
                            "attention function has no rule for them; this host has no O form "
                            "for it")
    chosen = torch.zeros(*indices.shape[:2], n_k, dtype=torch.bool, device=indices.device)
    chosen = chosen.scatter(-1, indices.long(), True)[:, None]                  # (B, 1, Nq, Nk)
    if attention_mask.dtype == torch.bool:
        return attention_mask & chosen
    return attention_mask.masked_fill(~chosen, torch.finfo(attention_mask.dtype).min)


@dataclass
class _IndexerSite:
    """The config of an :class:`OIndexer` site: the path of its attention module and the
    presences captured for it."""

    where: str
    presence: CarrierPresence


class _TopkSwap(TorchFunctionMode):
    """Active during one call of an indexer: its one top-k ranks by :func:`o_index_scores`."""

    def __init__(self, site: _IndexerSite) -> None:
        super().__init__()
        self.site, self.selected = site, None

    def refuse(self, why: str) -> RetrofitError:
        return RetrofitError(
            f"{self.site.where} (its indexer) {why}, so the top-k selection cannot rank by "
            "s_ij + log p_j (it needs one top-k of per-token key scores (batch, queries, keys) "
            "whose indices reach the attention unchanged); this host has no O form for it")

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _TOPK:
            return self._topk(*args, **kwargs)
        return func(*args, **kwargs)

    def _topk(self, scores: Tensor, k: int, dim: int = -1, largest: bool = True,
              sorted: bool = True, **unexpected: Any) -> Any:             # noqa: A002
        if self.selected is not None:
            raise self.refuse("takes more than one top-k per call")
        if not largest or unexpected or dim % scores.dim() != scores.dim() - 1:
            raise self.refuse(f"takes a top-k other than the largest k over the last axis "
                              f"(dim={dim}, largest={largest})")
        state = self.site.presence
        unbatched = state.without_batch_axis(self.site.where)
        if unbatched:
            raise RetrofitError(unbatched)
        if state.query is None or state.keys is None:
            raise self.refuse("was called without its carrier presences (call the model, not "
                              "the attention module alone)")
        expected = (state.keys.shape[0], state.query.shape[1], state.keys.shape[1])
        if tuple(scores.shape) != expected:
            raise self.refuse(f"ranks scores {tuple(scores.shape)}, not one per (batch, query, "
                              f"key) token {expected} (compressed or block-pooled keys, which "
                              "have no presence of their own)")
        self.selected = o_top_k(scores, state.keys, k, sorted)
        return self.selected


class OIndexer:
    """Mixin for an attention module's indexer: its forward runs with its one top-k ranking by
    ``s_ij + log p_j`` (module docstring), and must return those indices."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        site: _IndexerSite = site_config(self, ATTENTION)
        swap = _TopkSwap(site)
        with swap:
            out = self._oretrofit["original_class"].forward(self, *args, **kwargs)
        if swap.selected is None:
            raise swap.refuse("took no top-k")
        chosen = swap.selected.indices
        if not (isinstance(out, Tensor) and out.shape == chosen.shape
                and torch.equal(out.long(), chosen)):
            raise swap.refuse("returned other indices than its top-k's (a sentinel or a "
                              "rearrangement the attention would read)")
        return out


def attach_indexer(where: str, attention: nn.Module, presence: CarrierPresence) -> Undo:
    """:class:`OIndexer` on ``attention.indexer`` with the attention's ``presence``; nothing
    where the module has none (a layer that reuses the previous layer's top-k indices)."""
    indexer = getattr(attention, "indexer", None)
    if not isinstance(indexer, nn.Module):
        return noop
    return set_site(indexer, OIndexer, ATTENTION, _IndexerSite(where, presence))
