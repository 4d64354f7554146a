"""Calibrated τ: one presence scale per site, read off the host's own carriers.

A carrier keeps presence ρτ(h) = ‖h‖²/(τ+‖h‖²) ≥ 1−δ exactly when ‖h‖² ≥ τ·(1−δ)/δ. So with

    τ_site = δ/(1−δ) · Q_q(‖h‖²)                                         (Q_q: q-quantile)

every carrier of the site at or above the q-quantile of its calibration carriers is gated by at
most δ, whatever the scale its carriers live at, while a zero carrier stays exactly null at any τ.
One global τ cannot do this when sites' carrier norms differ by orders of magnitude (a TabPFN
host's learned inducing vectors against its ICL rows).

Carriers are recorded for every site in one pass over the data: each site is patched at its own
probe τ (``PROBE_TAU``·(k+1) for the k-th site; ε = ``PROBE_TAU``), so every ‖h‖² a presence is
computed from is told apart by the τ it is computed at (learned receivers included: their
presence is computed like any carrier's). At these τ every carrier fp32 can tell from 0 has
presence 1 exactly, so the patched host upstream of a site is the host itself up to round-off in
its attention (≲1e-6 relative): what a site sees is what it would see patched alone.
Histograms have constant size (log-spaced bins), as :class:`PresenceProfile`'s do.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .._operators.presence import EPS_RETROFIT, observe_carrier_norms_by_tau
from .registry import RetrofitError, plan_retrofit, retrofit, retrofitted
from .serialize import calibrated_weights_digest, check_calibrated_weights

__all__ = ["CarrierNormProfile", "calibrate", "check_calibrated_weights", "PROBE_TAU"]

PROBE_TAU = 1e-30      # τ = ε while recording: presence 1 for any carrier fp32 can tell from 0


class CarrierNormProfile:
    """A log-spaced histogram of carriers' squared norms ‖h‖² (zero and non-finite ones counted
    apart). Bins are ``1/BINS_PER_DECADE`` decades wide over [10^LOG10_MIN, 10^LOG10_MAX]; values
    outside fall into the edge bins."""

    LOG10_MIN, LOG10_MAX, BINS_PER_DECADE = -40, 40, 100
    BINS = (LOG10_MAX - LOG10_MIN) * BINS_PER_DECADE

    def __init__(self) -> None:
        self.counts = torch.zeros(self.BINS, dtype=torch.float64)
        self.count = 0          # non-zero finite carriers
        self.null = 0           # exactly zero carriers
        self.nonfinite = 0

    def __call__(self, sq: Tensor) -> None:
        flat = sq.reshape(-1).to(torch.float64).cpu()
        finite = flat[torch.isfinite(flat)]
        positive = finite[finite > 0]
        self.nonfinite += flat.numel() - finite.numel()
        self.null += finite.numel() - positive.numel()
        bins = ((positive.log10() - self.LOG10_MIN) * self.BINS_PER_DECADE).floor()
        self.counts += torch.bincount(bins.clamp(0, self.BINS - 1).long(), minlength=self.BINS)
        self.count += positive.numel()

    def quantile_floor(self, q: float) -> float:
        """Lower edge of the bin holding the q-quantile: more than a fraction 1−q of the non-zero
        carriers have ‖h‖² at or above it (q = 0: the smallest carrier's bin)."""
        if not self.count:
            raise ValueError("no non-zero carrier was observed")
        index = int(torch.searchsorted(self.counts.cumsum(0), max(q * self.count, 0.5)).item())
        return 10.0 ** (self.LOG10_MIN + index / self.BINS_PER_DECADE)

    def summary(self) -> dict[str, Any]:
        return {"count": self.count, "null": self.null, "nonfinite": self.nonfinite}


def _fraction(name: str, value: Any, interval: str, inside: Callable[[float], bool]) -> float:
    """``value`` as a float when it is a real number (a numpy or 0-d torch scalar too) for which
    ``inside`` holds; a bool, a string or anything else is a ValueError naming ``interval``."""
    try:
        number = None if isinstance(value, (bool, str, bytes)) else float(value)
    except (TypeError, ValueError, RuntimeError):
        number = None
    if number is None or not inside(number):
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return number


def _exact(name: str) -> str:
    """A site pattern matching ``name`` only (glob when it has no glob characters, else regex)."""
    return name if not any(c in name for c in "*?[") else "re:" + re.escape(name)


def _runner(batches: Iterable[Any] | Callable[[nn.Module], Any]
            ) -> tuple[Callable[[nn.Module], None], dict[str, Any]]:
    """How to drive the host once over the calibration data, and what identifies that data."""
    if callable(batches):
        return batches, {}
    items = list(batches)
    if not items:
        raise ValueError("batches is empty: give at least one batch of calibration inputs")
    digest = hashlib.sha256()
    for batch in items:
        values = batch.values() if isinstance(batch, Mapping) else (
            batch if isinstance(batch, (tuple, list)) else (batch,))
        for value in values:
            if torch.is_tensor(value) or isinstance(value, np.ndarray):
                array = np.ascontiguousarray(torch.as_tensor(value).detach().cpu().numpy())
                digest.update(str((array.dtype, array.shape)).encode())
                digest.update(array.tobytes())

    def run(model: nn.Module) -> None:
        for batch in items:
            if isinstance(batch, Mapping):
                model(**batch)
            elif isinstance(batch, (tuple, list)):
                model(*batch)
            else:
                model(batch)

    return run, {"batches": len(items), "sha256": digest.hexdigest()}


def _record_carriers(model: nn.Module, run: Callable[[nn.Module], Any], probe: Mapping[str, float],
                     arm: str, allow_partial: bool) -> dict[float, CarrierNormProfile]:
    """One pass of ``run`` over the host with every site of ``probe`` patched at its probe τ:
    the carriers' ‖h‖² histogram of each site, keyed by its probe τ."""
    profiles = {tau: CarrierNormProfile() for tau in probe.values()}

    def record(sq: Tensor, tau: float) -> None:
        profile = profiles.get(tau)
        if profile is None:
            raise RetrofitError(f"a presence was computed at τ={tau!r}, which is no site's probe "
                                "τ: a site of this host gates by a τ not its own, so its carriers "
                                "cannot be told apart; calibrate its sites one at a time with "
                                "targets=[site]")
        profile(sq)

    site_tau = {_exact(name): tau for name, tau in probe.items()}
    with torch.no_grad(), retrofitted(model, arm, PROBE_TAU, eps=PROBE_TAU, site_tau=site_tau,
                                      targets=list(site_tau), allow_partial=allow_partial), \
            observe_carrier_norms_by_tau(record):
        run(model)
    return profiles


def calibrate(model: nn.Module, batches: Iterable[Any] | Callable[[nn.Module], Any],
              delta: float = 1e-3, quantile: float = 0.01, *, arm: str = "full-o",
              eps: float = EPS_RETROFIT, targets: Sequence[str] | None = None,
              exclude: Sequence[str] | None = None, allow_partial: bool = False,
              data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A patch spec with one τ per site: ``τ_site = δ/(1−δ) · Q_q(‖h‖²)`` of the site's carriers.

    Args:
        model: the unpatched host (left unpatched on return).
        batches: calibration inputs, each called as ``model(*b)`` (tuple/list), ``model(**b)``
            (mapping) or ``model(b)``; or one callable ``run(model)`` that drives the host over
            the data itself (e.g. a scikit-learn wrapper's fit/predict).
        delta: the largest gate δ a carrier at or above the quantile may get (presence ≥ 1−δ).
        quantile: q, the low quantile of each site's non-zero carriers that must keep ρ ≥ 1−δ.
        arm, eps, targets, exclude, allow_partial: as for :func:`oretrofit.retrofit`.
        data: what the calibration data was (name, rows, hash …), recorded in the spec; for
            tensors in ``batches`` their count and SHA-256 are recorded without it.
    Returns:
        The ordinary patch spec of ``arm`` (``site_tau`` per site, ``tau`` their minimum) with a
        ``calibration`` entry: δ, q, the data, the SHA-256 of the model's weights
        (``weights_sha256``, see :func:`check_calibrated_weights`) and per site its τ, carrier
        quantile and counts. :func:`oretrofit.apply_spec` applies it.
    """
    delta = _fraction("delta", delta, "(0, 1) (e.g. 1e-3)", lambda v: 0.0 < v < 1.0)
    quantile = _fraction("quantile", quantile, "[0, 1) (e.g. 0.01)", lambda v: 0.0 <= v < 1.0)
    run, recorded = _runner(batches)
    plan = plan_retrofit(model, arm, PROBE_TAU, PROBE_TAU, targets=targets, exclude=exclude,
                         allow_partial=allow_partial)
    if not plan.entries:
        raise RetrofitError(f"arm {arm!r} patches no site: there is nothing to calibrate")
    probe = {site.name: PROBE_TAU * (1 + index) for index, (site, _) in enumerate(plan.entries)}
    profiles = _record_carriers(model, run, probe, arm, allow_partial)
    per_site: dict[str, dict[str, Any]] = {}
    for name, tau in probe.items():
        profile = profiles[tau]
        if not profile.count:
            raise RetrofitError(f"site {name!r} saw no non-zero carrier in the calibration data; "
                                "give data that reaches it, or leave it out with exclude= (--exclude)")
        floor = profile.quantile_floor(quantile)
        per_site[name] = {"tau": delta / (1.0 - delta) * floor, "carrier_sq_quantile": floor,
                          **profile.summary()}
    site_tau = {_exact(name): row["tau"] for name, row in per_site.items()}
    applied = retrofit(model, arm, min(site_tau.values()), eps, site_tau=site_tau, targets=targets,
                       exclude=exclude, allow_partial=allow_partial)
    try:
        spec = applied.spec()
    finally:
        applied.revert()
    spec["calibration"] = {"delta": delta, "quantile": quantile, "probe_tau": PROBE_TAU,
                           "data": {**recorded, **dict(data or {})},
                           "weights_sha256": calibrated_weights_digest(model), "sites": per_site,
                           "rule": "tau_site = delta/(1-delta) * quantile_q(|h|^2)"}
    return spec
