"""The package's version and citation metadata agree with each other."""

import re
from pathlib import Path

import yaml

import oretrofit

ROOT = Path(__file__).resolve().parents[1]


def test_one_version_in_pyproject_package_and_citation() -> None:
    pyproject = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert pyproject and pyproject.group(1) == oretrofit.__version__ == str(citation["version"])


def test_the_citation_names_the_software_and_the_paper() -> None:
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    # the fields CFF 1.2.0 requires, and the paper the README cites as (Gong, 2026)
    assert {"cff-version", "message", "title", "authors"} <= set(citation)
    paper = citation["preferred-citation"]
    assert paper["authors"][0]["family-names"] == "Gong" and paper["year"] == 2026
    assert paper["title"].startswith("From Attention Masks to Inert Zero-Vector Tokens")
    assert paper in citation["references"]


def test_the_all_extra_holds_every_extra_but_the_tests() -> None:
    """``oretrofit[all]`` installs what every verb needs, ``check minilm``'s weights included."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    named = re.fullmatch(r"oretrofit\[([a-z,]+)\]", extras["all"][0])
    assert named and set(named.group(1).split(",")) == set(extras) - {"all", "test"}


def test_the_declared_torch_range_is_the_receipts_passing_minors() -> None:
    """pyproject's torch range admits exactly the minors of the releases
    results/torch-compat.json passes, none it fails, and the Makefile's (CI's) torch is one of
    the passing releases."""
    import json
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    rows = json.loads((ROOT / "results" / "torch-compat.json").read_text())
    passing = [Version(row["release"]) for row in rows if row["ok"]]
    failing = [Version(row["release"]) for row in rows if not row["ok"]]
    ci = re.search(r"torch==(\d+\.\d+\.\d+)", (ROOT / "Makefile").read_text()).group(1)
    declared = next(Requirement(r).specifier for r in
                    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                    if r.startswith("torch"))
    admitted = {(major, minor) for major in (1, 2, 3) for minor in range(40)
                if any(declared.contains(f"{major}.{minor}.{patch}") for patch in (0, 99))}
    assert Version(ci) in passing
    assert admitted == {(release.major, release.minor) for release in passing}
    assert all(declared.contains(release) for release in passing)
    assert not any(declared.contains(release) for release in failing)
