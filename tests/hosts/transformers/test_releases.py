"""The transformers host's version gate is results/transformers-compat.md's passing rows."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

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
    for outside in (f"{below}.0", f"{below}.0.dev0", f"{major + 1}.0.0", "4.57.6", "not-a-version"):
        assert not common.admits(outside), outside


def test_the_installed_release_is_admitted():
    """CI installs the main environment's transformers: the gate must let it through."""
    assert common.admits(common.transformers_version())


def test_an_untested_release_is_refused_naming_it_and_the_fix(monkeypatch):
    oldest, below = common.supported_range()
    monkeypatch.setattr(common, "transformers_version", lambda: "5.0.0")
    with pytest.raises(RetrofitError) as err:
        common.check_transformers()
    message = str(err.value)
    assert "transformers 5.0.0 is not supported" in message
    assert common.supported_text() in message
    assert "results/transformers-compat.md" in message
    assert f'pip install "transformers>={oldest},<{below}"' in message


def test_the_hf_extra_pins_the_gates_range():
    oldest, below = common.supported_range()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"transformers>={oldest},<{below}" in extras["hf"]


@pytest.mark.parametrize("doc", ["README.md", "docs/transformers.md"])
def test_the_docs_state_the_gates_range(doc):
    text = " ".join((ROOT / doc).read_text().split())
    assert common.supported_text() in text
    assert "results/transformers-compat.md" in text
