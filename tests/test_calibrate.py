"""calibrate: one τ per site from the host's own carriers, τ_site = δ/(1−δ)·Q_q(‖h‖²)."""

import math

import pytest
import torch
from torch import nn

from oretrofit import RetrofitError, apply_spec, observe_presence, presence
from oretrofit import CarrierNormProfile, calibrate

DELTA, Q = 1e-3, 0.01


class TwoScales(nn.Module):
    """Two attention sites whose carriers live ten decades apart (‖h‖² ~ 1e-5 and ~ 1e5)."""

    SCALES = {"small": 1e-3, "big": 1e2}

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.MultiheadAttention(8, 2, batch_first=True)
        self.big = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        outs = []
        for name, scale in self.SCALES.items():
            h = x * scale
            outs.append(getattr(self, name)(h, h, h, need_weights=False)[0])
        return tuple(outs)


@pytest.fixture()
def host():
    torch.manual_seed(0)
    return TwoScales().eval()


def batches(n=3, rows=12):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, rows, 8, generator=g) * torch.rand(2, rows, 1, generator=g).add(0.2)
            for _ in range(n)]


def test_each_site_gets_its_own_tau_and_its_carriers_keep_presence_above_one_minus_delta(host):
    data = batches()
    spec = calibrate(host, data, delta=DELTA, quantile=Q)
    tau = spec["site_tau"]
    assert set(tau) == {"small", "big"}
    # carriers 10 decades apart -> taus about 10 decades apart
    assert 1e8 < tau["big"] / tau["small"] < 1e12
    assert spec["tau"] == min(tau.values())
    for name, scale in TwoScales.SCALES.items():
        p = torch.cat([presence(x * scale, tau[name]).flatten() for x in data])
        assert (p >= 1 - DELTA).float().mean() >= 1 - Q            # the rule, on every carrier
        assert p.min() < 1 - 1e-6          # and τ is as large as it may be: not a near-zero τ
        # one global τ would not do: the big site's τ gates the small carriers away, the small
        # site's τ leaves the big carriers at presence 1 (no gate at all)
        other = tau["big" if name == "small" else "small"]
        p_global = torch.cat([presence(x * scale, other).flatten() for x in data])
        assert (p_global < 0.5).all() if name == "small" else (p_global >= 1 - 1e-6).all()
    # the spec reaches the sites: every presence computed under it obeys the rule
    seen = []
    with _applied(host, spec), \
            observe_presence(lambda p: seen.append(p.flatten())), torch.no_grad():
        for x in data:
            host(x)
    seen = torch.cat(seen)
    assert (seen >= 1 - DELTA).float().mean() >= 1 - Q


class _applied:
    def __init__(self, model, spec):
        self.model, self.spec = model, spec

    def __enter__(self):
        self.retrofit = apply_spec(self.model, self.spec)
        return self.retrofit

    def __exit__(self, *exc):
        self.retrofit.revert()


def test_null_insertion_stays_exact_under_the_calibrated_spec(host):
    data = batches()
    spec = calibrate(host, data, delta=DELTA, quantile=Q)
    x = data[0]
    with_null = torch.cat([x[:, :5], torch.zeros(2, 1, 8), x[:, 5:]], dim=1)
    with _applied(host, spec), torch.no_grad():
        before, after = host(x), host(with_null)
    for old, new in zip(before, after):
        assert torch.equal(new[:, 5], torch.zeros_like(new[:, 5]))          # exactly null
        kept = torch.cat([new[:, :5], new[:, 6:]], dim=1)
        assert (kept - old).abs().max() <= 1e-5 * old.abs().max()


def test_the_spec_records_its_data_and_rule_and_leaves_the_host_unpatched(host):
    data = batches()
    x = data[0]
    with torch.no_grad():
        reference = host(x)
    spec = calibrate(host, data, delta=DELTA, quantile=Q, data={"name": "gaussian"})
    calibration = spec["calibration"]
    assert calibration["delta"] == DELTA and calibration["quantile"] == Q
    assert calibration["data"]["batches"] == 3 and len(calibration["data"]["sha256"]) == 64
    assert calibration["data"]["name"] == "gaussian"
    assert calibration["sites"]["small"]["count"] > 0
    assert spec["arm"] == "full-o" and sorted(spec["sites"]) == ["big", "small"]
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(host(x), reference))      # not patched
    # same data, same spec; other data, other hash
    assert calibrate(host, data, delta=DELTA, quantile=Q)["site_tau"] == spec["site_tau"]
    assert calibrate(host, batches(n=2), delta=DELTA, quantile=Q)["calibration"]["data"]["sha256"] \
        != calibration["data"]["sha256"]


def test_zero_carriers_are_not_counted_as_carriers(host):
    zeros = [torch.zeros(2, 4, 8)]
    with pytest.raises(RetrofitError, match="saw no non-zero carrier"):
        calibrate(host, zeros)


@pytest.mark.parametrize("kwargs,message", [({"delta": 0.0}, "delta must be in"),
                                            ({"delta": 1.0}, "delta must be in"),
                                            ({"quantile": 1.0}, "quantile must be in"),
                                            ({"quantile": -0.1}, "quantile must be in")])
def test_bad_settings_name_the_fix(host, kwargs, message):
    with pytest.raises(ValueError, match=message):
        calibrate(host, batches(), **kwargs)


def test_empty_data_is_refused(host):
    with pytest.raises(ValueError, match="batches is empty"):
        calibrate(host, [])


def test_profile_quantile_floor_bounds_the_carriers_from_below():
    profile = CarrierNormProfile()
    values = torch.logspace(-12, 6, 1000, dtype=torch.float64)
    profile(torch.cat([values, torch.zeros(7)]))
    assert profile.count == 1000 and profile.null == 7
    for q in (0.0, 0.01, 0.5):
        floor = profile.quantile_floor(q)
        assert (values >= floor).double().mean() >= 1 - q
        # and it is tight: within one bin below the k-th smallest carrier, k = ⌈q·n⌉
        kth = values[max(math.ceil(q * values.numel()), 1) - 1].item()
        assert kth / 10 ** (1 / profile.BINS_PER_DECADE) * (1 - 1e-9) <= floor <= kth * (1 + 1e-9)
