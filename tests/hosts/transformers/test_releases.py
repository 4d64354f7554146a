"""The transformers host's version gate is results/transformers-compat.md's passing rows."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from oretrofit import RetrofitError
from oretrofit.hosts.transformers import releases as common

ROOT = Path(__file__).resolve().parents[3]


def _rows() -> dict[str, str]:
    """release -> outcome (``pass``/``FAIL``) of the compat table."""
    lines = (ROOT / "results" / "transformers-compat.md").read_text().splitlines()
    return {cells[1].strip(): cells[2].strip() for line in lines
            if re.match(r"\| \d+\.\d+\.\d+ \|", line) for cells in [line.split("|")]}


def test_the_gate_is_the_compat_tables_passing_rows():
    rows = _rows()
    passing = [release for release, outcome in rows.items() if outcome == "pass"]
    assert tuple(passing) == common.TESTED_RELEASES
    assert all(common.admits(release) == (outcome == "pass") for release, outcome in rows.items())


def test_patch_releases_of_the_newest_tested_minor_are_admitted_and_nothing_newer():
    oldest, below = common.supported_range()
    major, minor = map(int, below.split("."))
    assert common.admits(oldest) and common.admits(f"{major}.{minor - 1}.99")
    for outside in (f"{below}.0", f"{below}.0.dev0", f"{major + 1}.0.0", "4.52.4", "not-a-version"):
        assert not common.admits(outside), outside


def test_the_installed_release_is_admitted():
    """CI installs the main environment's transformers: the gate must let it through."""
    assert common.admits(common.transformers_version())


@pytest.mark.parametrize("version, why", [
    # the newest patch release of each minor with the attention interface but no mask interface
    *((release, "has no AttentionMaskInterface")
      for release in ("4.48.3", "4.49.0", "4.50.3", "4.51.3", "4.52.4")),
    ("5.4.0", "cannot build the configs")])
def test_a_refused_release_is_named_with_where_support_starts_why_and_the_fix(monkeypatch, version,
                                                                              why):
    monkeypatch.setattr(common, "transformers_version", lambda: version)
    with pytest.raises(RetrofitError) as err:
        common.check_transformers()
    message = str(err.value)
    assert f"transformers {version} is not supported" in message and why in message
    assert common.supported_text() in message
    assert "results/" not in message                      # no file an installed wheel lacks
    assert f'pip install "{common.requirement()}"' in message
    if Version(version) < Version(common.TESTED_RELEASES[0]):
        assert f"support starts at {common.TESTED_RELEASES[0]}" in message


def test_a_release_newer_than_every_tested_one_is_left_to_the_self_check(monkeypatch):
    oldest, below = common.supported_range()
    major, minor = map(int, below.split("."))
    for newer in (f"{below}.0", f"{below}.0.dev0", f"{major}.{minor + 3}.1", f"{major + 1}.0.0"):
        assert common.untested_newer(newer) and not common.admits(newer), newer
    for listed in (oldest, f"{major}.{minor - 1}.99", "5.4.0", "4.57.6", "not-a-version"):
        assert not common.untested_newer(listed), listed
    monkeypatch.setitem(common.BLOCKED, below, "a blocked minor stays refused")
    assert not common.untested_newer(f"{below}.0")
    monkeypatch.setattr(common, "transformers_version", lambda: f"{major + 1}.0.0")
    with pytest.raises(RetrofitError, match="newer than every tested release, so a retrofit "
                                            "checks the model's architecture on a tiny random "
                                            "copy first"):
        common.check_transformers()


def test_the_hf_extra_pins_the_gates_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert common.requirement() in project["optional-dependencies"]["hf"]


@pytest.mark.parametrize("doc", ["README.md", "docs/transformers.md"])
def test_the_docs_state_the_gates_range(doc):
    text = " ".join((ROOT / doc).read_text().split())
    assert common.supported_text() in text
    assert "results/transformers-compat.md" in text


def test_covered_from_is_what_the_receipt_measured():
    """Each interface row of COVERED_FROM is the first passing release from which the receipt's
    probe finds the architecture covered in every passing row (refused or absent in the row
    before it; an older major where another route covers it, as 4.57's fused-kernel route
    covers BEiT, is refused all the same: one release bounds the claim)."""
    rows = [row for row in json.loads((ROOT / "results" / "transformers-compat.json").read_text())
            if row["ok"] and row.get("coverage")]
    assert [row["release"] for row in rows] == list(common.TESTED_RELEASES)
    for model_type, (first, why) in common.COVERED_FROM.items():
        statuses = {row["release"]: status for row in rows
                    for status in [next((entry[2] for entry in row["coverage"].values()
                                         if entry[0] == model_type), None)] if status}
        if why in (common.SOFTMAX_ROUTE, common.NEW_LAYOUT, common.TOP_K_INDEXER):
            # added on ROUTES_FROM: covered in every row the sweep has probed them in since
            assert first == common.ROUTES_FROM in common.TESTED_RELEASES, model_type
            assert all(status == "covered" for r, status in statuses.items()
                       if Version(r) > Version(first)), (model_type, statuses)
            continue
        if why == common.INTERFACE:
            releases = list(statuses)
            assert [r for r in releases if Version(r) >= Version(first)] == [
                r for i, r in enumerate(releases)
                if all(statuses[later] == "covered" for later in releases[i:])], model_type
        assert first in statuses, model_type          # a tested release


def test_a_model_covered_only_later_is_refused_naming_the_release(monkeypatch):
    monkeypatch.setattr(common, "transformers_version", lambda: "5.3.0")
    message = common.not_covered_yet("GPTJModel", "gptj")
    assert message.startswith("GPTJModel (model type 'gptj') does not route attention through "
                              "the attention interface in transformers 5.3.0; it does from "
                              f"{common.covered_from('gptj')}")
    assert common.not_covered_yet("LlamaModel", "llama") is None
