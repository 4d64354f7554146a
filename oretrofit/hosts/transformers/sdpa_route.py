"""The third attention route, for transformers 4.x: OAttention at the fused-kernel call of an
attention module that calls ``torch.nn.functional.scaled_dot_product_attention`` itself
(``BertSdpaSelfAttention``, ``StableLmSdpaAttention``, ``DistilBertSdpaAttention``, … : the
4.x modeling files kept one class per implementation, before the attention interface took them
over).

Such a module hands the kernel exactly what the interface route's attention function receives:
projected q ``(B, H, Nq, d)``, k / v ``(B, Hkv, Nk, d)``, the mask the model built for SDPA
(boolean, True = visible, or additive) or ``is_causal``, the scale and the dropout. While the
module runs, a :class:`~torch.overrides.TorchFunctionMode` answers that one call with

    out_i = p_i Σ_j m_ij p_j e^{s_ij} v_j / (ε + Σ_j m_ij p_j e^{s_ij})

(eq. 7, :func:`oretrofit._operators.attention.o_attention`), m_ij the SDPA relation (``is_causal`` without
a mask: the top-left lower triangle, as SDPA reads it). Running the eager base class instead
(the softmax route) would be wrong here: 4.x models build their masks per implementation
(``_update_causal_mask``, ``_prepare_4d_attention_mask_for_sdpa``) and leave out the mask SDPA
does not need (no padding; causality by ``is_causal``), which the eager code then never applies.

Presences are captured as on the softmax route (:class:`~.softmax_route.SoftmaxCarrier`).
Refused, naming the module, when a call shows no kernel call or more than one (the module fell
back to its eager code: ``output_attentions=True`` or a head mask), or presences that do not fit
the call's queries and keys.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from ..._operators.attention import o_attention
from ..._surgery.host import RetrofitError
from ..._surgery.patching import SiteConfig, Undo, site_config
from ..torch_nn import ATTENTION
from .layouts import eager_class
from .softmax_route import SoftmaxCarrier, attach_carrier

__all__ = ["calls_sdpa", "attach_sdpa_attention", "OSdpaAttention"]


def calls_sdpa(attention: nn.Module) -> bool:
    """Whether ``attention``'s own ``forward`` calls the fused kernel where a base class computes
    the same attention by a softmax (:func:`~.layouts.eager_class`: a 4.x ``…SdpaAttention``)."""
    return eager_class(type(attention)) not in (None, type(attention))


def _relation(attn_mask: Tensor | None, is_causal: bool, n_q: int, n_k: int,
              device: torch.device) -> tuple[Tensor | None, bool]:
    """m_ij as SDPA reads its arguments, as (mask, causal flag of :func:`o_attention`): the mask,
    else with ``is_causal`` the top-left lower triangle (SDPA's alignment; as the flag where
    Nq = Nk, whose alignment is then the same), else every key visible (None)."""
    if attn_mask is not None or not is_causal:
        return attn_mask, False
    if n_q == n_k:
        return None, True
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(), False


class _KernelSwap(TorchFunctionMode):
    """Active during one call of an attention module: answers its fused-kernel call with
    OAttention on the captured presences (module docstring)."""

    def __init__(self, where: str, state: SoftmaxCarrier) -> None:
        super().__init__()
        self.where, self.state, self.calls = where, state, 0

    def refuse(self, why: str) -> RetrofitError:
        return RetrofitError(f"{self.where} {why}, so the fused-kernel route cannot make its "
                             "attention OAttention; exclude this module with exclude=[...]")

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        return func(*args, **kwargs)

    def _attention(self, query: Tensor, key: Tensor, value: Tensor,
                   attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                   is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> Tensor:
        self.calls += 1
        if self.calls > 1:
            raise self.refuse("calls scaled_dot_product_attention more than once per call")
        if query.dim() != 4:
            raise self.refuse(f"calls scaled_dot_product_attention on {query.dim()}-D queries, "
                              "not (batch, heads, tokens, head dim)")
        unbatched = self.state.without_batch_axis(self.where)
        if unbatched:
            raise RetrofitError(unbatched)
        p_q, p_k = self.state.query, self.state.keys
        n_q, n_k = query.shape[2], key.shape[2]
        if p_q is None or p_k is None or (p_q.shape[1], p_k.shape[1]) != (n_q, n_k):
            raise self.refuse(
                f"attends {n_q} queries to {n_k} keys where the retrofit holds presences for "
                f"{None if p_q is None else p_q.shape[1]} receivers and "
                f"{None if p_k is None else p_k.shape[1]} sources (the module called alone, or a "
                "KV cache whose presences this retrofit never saw: run the prompt through the "
                "retrofitted model with a fresh cache)")
        mask, causal = _relation(attn_mask, is_causal, n_q, n_k, query.device)
        out, _ = o_attention(query, key, value, p_q, p_k, mask=mask, eps=self.state.config.eps,
                             scale=scale, dropout_p=dropout_p, causal=causal)
        return out                                                             # (B, H, Nq, d)


class OSdpaAttention:
    """Mixin for an attention module that calls the fused kernel itself: its own forward runs
    with that call answered by OAttention (:class:`_KernelSwap`)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state: SoftmaxCarrier = site_config(self, ATTENTION)
        original = self._oretrofit["original_class"]
        swap = _KernelSwap(f"{state.site} ({original.__name__})", state)
        with swap:
            out = original.forward(self, *args, **kwargs)
        if swap.calls != 1:
            raise swap.refuse("ran its eager code instead of scaled_dot_product_attention "
                              "(output_attentions=True or a head mask)")
        return out


def attach_sdpa_attention(site: str, attention: nn.Module, carrier_module: nn.Module,
                          config: SiteConfig, cross: bool = False, layer_index: int = 0
                          ) -> tuple[Undo, SoftmaxCarrier]:
    """OAttention on ``attention`` (path ``site``), a module that calls the fused kernel itself.

    Presences as on the softmax route: ρτ of the residual stream entering ``carrier_module``
    (KV-cached keys keep theirs, read at the module's ``layer_idx``, else ``layer_index``);
    cross-attention (``cross``) takes its sources' from the module's encoder input. Returns the
    undo and the captured state."""
    return attach_carrier(site, attention, OSdpaAttention, carrier_module, config, cross,
                          layer_index)
