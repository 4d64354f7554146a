"""Plain-PyTorch host: ``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer`` (``norm_first`` True and False), ``nn.LayerNorm`` / ``nn.RMSNorm``,
token-local ``nn.Sequential`` MLPs. It is the fallback (specificity 0): it patches whole plain
models, and the parts of a model that more specific hosts do not own.

Sites are named by module path:

    <layer>.self_attn        attention  OAttention (eq. 7); presences of the residual stream
                                        entering the layer, not of its normalised copy
    <layer>.multihead_attn   attention  decoder cross-attention; source presences from ``memory``
    <layer>.ffn              ffn        OFFN gate ρτ(h)·FFN(·), h = residual stream entering
                                        the branch
    <layer>.norm1/2/3        norm       ONorm ρτ(h)·Norm(h) (eq. 16)
    <mha>                    attention  a MultiheadAttention outside those layers: presences of its
                                        query / key inputs
    <norm>                   norm       a LayerNorm / RMSNorm outside those layers
    <mlp>                    ffn        an ``nn.Sequential`` of token-local layers (Linear,
                                        activations, Dropout): OFFN ρτ(x)·MLP(x), x = its input
                                        (the residual stream, or its ONorm'd copy, which is
                                        exactly 0 for a null token), as in torchvision's ViT block

Modules keep their class's parameters: patching swaps the class for an O-subclass
(:func:`oretrofit._surgery.patching.set_site`), so ``state_dict`` keys are unchanged. A patched layer
always runs its composite path, never ``torch._transformer_encoder_layer_fwd``, and a
``TransformerEncoder`` holding patched layers never converts padded input to a nested tensor.

Every site states its scope (the modules it gates). A parameter or buffer outside every scope
(a custom residual block, a Linear head, a position table) is *uncovered*: ``retrofit`` refuses
the model unless ``allow_partial=True`` (:mod:`oretrofit._surgery.compose`). Your own module type
becomes a site with :func:`register_module_site`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._operators.attention import o_attention
from .._operators.components import o_gate, o_gate_column
from .._surgery.host import KINDS, RetrofitError, Site, inside, join_path, register_host
from .._surgery.patching import SiteConfig, Undo, UndoAll, set_site, site_config
from .._operators.presence import presence
from .._operators.presence_memo import carrier_presence

__all__ = ["register_module_site", "unregister_module_site", "set_site", "site_config",
           "gated_linear", "patch_all", "patch", "norm_site", "receiver_report",
           "uncovered_attention", "ONormSite", "OMLPSite", "OMultiheadAttention", "TorchNNHost"]

ATTENTION, NORM, FFN = "attention", "norm", "ffn"
SiteBuilder = Callable[[str, nn.Module], list[Site]]
Predicate = Callable[[nn.Module], bool]


def patch_all(*steps: Callable[[], Undo]) -> Undo:
    """Run patch steps in order and return one undo (reverse order); a failing step undoes the
    steps before it."""
    undos: list[Undo] = []
    try:
        for step in steps:
            undos.append(step())
    except BaseException:
        for undo in reversed(undos):
            undo()
        raise

    return UndoAll(undos)


def patch(module: nn.Module, mixin: type, key: str) -> Callable[[SiteConfig], Undo]:
    """The apply of a site that swaps ``module`` to its ``mixin`` under ``key``."""
    return lambda config: set_site(module, mixin, key, config)


def norm_site(name: str, carrier: str, *modules: nn.Module) -> Site:
    """One ONorm site over several token-local norm modules (all-or-nothing)."""
    return Site(name, NORM, carrier,
                lambda config: patch_all(*(functools.partial(set_site, m, ONormSite, NORM, config)
                                           for m in modules)),
                modules=modules)


def receiver_report(name: str, vectors: nn.Parameter) -> Callable[[float], dict[str, float]]:
    """Min and mean presence at τ of a set of learned receiver vectors ``(n, E)`` (inducing
    vectors, CLS tokens): a receiver near presence 0 would be silenced by the retrofit."""

    def report(tau: float) -> dict[str, float]:
        p = presence(vectors.detach().float(), tau)
        return {f"{name}.min": float(p.min()), f"{name}.mean": float(p.mean())}

    return report


def gated_linear(linear: nn.Linear, x: Tensor, p: Tensor) -> Tensor:
    """``W x + p·b``: a projection whose bias only present tokens emit.

    On an OAttention aggregate ``x_i = p_i a_i`` it gives ``p_i (W a_i + b)``, the gated branch of
    eq. 11, so a null token emits an exact 0 through a biased output projection. p: ``(B, N)``.
    """
    if linear.bias is None:
        return linear(x)
    return F.linear(x, linear.weight) + o_gate(p, linear.bias)


class ONormSite:
    """Mixin for a token-local norm (LayerNorm, RMSNorm, …): ONorm, ``ρτ(h) · Norm(h)`` (eq. 16)."""

    def forward(self, h: Tensor) -> Tensor:
        config = site_config(self, NORM)
        return o_gate_column(carrier_presence(h, config.tau, column=True), super().forward(h))


class OMLPSite:
    """Mixin for a token-local ``nn.Sequential`` MLP: OFFN ``ρτ(x) · MLP(x)`` (eq. 15), x its
    input ``(…, N, d)``."""

    def forward(self, x: Tensor) -> Tensor:
        config = site_config(self, FFN)
        return o_gate_column(carrier_presence(x, config.tau, column=True), super().forward(x))


def _batch_major(t: Tensor, batch_first: bool, unbatched: bool) -> Tensor:
    if unbatched:
        return t.unsqueeze(0)
    return t if batch_first else t.transpose(0, 1)


def _visibility(key_padding_mask: Tensor | None, attn_mask: Tensor | None, is_causal: bool,
                batch: int, heads: int, n_q: int, n_k: int, like: Tensor
                ) -> tuple[Tensor | None, bool]:
    """torch's masks (bool True / float -inf = excluded) as O's relation: bool True = visible,
    or an additive float mask (dtype of ``like``) when either is float. Shapes stay compact:
    ``(B, 1, 1, Nk)`` for key padding, ``(Nq, Nk)`` or ``(B, H, Nq, Nk)`` for ``attn_mask``.
    With the causal flag of :func:`o_attention` (``is_causal`` without ``attn_mask`` over as many
    keys as queries, where its alignment is torch's), else causality in the mask."""
    parts, causal = [], attn_mask is None and is_causal and n_q == n_k
    if key_padding_mask is not None:
        parts.append(key_padding_mask[:, None, None, :])
    if attn_mask is None and is_causal and not causal:
        attn_mask = torch.ones(n_q, n_k, dtype=torch.bool, device=like.device).triu(1)
    if attn_mask is not None:
        parts.append(attn_mask.view(batch, heads, n_q, n_k) if attn_mask.dim() == 3 else attn_mask)
    if not parts:
        return None, causal
    if all(m.dtype == torch.bool for m in parts):
        return ~functools.reduce(torch.logical_or, parts), causal
    additive = [m.new_zeros(m.shape, dtype=like.dtype).masked_fill(m, float("-inf"))
                if m.dtype == torch.bool else m.to(like.dtype) for m in parts]
    return functools.reduce(torch.add, additive), causal


class OMultiheadAttention:
    """Mixin for ``nn.MultiheadAttention``: hidden-carrier OAttention (eq. 7) with its own weights.

    ``out_i = W_O p_i Σ_j m_ij p_j e^{s_ij} v_j / (ε + Σ_j m_ij p_j e^{s_ij}) + p_i b_O``. Presences
    come from ``query_carrier`` / ``key_carrier`` (the residual streams, passed by a patched layer)
    or, by default, from ``query`` / ``key``. Both ``batch_first`` layouts, unbatched input,
    ``key_padding_mask``, ``attn_mask`` (bool or float, 2-D or 3-D) and ``is_causal`` are honoured;
    in training, so is the module's ``dropout`` on the weights: ``out_i = W_O p_i Σ_j δ_ij w_ij v_j
    + p_i b_O`` (δ_ij ∈ {0, 1/(1 − dropout)}, :func:`oretrofit.o_attention`'s ``dropout_p``).
    """

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False, *, query_carrier: Tensor | None = None,
                key_carrier: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        config = site_config(self, ATTENTION)
        packed = query is key and key is value
        unbatched = query.dim() == 2
        query_carrier = query if query_carrier is None else query_carrier
        key_carrier = key if key_carrier is None else key_carrier
        q_in, k_in, v_in, q_car, k_car = (_batch_major(t, self.batch_first, unbatched) for t in
                                          (query, key, value, query_carrier, key_carrier))
        if unbatched and key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
        batch, n_q, n_k = q_in.shape[0], q_in.shape[1], k_in.shape[1]
        p_q, p_k = self._o_presences(q_car, k_car, config.tau)                 # (B, Nq), (B, Nk)
        q, k, v = self._o_project(q_in, k_in, v_in, packed)                     # (B, H, N, hd)
        mask, causal = _visibility(key_padding_mask, attn_mask, is_causal, batch,
                                   self.num_heads, n_q, n_k, q)
        # the module's attention-weight dropout, in training only, as torch applies it
        out, weights = o_attention(q, k, v, p_q, p_k, mask=mask, eps=config.eps,
                                   need_weights=need_weights,
                                   dropout_p=self.dropout if self.training else 0.0,
                                   causal=causal)
        out = gated_linear(self.out_proj, out.transpose(1, 2).reshape(batch, n_q, self.embed_dim),
                           p_q)                                                 # (B, Nq, E)
        out = out.squeeze(0) if unbatched else (out if self.batch_first else out.transpose(0, 1))
        if weights is not None:
            weights = weights.mean(dim=1) if average_attn_weights else weights
            weights = weights.squeeze(0) if unbatched else weights
        return out, weights

    def _o_presences(self, query_carrier: Tensor, key_carrier: Tensor, tau: float
                     ) -> tuple[Tensor, Tensor]:
        """ρτ of the batch-major query and key carriers: ``(B, Nq)``, ``(B, Nk)``."""
        return presence(query_carrier, tau), presence(key_carrier, tau)

    def _o_project(self, query: Tensor, key: Tensor, value: Tensor, packed: bool
                   ) -> tuple[Tensor, Tensor, Tensor]:
        """(B, N, E) inputs -> q, k, v as (B, H, N, hd) with the module's own projections."""
        bias = self.in_proj_bias
        if packed and self._qkv_same_embed_dim:
            q, k, v = F.linear(query, self.in_proj_weight, bias).chunk(3, dim=-1)
        else:
            weights = (self.in_proj_weight.chunk(3) if self._qkv_same_embed_dim
                       else (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight))
            biases = bias.chunk(3) if bias is not None else (None, None, None)
            q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))
        return tuple(t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
                     for t in (q, k, v))


class _OLayer:
    """Shared composite path of the patched encoder / decoder layers."""

    def _o_attend(self, mha: nn.Module, dropout: nn.Module, x: Tensor, carrier: Tensor,
                  mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool,
                  memory: Tensor | None = None) -> Tensor:
        context = x if memory is None else memory
        kwargs = {}
        if site_config(mha, ATTENTION) is not None:
            kwargs = {"query_carrier": carrier, "key_carrier": context if memory is not None
                      else carrier}
        out = mha(x, context, context, attn_mask=mask, key_padding_mask=key_padding_mask,
                  need_weights=False, is_causal=is_causal, **kwargs)[0]
        return dropout(out)

    def _o_ffn(self, x: Tensor, carrier: Tensor) -> Tensor:
        """OFFN branch (eq. 15): ρτ(carrier) · FFN(x); x is the carrier or its normalised copy."""
        y = self._ff_block(x)
        config = site_config(self, FFN)
        return y if config is None else o_gate(presence(carrier, config.tau), y)


def _check_dense(x: Tensor) -> None:
    if x.is_nested:
        raise RetrofitError("a retrofitted transformer layer takes dense (padded) carriers, not a "
                            "NestedTensor: pad with zero vectors instead (they are inert under O)")


class OTransformerEncoderLayer(_OLayer):
    """Mixin for ``nn.TransformerEncoderLayer``: its composite path with O sites, never the fused
    kernel."""

    def forward(self, src: Tensor, src_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        _check_dense(src)
        x, mask, kpm = src, src_mask, src_key_padding_mask
        if self.norm_first:
            x = x + self._o_attend(self.self_attn, self.dropout1, self.norm1(x), x, mask, kpm,
                                   is_causal)
            return x + self._o_ffn(self.norm2(x), x)
        x = self.norm1(x + self._o_attend(self.self_attn, self.dropout1, x, x, mask, kpm,
                                          is_causal))
        return self.norm2(x + self._o_ffn(x, x))


class OTransformerDecoderLayer(_OLayer):
    """Mixin for ``nn.TransformerDecoderLayer``: self-attention, cross-attention on ``memory``
    and the FFN, each with its O site."""

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False) -> Tensor:
        _check_dense(tgt)
        x = tgt
        self_args = (tgt_mask, tgt_key_padding_mask, tgt_is_causal)
        cross_args = (memory_mask, memory_key_padding_mask, memory_is_causal, memory)
        if self.norm_first:
            x = x + self._o_attend(self.self_attn, self.dropout1, self.norm1(x), x, *self_args)
            x = x + self._o_attend(self.multihead_attn, self.dropout2, self.norm2(x), x,
                                   *cross_args)
            return x + self._o_ffn(self.norm3(x), x)
        x = self.norm1(x + self._o_attend(self.self_attn, self.dropout1, x, x, *self_args))
        x = self.norm2(x + self._o_attend(self.multihead_attn, self.dropout2, x, x, *cross_args))
        return self.norm3(x + self._o_ffn(x, x))


class DenseTransformerEncoder:
    """Mixin for ``nn.TransformerEncoder`` holding patched layers: never builds nested tensors."""

    @property
    def use_nested_tensor(self) -> bool:
        return False


# --- site builders -------------------------------------------------------------------------

_BUILDERS: list[tuple[type, Predicate, SiteBuilder]] = []


def register_module_site(module_type: type, kind: str,
                         apply: Callable[[nn.Module, SiteConfig], Undo],
                         carrier: str = "the module's input") -> None:
    """Make every ``module_type`` instance in a model one site of ``kind`` for the PyTorch host.

    ``apply(module, config) -> undo`` patches one instance, usually
    ``set_site(module, MyOMixin, kind, config)`` with a mixin whose ``forward`` reads
    ``site_config(self, kind)`` (τ, ε). The site is named by the module's path; its submodules are
    left to it (its scope: the module's whole subtree). A registration wins over built-ins and
    replaces an earlier one for the same type.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise ValueError(f"module_type must be an nn.Module subclass; got {module_type!r}")
    unregister_module_site(module_type)

    def build(path: str, module: nn.Module) -> list[Site]:
        return [Site(_site_name(path), kind, carrier, functools.partial(apply, module),
                     scope=(path,))]

    _BUILDERS.insert(0, (module_type, lambda m: isinstance(m, module_type), build))


def unregister_module_site(module_type: type) -> None:
    """Forget a type added with :func:`register_module_site` (no error when it was not added)."""
    _BUILDERS[:] = [entry for entry in _BUILDERS if entry[0] is not module_type]


def _site_name(path: str, *rest: str) -> str:
    """Site name of module ``path`` (``root`` for the model itself) and suffix parts."""
    return ".".join([path or "root", *rest])


def _builder_for(module: nn.Module) -> SiteBuilder | None:
    return next((build for _, matches, build in _BUILDERS if matches(module)), None)


def _plain(cls: type) -> Predicate:
    """Instances of ``cls`` whose class keeps ``cls.forward`` (an override is not ours to
    replace)."""
    return lambda m: isinstance(m, cls) and type(m).forward is cls.forward


def _layer_site(layer: nn.Module, mixin: type, key: str, child: tuple[type, str] | None = None
                ) -> Callable[[SiteConfig], Undo]:
    """Apply = swap ``layer`` to its O composite path (+ its child ``key`` with ``child`` =
    (mixin, site key))."""
    def apply(config: SiteConfig) -> Undo:
        steps = [functools.partial(set_site, layer, mixin, key, config)]
        if child is not None:
            steps.append(functools.partial(set_site, getattr(layer, key), *child, config))
        return patch_all(*steps)
    return apply


def _transformer_layer_sites(path: str, layer: nn.Module) -> list[Site]:
    decoder = isinstance(layer, nn.TransformerDecoderLayer)
    mixin = OTransformerDecoderLayer if decoder else OTransformerEncoderLayer
    attentions = ("self_attn", "multihead_attn") if decoder else ("self_attn",)
    norms = ("norm1", "norm2", "norm3") if decoder else ("norm1", "norm2")
    name = _site_name(path)
    stream = f"residual stream entering {name}"
    sites = [Site(f"{name}.{a}", ATTENTION,
                  stream + (" (sources: memory)" if a == "multihead_attn" else ""),
                  _layer_site(layer, mixin, a, (OMultiheadAttention, ATTENTION)),
                  scope=(join_path(path, a),))
             for a in attentions]
    sites += [Site(f"{name}.{n}", NORM, f"state entering {name}.{n}",
                   _layer_site(layer, mixin, n, (ONormSite, NORM)), scope=(join_path(path, n),))
              for n in norms]
    sites.append(Site(f"{name}.ffn", FFN, f"residual stream entering the FFN of {name}",
                      _layer_site(layer, mixin, FFN),
                      scope=(join_path(path, "linear1"), join_path(path, "linear2"))))
    return sites


def _encoder_sites(path: str, encoder: nn.Module) -> list[Site]:
    """Sites of the encoder's layers, each also keeping the encoder off nested tensors."""
    def guarded(site: Site) -> Callable[[SiteConfig], Undo]:
        return lambda config: patch_all(
            functools.partial(site.apply, config),
            functools.partial(set_site, encoder, DenseTransformerEncoder, site.name, config))

    sites = [dataclasses.replace(s, apply=guarded(s)) for i, layer in enumerate(encoder.layers)
             for s in _sites_within(join_path(path, f"layers.{i}"), layer)]
    if encoder.norm is not None:
        sites += _sites_within(join_path(path, "norm"), encoder.norm)
    return sites


def _module_site(kind: str, mixin: type, carrier: str) -> SiteBuilder:
    """Builder of one site of ``kind`` on the module itself (named and scoped by its path)."""
    def build(path: str, module: nn.Module) -> list[Site]:
        return [Site(_site_name(path), kind, carrier.format(_site_name(path)),
                     functools.partial(set_site, module, mixin, kind), scope=(path,))]
    return build


_TOKEN_LOCAL = (nn.Linear, nn.Dropout, nn.Identity, nn.GELU, nn.ReLU, nn.ReLU6, nn.LeakyReLU,
                nn.SiLU, nn.Mish, nn.ELU, nn.CELU, nn.SELU, nn.Tanh, nn.Sigmoid, nn.Hardswish,
                nn.Hardsigmoid, nn.Softplus)


def _token_local_mlp(module: nn.Module) -> bool:
    """A plain ``nn.Sequential`` (or a subclass keeping its ``forward``, like torchvision's
    ``MLPBlock``) of token-local layers with at least one ``nn.Linear``."""
    children = list(module.children())
    return (_plain(nn.Sequential)(module) and any(isinstance(c, nn.Linear) for c in children)
            and all(isinstance(c, _TOKEN_LOCAL) for c in children))


_norm_sites = _module_site(NORM, ONormSite, "state entering {}")
_BUILDERS += [(cls, _plain(cls), build) for cls, build in (
    (nn.TransformerEncoder, _encoder_sites),
    (nn.TransformerEncoderLayer, _transformer_layer_sites),
    (nn.TransformerDecoderLayer, _transformer_layer_sites),
    (nn.MultiheadAttention, _module_site(ATTENTION, OMultiheadAttention,
                                         "query / key inputs of {}")),
    (nn.LayerNorm, _norm_sites),
    (nn.RMSNorm, _norm_sites),
)] + [(nn.Sequential, _token_local_mlp,
       _module_site(FFN, OMLPSite, "input of the MLP {} (residual stream or its ONorm'd copy)"))]


def _claimed(model: nn.Module) -> list[tuple[str, nn.Module, SiteBuilder]]:
    """Outermost modules with a builder, in model order (their submodules belong to them)."""
    claimed: list[tuple[str, nn.Module, SiteBuilder]] = []
    for name, module in model.named_modules():
        if claimed and (claimed[-1][0] == "" or name.startswith(claimed[-1][0] + ".")):
            continue
        build = _builder_for(module)
        if build is not None:
            claimed.append((name, module, build))
    return claimed


_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)


def uncovered_attention(model: nn.Module, covered: list[str], within: Sequence[str] = ("",)
                        ) -> list[str]:
    """Attention-like modules (class name has 'Attention'/'Attn') inside ``within`` that no
    site reaches (used by the transformers hosts; the torch.nn host checks scopes instead).

    A module counts as reached when it, an ancestor or a descendant is in ``covered`` (paths).
    Returns ``'path (ClassName)'`` for the outermost unreached ones.
    """
    def related(a: str, b: str) -> bool:
        return a == b or not a or not b or a.startswith(b + ".") or b.startswith(a + ".")

    found: list[str] = []
    for name, module in model.named_modules():
        if not _ATTENTION_NAME.search(type(module).__name__) or not inside(name, within):
            continue
        if any(related(name, c) for c in covered) or any(name.startswith(f + ".") for f in found):
            continue
        found.append(name)
    return [f"{n or 'root'} ({type(model.get_submodule(n)).__name__})" for n in found]


def _sites_within(prefix: str, module: nn.Module) -> list[Site]:
    """Sites of ``module``'s claimed parts; ``module`` sits at path ``prefix`` of the model."""
    return [s for name, sub, build in _claimed(module) for s in build(join_path(prefix, name), sub)]


class TorchNNHost:
    """The plain-PyTorch host (see module docstring); matches any model with an attention site.

    No ``uncovered`` method: every site states its scope, so the registry lists each weight
    outside all scopes (:func:`oretrofit._surgery.compose.unreached`)."""

    name = "torch.nn"
    specificity = 0
    supports = ("nn.MultiheadAttention, nn.TransformerEncoder/DecoderLayer, nn.LayerNorm/RMSNorm, "
                "nn.Sequential MLPs and module types added with register_module_site")

    def matches(self, model: nn.Module) -> bool:
        return any(s.kind == ATTENTION for s in self.sites(model))

    def check(self, model: nn.Module) -> None:
        for name, module in model.named_modules():
            if isinstance(module, nn.MultiheadAttention) and (
                    module.bias_k is not None or module.add_zero_attn):
                raise RetrofitError(
                    f"{name}: nn.MultiheadAttention with add_bias_kv / add_zero_attn appends "
                    "tokens that have no carrier; rebuild it without them or register your own "
                    "site for it with register_module_site")

    def sites(self, model: nn.Module) -> list[Site]:
        return _sites_within("", model)

    def version(self) -> dict[str, str]:
        return {"torch": torch.__version__}


HOST = register_host(TorchNNHost())
