"""The TabDPT host: its sites, the retrofit against the vendor's forward, revert, the registry
in this environment (no transformers), and refusals."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import oretrofit
from oretrofit import RetrofitError, retrofit
from oretrofit.hosts.tabdpt.host import TabDPTHost
from oretrofit.tabdpt import checkpoint_config, random_model


def _outputs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, is_cls: bool) -> torch.Tensor:
    with torch.no_grad():
        return model(x, y, is_cls)


@pytest.mark.parametrize("is_cls", [True, False])
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_retrofit_is_the_vendor_forward_and_revert_is_bit_identical(model, batch, arm, is_cls):
    x, y = batch(is_cls)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = _outputs(model, x, y, is_cls)
    handle = retrofit(model, arm, tau=1e-8)
    patched = _outputs(model, x, y, is_cls)
    assert (patched - before).abs().max().item() <= 1e-5
    assert not torch.equal(patched, before)          # the O path ran, not the vendor's
    handle.revert()
    assert torch.equal(_outputs(model, x, y, is_cls), before)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert [type(m).__name__ for m in model.modules() if "_oretrofit" in m.__dict__] == []


@pytest.mark.parametrize("config", [{"n_thinking_rows": 0},
                                    {"min_eval_context": 64, "max_eval_context": 64},
                                    {"nhead": 4, "y_encoder_dim": 4}])
def test_retrofit_is_the_vendor_forward_in_other_configurations(batch, config):
    """No thinking rows; the length scale switched off (β = 1); more heads, narrower targets."""
    model = random_model(checkpoint_config(**config), seed=1)
    x, y = batch(True)
    before = _outputs(model, x, y, True)
    retrofit(model, "full-o", tau=1e-8)
    assert (_outputs(model, x, y, True) - before).abs().max().item() <= 1e-5


def test_the_comparison_sees_a_retrofit_that_changes_the_forward(model, batch):
    x, y = batch(True)
    before = _outputs(model, x, y, True)
    retrofit(model, "full-o", tau=10.0)                # ‖h‖² ≈ 16: presences far below 1
    assert (_outputs(model, x, y, True) - before).abs().max().item() > 1e-2


def test_sites_are_every_layers_norm_target_attention_and_ffn(model):
    sites = TabDPTHost().sites(model)
    assert [(s.name, s.kind) for s in sites] == [
        (f"icl.{k}.{name}", kind) for k in range(2)
        for name, kind in (("norm", "norm"), ("te", "inject"), ("attn", "attention"),
                           ("ffn", "ffn"))]
    plan = oretrofit.plan_retrofit(model, "oa")
    assert (plan.host, plan.hosts) == ("tabdpt", ["tabdpt"])
    assert [s.name for s, _ in plan.entries] == ["icl.0.attn", "icl.1.attn"]
    assert len(oretrofit.plan_retrofit(model, "full-o").entries) == 8


def test_the_registry_takes_a_tabdpt_model_where_transformers_cannot_import(model, monkeypatch):
    """Where ``import transformers`` fails (as in the tabdpt environment, whose huggingface-hub
    is older than transformers 5 needs), the registry lists every host and a TabDPT model is
    retrofitted: no host needs transformers to match or patch it."""
    monkeypatch.setitem(sys.modules, "transformers", None)      # any import of it now fails
    names = [h.name for h in oretrofit.registered_hosts()]
    assert sorted(names) == ["mitra", "tabdpt", "tabicl", "tabpfn-v3", "torch.nn", "transformers"]
    assert retrofit(model, "full-o").plan.host == "tabdpt"


def test_a_module_the_host_does_not_know_is_refused_by_path(model):
    model.transformer_encoder[1].extra = nn.Conv1d(1, 1, 1)
    with pytest.raises(RetrofitError, match=r"transformer_encoder\.1\.extra of type "
                                            r"torch\.nn\.modules\.conv\.Conv1d"):
        retrofit(model, "full-o")
    assert not any("_oretrofit" in m.__dict__ for m in model.modules())


def test_an_untested_release_is_refused_by_name(model, monkeypatch):
    from oretrofit.hosts.tabdpt import releases
    monkeypatch.setattr(releases, "installed_version", lambda: "1.2.0")
    with pytest.raises(RetrofitError, match=r"tabdpt 1\.2\.0 is not supported .* "
                                            r"pip install 'tabdpt==1\.3\.1'"):
        retrofit(model, "oa")


def test_a_saved_spec_retrofits_a_fresh_model_the_same(model, batch, tmp_path):
    x, y = batch(True)
    handle = retrofit(model, "full-o", tau=1e-7, site_tau={"icl.1.*": 1e-6})
    path = handle.save_spec(tmp_path / "spec.json")
    fresh = random_model(checkpoint_config(), seed=0)
    again = oretrofit.apply_spec(fresh, oretrofit.read_spec(path))
    assert again.spec()["host_versions"] == {"tabdpt": "1.3.1"}
    assert [s.name for s, _ in again.plan.entries] == [s.name for s, _ in handle.plan.entries]
    assert torch.equal(_outputs(fresh, x, y, True), _outputs(model, x, y, True))
