"""Study hosts: exact shared initialisation across arms and the exact-zero inserted states."""

import pytest
import torch

from oretrofit.studies import insertion, zero_columns
from oretrofit.studies.common import state_digest
from oretrofit.studies.models import ARM_SPECS, FTHost, ScalarAdapter, SoftmaxAttention, build_host

MATCHED = ("standard", "oa_only", "otransformer")


def _host(spec, n_features=5, n_outputs=3, seed=11):
    torch.manual_seed(seed)
    return FTHost(spec, n_features, n_outputs).eval()


def test_three_arms_share_the_exact_initial_state():
    hosts = [_host(ARM_SPECS[arm]) for arm in MATCHED]
    assert len({state_digest(h) for h in hosts}) == 1
    for params in zip(*(h.parameters() for h in hosts)):
        assert all(torch.equal(params[0], p) for p in params[1:])
    assert isinstance(hosts[0].blocks[0].attn, SoftmaxAttention)
    assert not isinstance(hosts[1].blocks[0].attn, SoftmaxAttention)
    control = _host(ARM_SPECS["structural_control"])
    assert state_digest(control) != state_digest(hosts[0])


@pytest.mark.parametrize("module", [insertion, zero_columns])
def test_softmax_and_oattention_hosts_share_initial_state(module):
    a, b = (_host(module.host_spec(arm)) for arm in module.ARMS)
    assert state_digest(a) == state_digest(b)


def test_adapter_arms_share_initial_state_and_differ_only_in_attention():
    torch.manual_seed(23)
    soft = ScalarAdapter(4, 3, "softmax")
    torch.manual_seed(23)
    oa = ScalarAdapter(4, 3, "oattention")
    assert state_digest(soft) == state_digest(oa)
    x = torch.randn(8, 4)
    # τ = 1e-6 and active tokens: OAttention is the softmax path up to ε and presence ≈ 1.
    torch.testing.assert_close(oa(x), soft(x), atol=1e-4, rtol=1e-4)
    x[:, 1] = 0.0                                 # a zero feature is an exact zero token
    with torch.no_grad():
        tokens = oa.tokenizer(x)
        assert torch.equal(oa.attn(tokens)[0][:, 1], torch.zeros(8, 64))
        assert soft.attn(tokens)[0][:, 1].abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("arm", list(ARM_SPECS))
def test_inserted_states_exact_zero_only_for_o_closed_arms(arm):
    host = _host(ARM_SPECS[arm])
    x = torch.randn(16, 5)
    base, ext = host.states(x), host.states(x, n_zero=3)
    inserted = [e[:, 6:] for e in ext]
    if arm in ("otransformer", "structural_control"):
        assert all(torch.equal(s, torch.zeros_like(s)) for s in inserted)
        torch.testing.assert_close(ext[-1][:, :6], base[-1], atol=1e-5, rtol=0)
        torch.testing.assert_close(host(x, n_zero=3), host(x), atol=1e-5, rtol=0)
    else:
        # OA-only keeps attention exact but the additive encoding, affine norm and biased FFN
        # activate the inserted token: the paper's negative result.
        assert inserted[-1].abs().max() > 0.1
        assert (host(x, n_zero=3) - host(x)).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("module", [insertion, zero_columns])
def test_ft_hosts_keep_zero_tokens_exact_only_with_oattention(module):
    x = torch.randn(16, 5)
    for arm in module.ARMS:
        ext = _host(module.host_spec(arm)).states(x, n_zero=2)[-1][:, 6:]
        if arm == "oattention":
            assert torch.equal(ext, torch.zeros_like(ext))
        else:
            assert ext.abs().max() > 0.1


def test_host_rejects_too_many_zero_tokens():
    with pytest.raises(ValueError, match="max_inserted"):
        _host(ARM_SPECS["otransformer"])(torch.randn(2, 5), n_zero=5)


@torch.no_grad()
def test_zero_column_hosts_start_from_the_k0_state():
    x = torch.randn(16, 5)
    x_ext = torch.cat([x, torch.zeros(16, 2)], dim=1)
    for arm in zero_columns.ARMS:
        spec = zero_columns.host_spec(arm)
        base = build_host(spec, 5, 3, seed=11)
        ext = build_host(spec, 7, 3, seed=11, zero_columns=2)
        assert torch.equal(ext.tokenizer.weight[:5], base.tokenizer.weight)
        assert torch.equal(ext.blocks[1].attn.q_proj.weight, base.blocks[1].attn.q_proj.weight)
        shift = (ext(x_ext) - base(x)).abs().max()
        if arm == "oattention":        # the zero columns are inert: same function as k = 0
            assert shift < 1e-5
        else:
            assert shift > 1e-3
