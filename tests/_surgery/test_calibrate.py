"""calibrate: one τ per site from the host's own carriers, τ_site = δ/(1−δ)·Q_q(‖h‖²)."""

import math

import pytest
import torch
from torch import nn

from oretrofit import (RetrofitError, apply_spec, observe_carrier_norms, observe_presence,
                       presence, retrofitted)
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


# ---- every host: the rule holds for every carrier at or above the quantile, site by site ----

def _carriers(model, run):
    """(‖h‖², ρ) of every carrier whose presence is computed while ``run()`` runs (one
    presence() call feeds both observers, so the two lists pair up)."""
    sq, p = [], []
    with observe_carrier_norms(lambda s: sq.append(s.flatten().double())), \
            observe_presence(lambda x: p.append(x.flatten().double())), torch.no_grad():
        run()
    return torch.cat(sq), torch.cat(p)


def assert_calibrated(model, spec, run, delta, quantile):
    """Each site, patched alone at its spec τ over the calibration data, sees its own carriers
    (the host upstream is unpatched, as during calibration): every carrier at or above their
    q-quantile keeps presence ≥ 1−δ, and the quantile carrier itself is gated by δ within one
    histogram bin (τ is as large as the rule allows, not a near-zero τ). Then the whole spec:
    at least a fraction 1−q of all real carriers keeps presence ≥ 1−δ."""
    assert set(spec["site_tau"]) == {_exact(s) for s in spec["sites"]}
    bin_ratio = 10 ** (1 / CarrierNormProfile.BINS_PER_DECADE)
    for pattern, tau in spec["site_tau"].items():
        with retrofitted(model, spec["arm"], tau, targets=[pattern]):
            sq, p = _carriers(model, run)
        sq, p = sq[sq > 0], p[sq > 0]
        kth = sq.sort().values[max(math.ceil(quantile * sq.numel()), 1) - 1]
        assert p[sq >= kth].min() >= (1 - delta) * (1 - 1e-6), pattern
        gate = 1 - p[sq == kth].max()
        assert delta / bin_ratio * (1 - 1e-3) <= gate <= delta * (1 + 1e-3), pattern
    with _applied(model, spec):
        sq, p = _carriers(model, run)
    real = sq > 0
    assert (p[real] >= 1 - delta).double().mean() >= 1 - quantile


def _exact(name):
    from oretrofit._surgery.calibrate import _exact as exact
    return exact(name)


def test_two_scales_every_carrier_at_the_quantile_keeps_presence(host):
    data = batches()
    spec = calibrate(host, data, delta=DELTA, quantile=0.1)
    assert_calibrated(host, spec, lambda: [host(x) for x in data], DELTA, 0.1)


TEXT_Q = 0.1


@pytest.mark.parametrize("name", ["BERT", "Llama"])
def test_transformers_hosts_calibrate_per_site_and_stay_null_exact(name):
    from hosts.transformers import zoo
    from oretrofit.hosts.transformers.contracts import null_insertion
    model = zoo.build(next(a for a in zoo.ARCHITECTURES if a.name == name))
    data = [zoo.example_inputs(model, batch=2, tokens=12, seed=seed) for seed in range(4)]
    spec = calibrate(model, data, delta=DELTA, quantile=TEXT_Q)
    taus = spec["site_tau"]
    assert len(set(taus.values())) >= 4 and min(taus.values()) > 1e-6     # one τ per site
    assert spec["calibration"]["data"]["batches"] == 4
    assert_calibrated(model, spec, lambda: [model(**b) for b in data], DELTA, TEXT_Q)
    with _applied(model, spec):
        inserted = null_insertion(model, data[0])
    assert inserted["inserted_max_abs"] == 0 and inserted["old_max_delta"] <= 1e-5


def test_a_torch_nn_transformer_encoder_calibrates():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16), enable_nested_tensor=False).eval()
    g = torch.Generator().manual_seed(2)
    data = [torch.randn(2, 10, 16, generator=g) * torch.rand(2, 10, 1, generator=g).add(0.1)
            for _ in range(3)]
    spec = calibrate(model, data, delta=DELTA, quantile=TEXT_Q)
    assert spec["host"] == "torch.nn" and len(spec["sites"]) >= 5
    assert len(set(spec["site_tau"].values())) >= 3
    assert_calibrated(model, spec, lambda: [model(x) for x in data], DELTA, TEXT_Q)
    x = data[0]
    with_null = torch.cat([x[:, :4], torch.zeros(2, 1, 16), x[:, 4:]], dim=1)
    with _applied(model, spec), torch.no_grad():
        before, after = model(x), model(with_null)
    assert torch.equal(after[:, 4], torch.zeros_like(after[:, 4]))
    kept = torch.cat([after[:, :4], after[:, 5:]], dim=1)
    assert (kept - before).abs().max() <= 1e-5 * before.abs().max()


def test_the_spec_records_the_weights_it_was_calibrated_on(host):
    from oretrofit._surgery.calibrate import check_calibrated_weights
    spec = calibrate(host, batches())
    assert len(spec["calibration"]["weights_sha256"]) == 64
    check_calibrated_weights(spec, host)
    check_calibrated_weights({**spec, "calibration": None}, host)        # nothing recorded
    with torch.no_grad():
        host.small.out_proj.weight[0, 0] += 1e-3
    with pytest.raises(RetrofitError, match="calibrated on other weights"):
        check_calibrated_weights(spec, host)


# ---- one pass over the data for every site ------------------------------------------------

def _encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16), enable_nested_tensor=False).eval()


def _zoo(name):
    from hosts.transformers import zoo
    return zoo.build(next(a for a in zoo.ARCHITECTURES if a.name == name))


def _inputs(model):
    if isinstance(model, (TwoScales, nn.TransformerEncoder)):
        width = 8 if isinstance(model, TwoScales) else 16
        g = torch.Generator().manual_seed(2)
        return [((torch.randn(2, 10, width, generator=g)
                  * torch.rand(2, 10, 1, generator=g).add(0.1)),) for _ in range(3)]
    from hosts.transformers import zoo
    return [zoo.example_inputs(model, batch=2, tokens=12, seed=seed) for seed in range(3)]


@pytest.mark.parametrize("make", [lambda: TwoScales().eval(), _encoder, lambda: _zoo("BERT"),
                                  lambda: _zoo("Llama")],
                         ids=["two-scales", "torch.nn", "BERT", "Llama"])
def test_every_site_is_recorded_in_one_pass_as_if_patched_alone(make):
    """The data is run once for all sites (it ran once per site), and each site's record equals
    what the site calibrated alone records (only it patched, the host upstream unpatched):
    at the probe τ every carrier's presence is 1 exactly, so the other sites change nothing
    upstream but round-off below the histogram's bins."""
    model = make()
    data, runs = _inputs(model), []

    def run(host):
        runs.append(1)
        for batch in data:
            host(**batch) if isinstance(batch, dict) else host(*batch)

    spec = calibrate(model, run, delta=DELTA, quantile=TEXT_Q)
    assert len(runs) == 1 and len(spec["sites"]) >= 2
    for name, row in spec["calibration"]["sites"].items():
        alone = calibrate(model, run, delta=DELTA, quantile=TEXT_Q, targets=[_exact(name)])
        assert alone["calibration"]["sites"] == {name: row}, name


def test_a_presence_at_no_sites_probe_tau_is_refused(host):
    """Carriers are told apart by the τ they are gated at: a presence computed at any other τ
    while the data runs cannot be attributed, and is refused rather than dropped."""
    def run(model):
        model(batches(n=1)[0])
        presence(torch.ones(2, 3), 0.5)

    with pytest.raises(RetrofitError, match=r"a presence was computed at τ=0.5, which is no "
                                            r"site's probe τ"):
        calibrate(host, run)
