"""number_like: a cached 0-dim tensor that gives the bits of the Python number it stands for."""

import pytest
import torch

from oretrofit import presence
from oretrofit._kernels.dtypes import number_like


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_number_like_gives_the_bits_of_the_python_number(dtype: torch.dtype) -> None:
    sq = torch.rand(4096, dtype=dtype) * torch.logspace(-20, 5, 4096, dtype=dtype)
    for tau in (1e-8, 1e-2, 0.3):
        assert torch.equal(sq / (sq + number_like(tau, sq)), sq / (tau + sq))
        h = sq.reshape(-1, 8)                         # presence: eq. 3 with τ as the number
        norms = h.square().sum(-1)
        assert torch.equal(presence(h, tau), norms / (tau + norms))
    wide = torch.randn(2, 7, 576, dtype=dtype)        # a hidden size a host has: same bits
    norms = wide.square().sum(-1)
    assert torch.equal(presence(wide, 1e-8), norms / (1e-8 + norms))
    with torch.inference_mode():                    # made here, usable under autograd later
        number_like(0.125, torch.ones(1, dtype=dtype))
    x = torch.ones(3, dtype=dtype, requires_grad=True)
    (x - number_like(0.125, x)).sum().backward()
    assert torch.equal(x.grad, torch.ones(3, dtype=dtype))


def test_number_like_keeps_the_number_where_a_tensor_would_change_the_op() -> None:
    assert number_like(1e-8, torch.ones(2, dtype=torch.bfloat16)) == 1e-8     # computed in fp32
    assert number_like(1e-8, torch.nn.Parameter(torch.ones(2))) == 1e-8       # a subclass
