"""Per-site τ variants of an O arm: a saved (calibrated) patch spec, or one site family gated at a
stress τ while the arm's other sites stay near identity.

A variant of arm ``a`` runs ``make_regressor(arm=a, tau=tau, site_tau=site_tau, eps=eps)``: each
site takes the τ of the first ``site_tau`` pattern naming it, else ``tau``. It adds one cell per
(dataset, seed) to the matrix, compared with base over the same seeds like any τ.

* ``--tau-spec FILE`` (:func:`spec_variant`): the spec's own ``tau``, ``eps`` and ``site_tau``.
  A calibrated spec (``oretrofit calibrate``) is named ``calibrated-d<δ>-q<q>``; another spec
  ``spec-<file stem>``.
* ``--ablate-sites FAMILIES`` (:func:`ablation_variants`): for family F of arm a,

      τ_site = stress τ   for every site of a in F,
      τ_site = tau        (the near-identity τ) for every other site of a,

  named ``ablate-<F>``. A family is a site kind (``attention``, ``norm``, ``ffn``, ``inject``) or a
  site-name prefix ``P.*`` (``fde.*``, ``col.*``, ``icl.*``, ``te.*`` on TabPFN v3).

A variant's :meth:`Variant.record` (the full ``site_tau``, and a spec's SHA-256) is bound in the
run folder's ``run.json`` under ``<arm>/<name>``, so resuming with a different definition under
the same name is refused (:meth:`RunFolder.bind_variants`); a record edited afterwards (its
kind, arm, τ, or a δ/q or family its name no longer follows from) is refused when the folder is
read (:func:`check_record`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .._operators.presence import check_eps, check_positive
from .._files.provenance import sha256_file
from .._surgery.registry import ARMS, KINDS, RetrofitError, plan_retrofit, read_spec
from .._surgery.serialize import calibrated_weights_digest

__all__ = ["Variant", "check_record", "spec_variant", "ablation_variants", "check_variants",
           "site_families", "parse_families", "arm_sites", "checkpoint_arm_sites"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
CALIBRATED, ABLATION, SPEC = "calibrated", "ablation", "spec"


@dataclass(frozen=True)
class Variant:
    """One per-site τ configuration of an O arm (module docstring)."""

    name: str
    arm: str
    tau: float
    site_tau: dict[str, float] = field(default_factory=dict)
    eps: float | None = None                 # None: the run's --eps
    kind: str = SPEC                         # calibrated | ablation | spec
    details: dict[str, Any] = field(default_factory=dict)   # spec SHA-256, δ, q / family, sites
    weights_sha256: str | None = field(default=None, compare=False)  # a calibrated spec's host

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"variant name {self.name!r} must be letters, digits, '.', '_', '+' "
                             "or '-' (it becomes part of each cell's file name)")
        if self.arm not in ARMS or self.arm == "base":
            raise ValueError(f"variant {self.name!r}: arm must be oa or full-o, got {self.arm!r}")
        check_positive(f"variant {self.name!r} tau", self.tau)
        for pattern, value in self.site_tau.items():
            check_positive(f"variant {self.name!r} site_tau[{pattern!r}]", value)
        if self.eps is not None:
            check_eps(self.eps, f"variant {self.name!r} eps")

    @property
    def key(self) -> str:
        """``<arm>/<name>``: how run.json and the tables name it."""
        return f"{self.arm}/{self.name}"

    def record(self) -> dict[str, Any]:
        """What run.json binds: a resumed run must define the variant identically."""
        return {"kind": self.kind, "arm": self.arm, "tau": self.tau, "eps": self.eps,
                "site_tau": dict(self.site_tau), **self.details}

    def median_site_tau(self) -> float:
        """The median of the per-site τ (``tau`` when no site has its own)."""
        values = sorted(self.site_tau.values()) or [self.tau]
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else math.sqrt(values[middle - 1] * values[middle])


def _read_spec(path: Path) -> tuple[dict[str, Any], str]:
    """The patch spec at ``path`` (checked by :func:`oretrofit.read_spec`) and its SHA-256."""
    try:
        return dict(read_spec(path)), sha256_file(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tau-spec {path}: {exc}") from None


def _calibrated_name(delta: Any, quantile: Any) -> str:
    """``calibrated-d<δ>-q<q>`` of a calibration's δ ∈ (0, 1) and q ∈ [0, 1) (else an error)."""
    for what, value, low in (("delta", delta, 0.0), ("quantile", quantile, None)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                (value > low if low is not None else value >= 0.0) and value < 1.0):
            raise ValueError(f"its calibration record's {what} must be a number in "
                             f"{'(0, 1)' if low is not None else '[0, 1)'}, got {value!r}")
    return f"{CALIBRATED}-d{delta:g}-q{quantile:g}"


def _ablation_name(family: str) -> str:
    return "ablate-" + family.removesuffix(".*")


def spec_variant(path: str | Path, arms: Sequence[str]) -> Variant:
    """The variant running the patch spec at ``path`` (its arm must be an O arm among ``arms``)."""
    spec, sha256 = _read_spec(Path(path))
    arm = spec["arm"]
    if arm not in ("oa", "full-o"):
        raise ValueError(f"--tau-spec {path} is a spec of arm {arm!r}; a τ variant needs arm oa "
                         "or full-o")
    if arm not in arms:
        raise ValueError(f"--tau-spec {path} is a spec of arm {arm}, which --arms "
                         f"({','.join(arms)}) does not run; add {arm} to --arms")
    if spec.get("targets") or spec.get("exclude"):
        raise ValueError(f"--tau-spec {path} restricts its sites (targets/exclude); the matrix "
                         "runs every site of the arm, so use a spec without targets or exclude")
    site_tau = spec.get("site_tau") or {}
    calibration = spec.get("calibration")
    details: dict[str, Any] = {"spec_sha256": sha256}
    if calibration is not None:
        data = calibration.get("data") or {}
        details.update(delta=calibration.get("delta"), quantile=calibration.get("quantile"),
                       checkpoint_sha256=data.get("checkpoint_sha256"))
        try:
            name = _calibrated_name(details["delta"], details["quantile"])
        except ValueError as exc:
            raise ValueError(f"--tau-spec {path}: {exc}; re-create it with `oretrofit "
                             "calibrate --out`") from None
        kind = CALIBRATED
    else:
        name, kind = "spec-" + re.sub(r"[^A-Za-z0-9._+-]", "-", Path(path).stem), SPEC
    return Variant(name, arm, float(spec["tau"]), {str(k): float(v) for k, v in site_tau.items()},
                   float(spec["eps"]), kind, details,
                   calibration.get("weights_sha256") if calibration is not None else None)


def check_record(key: str, record: Any) -> None:
    """Refuse a variant record of ``run.json`` (``<arm>/<name>`` -> :meth:`Variant.record`) that
    is not one a run could have bound: a wrong type or value, an unknown kind, or a name that
    does not follow from it (a calibrated δ/q or an ablated family edited afterwards)."""
    if not isinstance(record, Mapping):
        raise ValueError(f"its record must be an object, got {record!r:.60}")
    own = ("kind", "arm", "tau", "eps", "site_tau")
    missing = [k for k in own if k not in record]
    if missing:
        raise ValueError(f"its record lacks {', '.join(missing)}")
    if not isinstance(record["site_tau"], Mapping):
        raise ValueError(f"its site_tau must be an object, got {record['site_tau']!r:.60}")
    arm, _, name = key.partition("/")
    details = {k: v for k, v in record.items() if k not in own}
    variant = Variant(name, record["arm"], record["tau"], dict(record["site_tau"]),
                      record["eps"], record["kind"], details)
    if variant.key != key:
        raise ValueError(f"its record names arm {record['arm']!r}")
    kind = record["kind"]
    if kind == CALIBRATED:
        expected = _calibrated_name(record.get("delta"), record.get("quantile"))
    elif kind == ABLATION:
        family, stress = record.get("family"), record.get("stress_tau")
        if not isinstance(family, str) or set(record["site_tau"].values()) != {stress}:
            raise ValueError("its family and stress_tau do not match its site_tau")
        expected = _ablation_name(family)
    elif kind == SPEC:
        expected = name if name.startswith("spec-") else "spec-<file stem>"
    else:
        raise ValueError(f"its kind {kind!r} is none of {CALIBRATED}, {ABLATION}, {SPEC}")
    if name != expected:
        raise ValueError(f"its record defines variant {expected}, not {name}")


def site_families(sites: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Every family of ``(site name, kind)`` pairs: each kind, and ``P.*`` for each first
    name component P, mapped to the site names it holds (in the host's order)."""
    families: dict[str, list[str]] = {}
    for name, kind in sites:
        families.setdefault(kind, []).append(name)
        families.setdefault(name.split(".")[0] + ".*", []).append(name)
    return families


def parse_families(text: str) -> tuple[str, ...]:
    """``"fde.*,norm"`` -> ("fde.*", "norm"); empty entries dropped, repeats refused."""
    families = tuple(f.strip() for f in text.split(",") if f.strip())
    repeated = sorted({f for f in families if families.count(f) > 1})
    if repeated:
        raise ValueError(f"--ablate-sites lists {', '.join(repeated)} more than once")
    if not families:
        raise ValueError("--ablate-sites needs at least one family, e.g. fde.*,icl.*,norm")
    return families


def ablation_variants(arm_sites: Mapping[str, Sequence[tuple[str, str]]], arms: Sequence[str],
                      families: Sequence[str], tau: float, stress_tau: float) -> list[Variant]:
    """One variant per (O arm of ``arms``, family): the family's sites at ``stress_tau``, the
    arm's other sites at ``tau``. ``arm_sites`` maps every O arm of the host to its planned
    ``(site, kind)`` pairs (:func:`arm_sites`).

    An unknown family (no kind, no name prefix of the host), or one that matches no site of one
    of ``arms``, is an error naming the families there are."""
    check_positive("--stress-tau", stress_tau)
    known = sorted({f for sites in arm_sites.values() for f in site_families(sites)} | set(KINDS))
    unknown = [f for f in families if f not in known]
    if unknown:
        raise ValueError(f"unknown site famil{'y' if len(unknown) == 1 else 'ies'} "
                         f"{', '.join(unknown)}; families are site kinds or name prefixes: "
                         f"{', '.join(known)}")
    variants = []
    for arm in (a for a in arms if a != "base"):
        found = site_families(arm_sites[arm])
        for family in families:
            if family not in found:
                raise ValueError(f"site family {family} matches no site of arm {arm} (its "
                                 f"families: {', '.join(found)}); ablate it in a run whose "
                                 "--arms leave that arm out")
            name = _ablation_name(family)
            variants.append(Variant(name, arm, tau, {s: stress_tau for s in found[family]},
                                    kind=ABLATION, details={"family": family,
                                                            "stress_tau": stress_tau}))
    return variants


def check_variants(model: Any, variants: Sequence[Variant], eps: float,
                   checkpoint_sha256: str) -> None:
    """Plan every variant on the host ``model`` (unchanged) before anything runs: a site pattern
    that matches no site, or a spec calibrated on another checkpoint or other weights, is an
    error."""
    weights = None
    for variant in variants:
        made_on = variant.details.get("checkpoint_sha256")
        if made_on and made_on != checkpoint_sha256:
            raise ValueError(f"variant {variant.key} was calibrated on checkpoint "
                             f"{made_on[:12]}…, this run uses {checkpoint_sha256[:12]}…; "
                             "calibrate on this run's checkpoint (oretrofit calibrate "
                             "--model-path ...)")
        if variant.weights_sha256 is not None:
            weights = weights or calibrated_weights_digest(model)
            if variant.weights_sha256 != weights:
                raise ValueError(f"variant {variant.key} was calibrated on other weights (SHA-256 "
                                 f"{variant.weights_sha256[:12]}…) than this run's host "
                                 f"({weights[:12]}…); calibrate on this run's checkpoint "
                                 "(oretrofit calibrate --model-path ...)")
        try:
            plan_retrofit(model, variant.arm, variant.tau, eps if variant.eps is None else variant.eps,
                          site_tau=variant.site_tau)
        except RetrofitError as exc:
            raise ValueError(f"variant {variant.key} does not fit this host: {exc}") from None


def arm_sites(model: Any) -> dict[str, list[tuple[str, str]]]:
    """Each O arm's planned ``(site name, kind)`` pairs on ``model`` (left unchanged)."""
    return {arm: [(site.name, site.kind) for site, _ in plan_retrofit(model, arm).entries]
            for arm in ARMS if arm != "base"}


def checkpoint_arm_sites(model_path: str | Path | None) -> dict[str, list[tuple[str, str]]]:
    """:func:`arm_sites` of the TabPFN v3 host built from ``model_path`` (as ``regress`` does)."""
    from ..tabpfn import build_model, load_checkpoint, resolve_model_path
    return arm_sites(build_model(load_checkpoint(resolve_model_path(model_path)))[0])
