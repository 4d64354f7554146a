"""Plain-PyTorch host: MultiheadAttention, Transformer encoder/decoder layers, norms, own sites."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import oretrofit
from oretrofit import (RetrofitError, o_attention, o_gate, presence, register_module_site, retrofit,
                       retrofitted)
from oretrofit.hosts.torch_nn import set_site, site_config, unregister_module_site
from oretrofit.hosts.transformers.releases import supported_text

TAU = 1e-8
D, HEADS = 16, 4


def _encoder(batch_first: bool, norm_first: bool) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(D, HEADS, 32, dropout=0.0, batch_first=batch_first,
                                       norm_first=norm_first)
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D),
                                 enable_nested_tensor=batch_first and not norm_first).eval()


def _tokens(x: Tensor, batch_first: bool) -> Tensor:
    """(B, N, d) view of a layout-native tensor."""
    return x if batch_first else x.transpose(0, 1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_tau_to_zero_matches_the_fast_path(batch_first: bool, norm_first: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    enc = _encoder(batch_first, norm_first)
    x = torch.randn(3, 6, D)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    x_in = x if batch_first else x.transpose(0, 1)
    with torch.no_grad():
        reference = _tokens(enc(x_in, src_key_padding_mask=kpm), batch_first)

        def fused(*args: object, **kwargs: object) -> None:
            raise AssertionError("a patched layer must not take torch's fused encoder path")

        monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", fused)
        with retrofitted(enc, "full-o", TAU) as r:
            out = _tokens(enc(x_in, src_key_padding_mask=kpm), batch_first)
        assert len(r.plan.entries) == 9
    real = ~kpm
    torch.testing.assert_close(out[real], reference[real], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_null_insertion_is_exact_under_full_o_only(norm_first: bool) -> None:
    enc = _encoder(True, norm_first)
    x = torch.randn(2, 5, D)
    with_nulls = torch.cat([x[:, :2], torch.zeros(2, 3, D), x[:, 2:]], dim=1)
    old = [0, 1, 5, 6, 7]
    with torch.no_grad():
        moved = (enc(with_nulls)[:, old] - enc(x)).abs().max()
        with retrofitted(enc, "full-o", TAU):
            out, alone = enc(with_nulls), enc(x)
    torch.testing.assert_close(out[:, old], alone, atol=1e-6, rtol=0)
    assert out[:, 2:5].abs().max() == 0
    assert moved > 1e-2                               # the unpatched encoder attends to them


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_and_ignores_null_memory(norm_first: bool) -> None:
    layer = nn.TransformerDecoderLayer(D, HEADS, 32, dropout=0.0, batch_first=True,
                                       norm_first=norm_first).eval()
    tgt, memory = torch.randn(2, 5, D), torch.randn(2, 4, D)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    mkpm = torch.tensor([[False, False, False, True], [False] * 4])
    with torch.no_grad():
        reference = layer(tgt, memory, tgt_mask=causal, memory_key_padding_mask=mkpm,
                          tgt_is_causal=True)
        with retrofitted(layer, "full-o", TAU) as r:
            out = layer(tgt, memory, tgt_mask=causal, memory_key_padding_mask=mkpm,
                        tgt_is_causal=True)
            padded = torch.cat([memory, torch.zeros(2, 2, D)], dim=1)
            null_memory = layer(tgt, padded, tgt_mask=causal)
            plain = layer(tgt, memory, tgt_mask=causal)
        assert {s["site"] for s in r.report()} == {
            "root.self_attn", "root.multihead_attn", "root.norm1", "root.norm2", "root.norm3",
            "root.ffn"}
    torch.testing.assert_close(out, reference, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(null_memory, plain, atol=1e-6, rtol=0)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("mask_kind", ["bool2d", "float3d"])
def test_multihead_attention_matches_torch(batch_first: bool, mask_kind: str) -> None:
    mha = nn.MultiheadAttention(D, HEADS, batch_first=batch_first).eval()
    q, kv = torch.randn(2, 5, D), torch.randn(2, 7, D)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    excluded = torch.rand(5, 7) < 0.3
    excluded[:, 0] = False                            # keep every row's support non-empty
    if mask_kind == "bool2d":
        attn_mask = excluded
    else:
        attn_mask = torch.zeros(2 * HEADS, 5, 7).masked_fill(excluded, float("-inf"))
        attn_mask += torch.randn(2 * HEADS, 5, 7) * 0.1
    args = [t if batch_first else t.transpose(0, 1) for t in (q, kv, kv)]
    with torch.no_grad():
        ref_out, ref_w = mha(*args, key_padding_mask=kpm, attn_mask=attn_mask)
        with retrofitted(mha, "oa", TAU):
            out, w = mha(*args, key_padding_mask=kpm, attn_mask=attn_mask)
            fused, none = mha(*args, key_padding_mask=kpm, attn_mask=attn_mask,
                              need_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused, ref_out, atol=1e-5, rtol=1e-5)
    assert none is None


def test_multihead_attention_null_query_and_key_with_biases() -> None:
    mha = nn.MultiheadAttention(D, HEADS, batch_first=True).eval()   # biased in/out projections
    x = torch.randn(1, 4, D)
    x[0, 2] = 0
    with torch.no_grad(), retrofitted(mha, "oa", TAU):
        out, w = mha(x, x, x)
        unbatched, _ = mha(x[0], x[0], x[0])
    assert out[0, 2].abs().max() == 0                  # emits nothing: p_i gates W_O and b_O
    assert w[0, :, 2].abs().max() == 0                  # receives no mass
    torch.testing.assert_close(unbatched, out[0])


def test_state_dict_strict_load_and_exact_revert() -> None:
    enc = _encoder(True, False)
    x = torch.randn(2, 5, D)
    original = {k: v.clone() for k, v in enc.state_dict().items()}
    with torch.no_grad():
        before = enc(x)
        r = retrofit(enc, "full-o", TAU)
        assert list(enc.state_dict()) == list(original)
        enc.load_state_dict(original, strict=True)
        r.revert()
        assert torch.equal(enc(x), before)
    assert type(enc.layers[0]) is nn.TransformerEncoderLayer
    assert type(enc.layers[0].self_attn) is nn.MultiheadAttention
    assert type(enc) is nn.TransformerEncoder


def test_rmsnorm_and_standalone_norm_sites() -> None:
    model = nn.Sequential(nn.RMSNorm(D), nn.MultiheadAttention(D, HEADS, batch_first=True))

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.attn = model[0], model[1]

        def forward(self, x: Tensor) -> Tensor:
            h = self.norm(x)
            return self.attn(h, h, h, need_weights=False)[0]

    wrapper = Wrapper().eval()
    x = torch.randn(2, 3, D)
    x[1, 1] = 0
    with torch.no_grad(), retrofitted(wrapper, "full-o", TAU) as r:
        out = wrapper(x)
        assert [row["site"] for row in r.report()] == ["norm", "attn"]
    assert out[1, 1].abs().max() == 0


class TinyAttention(nn.Module):
    """A user's own attention module: one fused qkv projection, no torch.nn attention class."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, HEADS, D // HEADS)).permute(2, 0, 3, 1, 4)
        out = torch.softmax(q @ k.transpose(-1, -2) / (D // HEADS) ** 0.5, dim=-1) @ v
        return self.proj(out.transpose(1, 2).flatten(2))


class OTinyAttention:
    """The mixin a user writes: same projections, OAttention with presences of ``x``."""

    def forward(self, x: Tensor) -> Tensor:
        config = site_config(self, "attention")
        q, k, v = self.qkv(x).unflatten(-1, (3, HEADS, D // HEADS)).permute(2, 0, 3, 1, 4)
        p = presence(x, config.tau)
        out, _ = o_attention(q, k, v, p, p, eps=config.eps)
        return self.proj(out.transpose(1, 2).flatten(2))


def test_user_registered_site() -> None:
    model = nn.Sequential(TinyAttention(), nn.LayerNorm(D)).eval()
    x = torch.randn(1, 4, D)
    with_null = torch.cat([x, torch.zeros(1, 1, D)], dim=1)
    with pytest.raises(RetrofitError, match="register_module_site"):
        retrofit(model, "oa")                                  # no host knows TinyAttention
    register_module_site(TinyAttention, "attention",
                         lambda module, config: set_site(module, OTinyAttention, "attention",
                                                         config))
    try:
        with torch.no_grad():
            reference = model(x)
            with retrofitted(model, "full-o", TAU) as r:
                out, nulled = model(x), model(with_null)
            assert [row["site"] for row in r.report()] == ["0", "1"]
    finally:
        unregister_module_site(TinyAttention)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nulled[:, :4], out, atol=1e-6, rtol=0)
    assert nulled[0, 4].abs().max() == 0


def test_unsupported_model_error_names_class_why_and_how_to_register() -> None:
    with pytest.raises(RetrofitError) as err:
        retrofit(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)), "full-o")
    message = str(err.value)
    assert "no registered host matches Sequential: no host recognises its class" in message
    assert "'torch.nn' found no attention module it has a site for" in message
    assert "torch.nn (nn.MultiheadAttention" in message
    assert f"transformers (transformers {supported_text()}" in message
    assert "oretrofit.register_module_site(MyAttention, 'attention', apply)" in message
    assert "register_module_site" in oretrofit.__all__


def test_partial_match_is_refused_then_recorded() -> None:
    model = nn.ModuleDict({"known": nn.MultiheadAttention(D, HEADS), "mine": TinyAttention()})
    with pytest.raises(RetrofitError, match=r"mine \(TinyAttention\).*allow_partial"):
        retrofit(model, "oa")
    with retrofitted(model, "oa", TAU, allow_partial=True) as r:
        assert r.spec()["uncovered"] == ["mine (TinyAttention)"]
        assert [row["site"] for row in r.report()] == ["known"]


@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_dropout_in_training_is_the_modules_own(need_weights: bool) -> None:
    """In train(), nn.MultiheadAttention's weight dropout acts on the O weights: at τ→0 under one
    seed the retrofitted module equals the unpatched one (the same (B, H, Nq, Nk) mask is drawn),
    another seed differs; a null token still emits exactly zero."""
    attention = nn.MultiheadAttention(D, HEADS, dropout=0.3, batch_first=True).train()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0))
    with_null = x.clone()
    with_null[1, 3] = 0.0

    def run(seed: int, tokens: Tensor = x) -> Tensor:
        torch.manual_seed(seed)
        return attention(tokens, tokens, tokens, need_weights=need_weights)[0]

    base, other = run(0), run(1)
    with retrofitted(attention, "oa", 1e-12, eps=1e-12):
        same, again = run(0), run(1)
        assert run(0, with_null)[1, 3].abs().max() == 0
    scale = base.abs().max()
    assert (same - base).abs().max() <= 1e-5 * scale
    assert (again - base).abs().max() >= 1e-2 * scale
    assert (again - other).abs().max() <= 1e-5 * scale


# --- torchvision's ViT encoder-block layout (built here: torchvision is not installed) -------


class MLPBlock(nn.Sequential):
    """torchvision's ``MLPBlock``: an ``nn.Sequential`` subclass that keeps its ``forward``."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__(nn.Linear(d, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, d),
                         nn.Dropout(0.0))


class ViTBlock(nn.Module):
    """torchvision's ``EncoderBlock``: ln_1 -> self_attention -> dropout -> +input;
    ln_2 -> mlp -> +."""

    def __init__(self, mlp: nn.Sequential) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(D, HEADS, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(D, eps=1e-6)
        self.mlp = mlp

    def forward(self, inputs: Tensor) -> Tensor:
        x = self.ln_1(inputs)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + inputs
        return x + self.mlp(self.ln_2(x))


class ViTEncoder(nn.Module):
    """torchvision's ``Encoder`` without its position table: blocks, then a final LayerNorm."""

    def __init__(self, extra: nn.Module | None = None) -> None:
        super().__init__()
        plain = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Dropout(0.0),
                              nn.Linear(2 * D, D), nn.Dropout(0.0))
        self.layers = nn.Sequential(ViTBlock(plain), ViTBlock(MLPBlock(D, 2 * D)),
                                    *([extra] if extra is not None else []))
        self.ln = nn.LayerNorm(D, eps=1e-6)
        with torch.no_grad():                     # non-zero biases and norm affines
            for p in self.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(self.layers(x))


def _insert_null(x: Tensor, at: int) -> Tensor:
    return torch.cat([x[:, :at], torch.zeros(x.shape[0], 1, x.shape[2]), x[:, at:]], dim=1)


def test_vit_block_sites_gate_the_sequential_mlp() -> None:
    with retrofitted(ViTEncoder(), "full-o", 1e-6) as r:
        sites = {row["site"]: row["kind"] for row in r.report()}
        assert r.spec()["uncovered"] == [] and r.spec()["hosts"] == ["torch.nn"]
    assert sites == {**{f"layers.{i}.{n}": k for i in (0, 1) for n, k in (
        ("ln_1", "norm"), ("self_attention", "attention"), ("ln_2", "norm"), ("mlp", "ffn"))},
        "ln": "norm"}


def test_vit_null_insertion_is_exact_under_full_o() -> None:
    torch.manual_seed(0)
    model, x = ViTEncoder(), torch.randn(2, 6, D)
    with_null = _insert_null(x, 3)
    old = [0, 1, 2, 4, 5, 6]
    with torch.no_grad():
        moved = (model(with_null)[:, old] - model(x)).abs().max()
        with retrofitted(model, "full-o", 1e-6):
            out, alone = model(with_null), model(x)
            inner = model.layers[:1](with_null)           # the state after the first block
    assert (out[:, old] - alone).abs().max() <= 1e-4
    assert out[:, 3].abs().max() == 0 and inner[:, 3].abs().max() == 0
    assert moved > 1e-2                               # unpatched, the null token is attended to


def test_vit_tau_eps_to_zero_agrees_and_revert_is_bit_identical() -> None:
    torch.manual_seed(1)
    model, x = ViTEncoder(), torch.randn(2, 6, D)
    keys = list(model.state_dict())
    with torch.no_grad():
        reference = model(x)
        r = retrofit(model, "full-o", 1e-12, eps=1e-12)
        out = model(x)
        assert list(model.state_dict()) == keys
        r.revert()
        after = model(x)
    assert (out - reference).abs().max() <= 1e-4 * reference.abs().max()
    assert torch.equal(after, reference)
    assert type(model.layers[1].mlp) is MLPBlock and type(model.layers[0].ln_1) is nn.LayerNorm


class ScaledResidual(nn.Module):
    """A user's residual block ``x + W x``: no host has a site for it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.proj(x)


class OScaledResidual:
    """Its O-mixin: OFFN on the branch, ``x + ρτ(x) · W x``."""

    def forward(self, x: Tensor) -> Tensor:
        return x + o_gate(presence(x, site_config(self, "ffn").tau), self.proj(x))


def test_ungated_residual_block_is_refused_then_recorded_or_registered() -> None:
    model = ViTEncoder(extra=ScaledResidual())
    x = torch.randn(1, 4, D)
    for arm in ("oa", "full-o"):
        with pytest.raises(RetrofitError) as err:
            retrofit(model, arm, 1e-6)
        message = str(err.value)
        assert "no site of any host reaches layers.2 (ScaledResidual) [host torch.nn]" in message
        assert "oretrofit.register_module_site(ModuleType, kind, apply)" in message
        assert "allow_partial=True" in message
    with torch.no_grad(), retrofitted(model, "full-o", 1e-6, allow_partial=True) as r:
        assert r.spec()["uncovered"] == ["layers.2 (ScaledResidual)"]
        assert model(_insert_null(x, 2))[:, 2].abs().max() > 0    # the ungated branch emits
    register_module_site(ScaledResidual, "ffn",
                         lambda module, config: set_site(module, OScaledResidual, "ffn", config))
    try:
        with torch.no_grad(), retrofitted(model, "full-o", 1e-6) as r:
            assert r.spec()["uncovered"] == [] and "layers.2" in r.spec()["sites"]
            assert model(_insert_null(x, 2))[:, 2].abs().max() == 0
    finally:
        unregister_module_site(ScaledResidual)


def test_weight_held_directly_by_a_module_is_uncovered() -> None:
    model = ViTEncoder()
    model.pos_embedding = nn.Parameter(torch.randn(1, 4, D))   # as torchvision's Encoder holds it
    with pytest.raises(RetrofitError, match=r"pos_embedding \(parameter of ViTEncoder\)"):
        retrofit(model, "full-o")
    model.register_buffer("table", torch.randn(4, D))
    with retrofitted(model, "full-o", allow_partial=True) as r:
        assert r.spec()["uncovered"] == ["pos_embedding (parameter of ViTEncoder)",
                                         "table (buffer of ViTEncoder)"]


def test_carrier_presence_is_shared_only_for_the_same_unchanged_carrier() -> None:
    from oretrofit._operators.presence_memo import carrier_presence
    h = torch.randn(2, 5, D)
    first = carrier_presence(h, 0.5)
    assert carrier_presence(h, 0.5) is first
    assert torch.equal(first, presence(h, 0.5))
    assert carrier_presence(h.clone(), 0.5) is not first          # another tensor, equal values
    assert torch.equal(carrier_presence(h, 2.0), presence(h, 2.0))   # another τ
    h[0, 0] = 0.0                                                  # changed in place
    again = carrier_presence(h, 0.5)
    assert again is not first and again[0, 0] == 0.0
    assert torch.equal(again, presence(h, 0.5))
    again.mul_(2.0)                                                # the presence changed in place
    assert torch.equal(carrier_presence(h, 0.5), presence(h, 0.5))


@pytest.mark.parametrize("first_column", [False, True])
def test_carrier_presence_keeps_its_two_forms_for_one_carrier(first_column: bool) -> None:
    """The (…) presences and the (…, 1) column of one carrier are made once each, the second a
    view of the first, and an in-place change to either invalidates both."""
    from oretrofit._operators.presence_memo import carrier_presence
    h = torch.randn(2, 5, D)
    first = carrier_presence(h, 0.5, column=first_column)
    other = carrier_presence(h, 0.5, column=not first_column)
    column, row = (first, other) if first_column else (other, first)
    assert column.shape == (2, 5, 1) and row.shape == (2, 5)
    assert torch.equal(row, presence(h, 0.5)) and torch.equal(column[..., 0], row)
    assert carrier_presence(h, 0.5, column=True) is column
    assert carrier_presence(h, 0.5) is row
    other.mul_(2.0)                                    # a view changed in place: both miss
    assert torch.equal(carrier_presence(h, 0.5), presence(h, 0.5))
    assert torch.equal(carrier_presence(h, 0.5, column=True), presence(h, 0.5, keepdim=True))


def test_carrier_presence_is_computed_each_time_under_autograd_and_observers() -> None:
    from oretrofit._operators.presence_memo import carrier_presence
    h = torch.randn(2, 5, D, requires_grad=True)
    assert carrier_presence(h, 0.5) is not carrier_presence(h, 0.5)
    seen: list[Tensor] = []
    x = torch.randn(2, 5, D)
    with oretrofit.observe_presence(seen.append):
        carrier_presence(x, 0.5), carrier_presence(x, 0.5)
    assert len(seen) == 2
    with torch.inference_mode():
        y = torch.randn(2, 5, D)
        assert carrier_presence(y, 0.5) is not carrier_presence(y, 0.5)
        assert carrier_presence(x, 0.5) is not carrier_presence(x, 0.5)   # made outside it
