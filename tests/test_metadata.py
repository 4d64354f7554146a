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


def test_the_declared_torch_range_is_the_tested_minor() -> None:
    """The Makefile (and so CI) installs one torch; the declared range admits its minor and no
    other, untested one."""
    import tomllib

    from packaging.requirements import Requirement

    tested = re.search(r"torch==(\d+)\.(\d+)\.\d+", (ROOT / "Makefile").read_text())
    declared = next(Requirement(r) for r in
                    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                    if r.startswith("torch"))
    major, minor = map(int, tested.groups())
    assert declared.specifier.contains(f"{major}.{minor}.0")
    assert declared.specifier.contains(f"{major}.{minor}.9")
    assert not declared.specifier.contains(f"{major}.{minor - 1}.9")
    assert not declared.specifier.contains(f"{major}.{minor + 1}.0")
