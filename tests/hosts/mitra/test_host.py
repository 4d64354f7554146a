"""The Mitra host: its sites, the retrofit against the vendor's forward, revert, and refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import oretrofit
from oretrofit import RetrofitError, retrofit
from oretrofit.hosts.mitra.host import MitraHost


def _outputs(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        return model(*(t.clone() for t in inputs))


def _task(model: nn.Module) -> str:
    return model.task.name.lower()


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_retrofit_is_the_vendor_forward_and_revert_is_bit_identical(model, cells, arm):
    inputs = cells(_task(model))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = _outputs(model, inputs)
    handle = retrofit(model, arm, tau=1e-8)
    assert (_outputs(model, inputs) - before).abs().max().item() <= 1e-5
    handle.revert()
    assert torch.equal(_outputs(model, inputs), before)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert [m for m in model.modules() if "_oretrofit" in m.__dict__] == []


def test_the_comparison_sees_a_retrofit_that_changes_the_forward(model, cells):
    inputs = cells(_task(model))
    before = _outputs(model, inputs)
    retrofit(model, "full-o", tau=10.0)                # ‖h‖² of order 1: presences far below 1
    assert (_outputs(model, inputs) - before).abs().max().item() > 1e-2


def test_sites_are_every_layers_norms_attentions_and_ffns(model):
    names = [(s.name, s.kind) for s in MitraHost().sites(model)]
    assert names == [(f"{axis}.{k}.{name}", kind) for k in range(2)
                     for axis in ("rows", "features")
                     for name, kind in (("norm", "norm"), ("attn", "attention"), ("ffn", "ffn"))
                     ] + [("out_norm", "norm")]
    assert [s.name for s, _ in oretrofit.plan_retrofit(model, "oa").entries] == [
        f"{axis}.{k}.attn" for k in range(2) for axis in ("rows", "features")]
    assert oretrofit.plan_retrofit(model, "full-o").host == "mitra"


def test_the_flash_attn_path_is_refused(model):
    model.use_flash_attn = True
    with pytest.raises(RetrofitError, match="flash-attn path"):
        retrofit(model, "full-o")


def test_a_module_the_host_does_not_know_is_refused_by_path(model):
    model.layers[1].extra = nn.GELU()
    with pytest.raises(RetrofitError, match=r"module layers\.1\.extra of type "
                                            r"torch\.nn\.modules\.activation\.GELU"):
        retrofit(model, "full-o")


def test_the_host_records_the_release_and_task(model):
    from importlib.metadata import version
    assert MitraHost().version(model) == {"autogluon.tabular": version("autogluon.tabular"),
                                          "task": _task(model)}
