"""OTransformerBlock: closed under zero extension, block(H ⊕ 0) = block(H) ⊕ 0 (eq. 22)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oretrofit import OTransformerBlock
from oretrofit.sweep.measure import insert_zero_rows

TAU = 1e-6


def randomise(block: nn.Module) -> nn.Module:
    """Non-trivial affine and bias parameters, so zero-absorption cannot come from zeros."""
    with torch.no_grad():
        for name, param in block.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_()
    return block


@pytest.mark.parametrize("where", [[6], [0], [3], [1, 4, 8]], ids=str)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_zero_extension_law_through_two_blocks(where: list[int], kv_heads: int) -> None:
    blocks = nn.Sequential(*(randomise(OTransformerBlock(16, 4, 32, TAU, n_kv_heads=kv_heads))
                             for _ in range(2)))
    h = torch.randn(2, 6, 16)
    out, out2 = blocks(h), blocks(insert_zero_rows(h, where))
    old = [i for i in range(6 + len(where)) if i not in where]
    assert torch.equal(out2[:, where], torch.zeros_like(out2[:, where]))
    assert (out2[:, old] - out).abs().max() <= 1e-5
    assert (out - h).abs().max() > 0.1                                   # the block does something


def test_block_with_key_padding_mask_and_gradients() -> None:
    # τ = 1: at τ = 1e-6 a central difference of step 1e-6 around a zero carrier sees
    # ρ·LayerNorm(±δ) ~ δ/τ, so numerical and analytical derivatives at 0 could not agree.
    block = randomise(OTransformerBlock(8, 2, 16, tau=1.0)).double()
    h = torch.randn(1, 5, 8, dtype=torch.float64)
    h[:, 2] = 0.0
    mask = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    mask[..., 4] = False
    h.requires_grad_()
    out = block(h, mask=mask)
    assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))
    out.sum().backward()
    assert torch.isfinite(h.grad).all()
    assert torch.autograd.gradcheck(lambda x: block(x, mask=mask), (h,), fast_mode=True)


def test_block_differs_from_ordinary_components_at_a_null_token() -> None:
    """The law needs the O-wrappers: an ordinary LayerNorm/FFN would re-activate a zero token."""
    block = randomise(OTransformerBlock(8, 2, 16, TAU))
    h = torch.zeros(1, 1, 8)
    assert torch.equal(block(h), h)
    assert block.ffn.ffn[1](block.ffn.ffn[0].norm(h)).abs().max() > 0
