"""The patch registry on a toy host: plan, apply all-or-nothing, revert bit-identically, specs."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from oretrofit import (Retrofit, RetrofitError, Site, SiteConfig, apply_spec, o_gate, plan_retrofit,
                       presence, register_host, registered_hosts, retrofit, retrofitted)
from oretrofit._surgery import host as _host, registry as _registry
from oretrofit._surgery.patching import set_site, site_config


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.norm, self.ffn = nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.norm(self.attn(x)))


class BrokenToy(Toy):
    """Same modules; its host has a fourth site whose apply fails."""


class Gate:
    """Toy O-mixin: the module's output times the presence of its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return o_gate(presence(x, site_config(self, "gate").tau), super().forward(x))


def gate_site(name: str, kind: str, module: nn.Module) -> Site:
    return Site(name, kind, carrier="input", apply=lambda cfg: set_site(module, Gate, "gate", cfg),
                receivers=lambda tau: {"cls": float(tau)})


@dataclass
class ToyHost:
    name: str
    model_class: type

    def matches(self, model: nn.Module) -> bool:
        return type(model) is self.model_class

    def check(self, model: nn.Module) -> None:
        if getattr(model, "unsupported", False):
            raise RetrofitError("this toy is marked unsupported")

    def sites(self, model: nn.Module) -> list[Site]:
        sites = [gate_site("block.attn", "attention", model.attn),
                 gate_site("block.norm", "norm", model.norm),
                 gate_site("block.ffn", "ffn", model.ffn)]
        if self.model_class is BrokenToy:
            def boom(cfg: SiteConfig):
                raise RuntimeError("site apply failed")
            sites.append(Site("block.zz", "ffn", "input", boom))
        return sites

    def version(self) -> dict[str, str]:
        return {"toy": "1.0"}


@pytest.fixture(autouse=True)
def toy_hosts():
    hosts = [register_host(ToyHost("toy-test-host", Toy)),
             register_host(ToyHost("broken-toy-test-host", BrokenToy))]
    yield hosts
    for host in hosts:
        _host._HOSTS.remove(host)


@pytest.fixture
def x() -> torch.Tensor:
    x = torch.randn(3, 5, 4)
    x[:, 1] = 0.0
    return x


def patched_names(model: nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if "_oretrofit" in m.__dict__}


@pytest.mark.parametrize("arm, expected", [("base", set()), ("oa", {"attn"}),
                                           ("full-o", {"attn", "norm", "ffn"})])
def test_arm_selects_site_kinds(arm: str, expected: set[str]) -> None:
    model = Toy()
    r = retrofit(model, arm, tau=1.0)
    assert patched_names(model) == expected
    assert len(r.report()) == len(expected)
    r.revert()
    assert patched_names(model) == set()


def test_revert_is_bit_identical(x: torch.Tensor) -> None:
    model = Toy()
    before = model(x)
    r = retrofit(model, "full-o", tau=1.0)
    patched = model(x)
    assert not torch.equal(patched, before)
    assert torch.equal(patched[:, 1], torch.zeros_like(patched[:, 1]))
    assert r.revert() is model and r.reverted
    assert torch.equal(model(x), before)
    assert all(type(m) in (Toy, nn.Linear, nn.LayerNorm) for m in model.modules())
    assert _registry._ACTIVE not in model.__dict__


def test_failing_site_leaves_the_model_untouched(x: torch.Tensor) -> None:
    model = BrokenToy()
    before = model(x)
    with pytest.raises(RuntimeError, match="site apply failed"):
        retrofit(model, "full-o", tau=1.0)
    assert patched_names(model) == set() and _registry._ACTIVE not in model.__dict__
    assert torch.equal(model(x), before)
    assert len(retrofit(model, "oa", tau=1.0).report()) == 1     # still patchable afterwards


def test_patch_twice_and_revert_twice_raise() -> None:
    model = Toy()
    r = retrofit(model, "oa")
    with pytest.raises(RetrofitError, match="already retrofitted"):
        retrofit(model, "full-o")
    r.revert()
    with pytest.raises(RetrofitError, match="already reverted"):
        r.revert()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(arm="everything"), RetrofitError, "unknown arm 'everything'; choose one of base, oa, full-o"),
    (dict(tau=0.0), ValueError, "tau"),
    (dict(tau=-1e-8), ValueError, "tau"),
    (dict(eps=-1e-6), ValueError, "eps"),
    (dict(targets=["nothing.*"]), RetrofitError, r"targets pattern .nothing\.\*. matches no site"),
    (dict(exclude=["block.*"]), RetrofitError, "no site matched"),
    (dict(site_tau={"other.*": 1.0}), RetrofitError, "matches no planned site"),
    (dict(site_tau={"block.*": 0.0}), ValueError, "site_tau"),
    (dict(targets=[]), RetrofitError, r"targets=\[\] keeps no site.*pass targets=None"),
    (dict(exclude="block.*"), RetrofitError, r"exclude is a list of site patterns, got the "
                                             r"string 'block\.\*'.*exclude=\['block\.\*'\]"),
])
def test_bad_requests_are_refused_before_anything_changes(kwargs, error, message) -> None:
    model = Toy()
    with pytest.raises(error, match=message):
        retrofit(model, **{"arm": "full-o", **kwargs})
    assert patched_names(model) == set()


def test_unknown_model_and_failed_check_are_refused() -> None:
    with pytest.raises(RetrofitError, match="no registered host matches Sequential"):
        retrofit(nn.Sequential(nn.Linear(2, 2)))
    model = Toy()
    model.unsupported = True
    with pytest.raises(RetrofitError, match="marked unsupported"):
        retrofit(model)
    assert patched_names(model) == set()


def test_duplicate_host_name_is_refused() -> None:
    with pytest.raises(RetrofitError, match="already registered"):
        register_host(ToyHost("toy-test-host", Toy))


def test_site_tau_globs_and_regex_first_match_wins() -> None:
    model = Toy()
    r = retrofit(model, "full-o", tau=1e-8,
                 site_tau={"block.a*": 0.5, "re:block\\.(norm|attn)": 2.0})
    taus = {row["site"]: row["tau"] for row in r.report()}
    assert taus == {"block.attn": 0.5, "block.norm": 2.0, "block.ffn": 1e-8}
    assert site_config(model.norm, "gate").tau == 2.0
    assert r.report()[0] == {"site": "block.attn", "kind": "attention", "carrier": "input",
                             "tau": 0.5, "receivers": {"cls": 0.5}, "state": "patched"}


def test_targets_and_exclude() -> None:
    model = Toy()
    r = retrofit(model, "full-o", targets=["block.*"], exclude=["re:.*ffn"])
    assert [row["site"] for row in r.report()] == ["block.attn", "block.norm"]
    assert patched_names(model) == {"attn", "norm"}


def test_plan_does_not_touch_the_model() -> None:
    model = Toy()
    plan = plan_retrofit(model, "full-o", tau=0.1)
    assert [s.name for s, _ in plan.entries] == ["block.attn", "block.norm", "block.ffn"]
    assert {c.tau for _, c in plan.entries} == {0.1}
    assert patched_names(model) == set()


def test_state_dict_keys_unchanged_and_strict_loading_both_ways(x: torch.Tensor) -> None:
    model, original = Toy(), Toy()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    r = retrofit(model, "full-o", tau=1.0)
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    model.load_state_dict(original.state_dict(), strict=True)
    fresh = Toy()
    fresh.load_state_dict(model.state_dict(), strict=True)
    r.revert()
    assert torch.equal(model(x), original(x))


def test_spec_round_trip(tmp_path, x: torch.Tensor) -> None:
    model = Toy()
    r = retrofit(model, "full-o", tau=0.3, eps=1e-5, site_tau={"block.ffn": 0.7},
                 exclude=["block.norm"])
    spec, patched = r.spec(), model(x)
    assert spec["host"] == "toy-test-host" and spec["host_versions"] == {"toy": "1.0"}
    assert spec["sites"] == ["block.attn", "block.ffn"]
    path = r.save_spec(tmp_path / "spec.json")
    assert json.loads(path.read_text()) == spec
    r.revert()
    for source in (path, spec):
        again = apply_spec(model, source)
        assert isinstance(again, Retrofit) and again.spec() == spec
        assert torch.equal(model(x), patched)
        again.revert()
    with pytest.raises(RetrofitError, match="schema_version"):
        apply_spec(model, {**spec, "schema_version": 99})


def test_retrofitted_context_manager_reverts_on_exit_and_on_error(x: torch.Tensor) -> None:
    model = Toy()
    before = model(x)
    with retrofitted(model, "oa", tau=1.0) as r:
        assert patched_names(model) == {"attn"} and "active" in repr(r)
    assert r.reverted and torch.equal(model(x), before)
    with pytest.raises(KeyError):
        with retrofitted(model, "full-o", tau=1.0):
            raise KeyError("boom")
    assert patched_names(model) == set() and torch.equal(model(x), before)


def test_hosts_are_matched_most_specific_first() -> None:
    """User hosts default to specificity 10: after TabPFN v3 (20), before the torch.nn fallback
    (0); ``first=True`` wins among equals, a higher specificity over everything below it."""
    names = [h.name for h in registered_hosts()]
    assert names.index("tabpfn-v3") < names.index("toy-test-host") < names.index("torch.nn")
    assert names[-1] == "torch.nn"
    front = register_host(ToyHost("first-toy-test-host", Toy), first=True)
    top = ToyHost("top-toy-test-host", Toy)
    top.specificity = 30
    register_host(top)
    try:
        names = [h.name for h in registered_hosts()]
        assert names[0] == "top-toy-test-host"
        assert names.index("first-toy-test-host") < names.index("toy-test-host")
        assert retrofit(Toy(), "oa").spec()["host"] == "top-toy-test-host"
    finally:
        _host._HOSTS.remove(front)
        _host._HOSTS.remove(top)


class Wrapped(nn.Module):
    """A toy backbone (its host owns ``toy``) next to a head for the torch.nn fallback."""

    def __init__(self) -> None:
        super().__init__()
        self.toy, self.head = Toy(), nn.MultiheadAttention(4, 2, batch_first=True)
        self.extra = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.toy(x)
        return self.extra(self.head(h, h, h, need_weights=False)[0])


@dataclass
class OwningToyHost(ToyHost):
    """Matches a ``Toy`` anywhere inside a model and owns only that subtree."""

    def matches(self, model: nn.Module) -> bool:
        return any(type(m) is Toy for m in model.modules())

    def owned(self, model: nn.Module) -> list[str]:
        return [name for name, m in model.named_modules() if type(m) is Toy]

    def sites(self, model: nn.Module) -> list[Site]:
        return [s for name in self.owned(model)
                for s in (gate_site(f"{name}.attn", "attention", model.get_submodule(name).attn),)]

    def uncovered(self, model: nn.Module) -> list[str]:
        return [f"{name}.ffn (Linear)" for name in self.owned(model)]


def test_hosts_compose_by_owned_subtrees(x: torch.Tensor) -> None:
    host = register_host(OwningToyHost("owning-toy-test-host", Toy))
    try:
        model = Wrapped()
        with pytest.raises(RetrofitError) as err:
            retrofit(model, "full-o")
        assert ("toy.ffn (Linear) [host owning-toy-test-host], extra (Linear) [host torch.nn]"
                in str(err.value))
        plan = plan_retrofit(model, "full-o", allow_partial=True)
        assert plan.hosts == ["owning-toy-test-host", "torch.nn"]
        assert [s.name for s, _ in plan.entries] == ["toy.attn", "head"]
        assert plan.uncovered == ["toy.ffn (Linear)", "extra (Linear)"]
        r = retrofit(model, "full-o", allow_partial=True)
        assert r.spec()["host_versions"] == {"toy": "1.0", "torch": torch.__version__}
        assert patched_names(model) == {"toy.attn", "head"}
        r.revert()
    finally:
        _host._HOSTS.remove(host)
