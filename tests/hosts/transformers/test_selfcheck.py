"""The self-check (oretrofit/hosts/transformers/selfcheck.py): on a transformers release newer
than every tested one, a retrofit is admitted when a tiny random copy of the model's
architecture holds the contracts (with a notice and a record on disk, measured once), refused
naming the contract when it does not; older and blocked releases are still refused by the list.
The installed release is faked (transformers.__version__)."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from oretrofit import RetrofitError, __version__, retrofit, retrofitted  # noqa: E402
from oretrofit.hosts.transformers import check as checks  # noqa: E402
from oretrofit.hosts.transformers import releases, selfcheck  # noqa: E402
from oretrofit.hosts.transformers.selfcheck import UntestedReleaseWarning  # noqa: E402
from hosts.transformers import zoo  # noqa: E402

NEWER = "5.99.0"
LLAMA, BERT = (next(a for a in zoo.ARCHITECTURES if a.name == name) for name in ("Llama", "BERT"))


def _installed(monkeypatch, version: str) -> None:
    # after the models are built: building one may put a new transformers module object in
    # sys.modules, and the host reads the release from there
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    assert releases.transformers_version() == version


def _outputs(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(14).reshape(2, 7) % 50 + 1
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("arch", [LLAMA, BERT], ids=lambda a: a.name)
def test_a_newer_release_admits_a_model_whose_tiny_copy_holds_the_contracts(monkeypatch, fresh,
                                                                            arch):
    model = zoo.build(arch)
    base = _outputs(model)
    _installed(monkeypatch, NEWER)
    assert releases.untested_newer(NEWER) and not releases.admits(NEWER)
    with pytest.warns(UntestedReleaseWarning, match=rf"transformers {NEWER} is newer .* "
                      rf"{type(model).__name__} passed the self-check on a tiny random copy"):
        with retrofitted(model, "full-o", 1e-8) as r:
            assert r.report() and not torch.equal(_outputs(model), base)
    assert torch.equal(_outputs(model), base)
    records = list((fresh / "selfcheck").glob("*.json"))
    assert [p.name for p in records] == [
        f"{type(model).__name__}-sdpa-transformers{NEWER}-oretrofit{__version__}.json"]
    record = json.loads(records[0].read_text())
    assert record["failed"] == [] and record["key"][2:] == [NEWER, __version__]
    assert record["key"][0].endswith(type(model).__qualname__) and record["shrink"] == "tiny"
    assert max(record["agreement"].values()) <= checks.LIMITS["agreement"]
    assert record["null_insertion"]["inserted_max_abs"] == 0


def test_the_record_is_measured_once_then_read(monkeypatch, fresh):
    model = zoo.build(LLAMA)
    _installed(monkeypatch, NEWER)
    with pytest.warns(UntestedReleaseWarning):
        retrofit(model, "oa").revert()
    # a new process: nothing in memory, the record on disk; rebuilding would fail the retrofit
    monkeypatch.setattr(selfcheck, "_RESULTS", {})

    def rebuilt(*args, **kwargs):
        raise AssertionError("the tiny model was built again")

    monkeypatch.setattr(selfcheck, "tiny_model", rebuilt)
    retrofit(model, "full-o", 1e-6).revert()                    # read, and noticed once only
    record = selfcheck.record_path(selfcheck._key(model))
    record.write_text("{not json")                               # unreadable: measured again
    monkeypatch.setattr(selfcheck, "_RESULTS", {})
    with pytest.raises(RetrofitError, match="cannot run there: no tiny model of its config "
                                            "builds.*the tiny model was built again"):
        retrofit(model, "oa")


def test_a_model_whose_tiny_copy_breaks_a_contract_is_refused_naming_it(monkeypatch, fresh):
    model = zoo.build(BERT)
    _installed(monkeypatch, NEWER)
    measured = checks.agreement

    def agreement(model, inputs, arm, *settings):      # as if oa disagreed there
        found = measured(model, inputs, arm, *settings)
        return {**found, "relative_max_diff": 0.25} if arm == "oa" else found

    monkeypatch.setattr(checks, "agreement", agreement)
    with pytest.raises(RetrofitError) as error:
        retrofit(model, "full-o", 1e-6)
    message = str(error.value)
    assert message.startswith(f"transformers {NEWER} is newer than every release the "
                              "transformers host is tested on")
    assert "BertModel fails the self-check there" in message
    assert "agreement (oa: relative difference 0.25 > 0.0001)" in message
    assert message.endswith(f'pip install "{releases.requirement()}"')
    assert not [m for m in model.modules() if type(m).__module__ == "oretrofit._surgery.patching"]
    monkeypatch.setattr(checks, "agreement", measured)       # the record keeps the verdict
    with pytest.raises(RetrofitError, match="fails the self-check"):
        retrofit(model, "oa")


@pytest.mark.parametrize("version", ["5.4.0", "4.53.2", "4.52.4"])
def test_older_and_blocked_releases_are_still_refused_by_the_list(monkeypatch, fresh, version):
    model = zoo.build(BERT)
    _installed(monkeypatch, version)
    assert not releases.untested_newer(version)
    with pytest.raises(RetrofitError, match=rf"^transformers {version} is not supported"):
        retrofit(model, "full-o", 1e-6)
    assert not (fresh / "selfcheck").exists()


def test_a_newer_release_refuses_a_model_the_host_cannot_cover_without_a_self_check(
        monkeypatch, fresh):
    arch = next(a for a in zoo.REFUSED if a.model_type == "mamba")
    model = zoo.build(arch)
    _installed(monkeypatch, NEWER)
    with pytest.raises(RetrofitError, match="the transformers host cannot cover"):
        retrofit(model, "full-o", 1e-6)
    assert not (fresh / "selfcheck").exists()
