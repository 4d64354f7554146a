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
