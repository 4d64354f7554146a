"""Fixtures: an openml cache in openml's own on-disk format, built from scikit-learn's diabetes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import arff  # liac-arff, an openml dependency
import pytest
from sklearn.datasets import load_diabetes

_DESCRIPTION = """<oml:data_set_description xmlns:oml="http://openml.org/openml">
  <oml:id>{did}</oml:id>
  <oml:name>diabetes_fixture</oml:name>
  <oml:version>1</oml:version>
  <oml:description>scikit-learn's bundled diabetes data, written as an openml cache entry</oml:description>
  <oml:format>ARFF</oml:format>
  <oml:upload_date>2026-01-01T00:00:00</oml:upload_date>
  <oml:licence>Public</oml:licence>
  <oml:url>https://api.openml.org/data/v1/download/{did}/diabetes_fixture.arff</oml:url>
  <oml:parquet_url>https://openml1.win.tue.nl/datasets/0000/{did:04d}/dataset_{did}.pq</oml:parquet_url>
  <oml:default_target_attribute>target</oml:default_target_attribute>
  <oml:md5_checksum>{md5}</oml:md5_checksum>
  <oml:status>active</oml:status>
</oml:data_set_description>
"""


def write_openml_cache(root: Path, dataset_ids: tuple[int, ...]) -> Path:
    """Write ``root/org/openml/www/datasets/<id>/{description.xml,dataset.arff}`` per id."""
    frame = load_diabetes(as_frame=True, scaled=False).frame
    text = arff.dumps({"relation": "diabetes_fixture",
                       "attributes": [(c, "REAL") for c in frame.columns],
                       "data": frame.to_numpy().tolist()})
    for did in dataset_ids:
        folder = root / "org" / "openml" / "www" / "datasets" / str(did)
        folder.mkdir(parents=True)
        (folder / "dataset.arff").write_text(text)
        md5 = hashlib.md5(text.encode()).hexdigest()
        (folder / "description.xml").write_text(_DESCRIPTION.format(did=did, md5=md5))
    return root


@pytest.fixture()
def openml_cache(tmp_path: Path) -> Path:
    """An openml cache root holding the diabetes fixture as datasets 42 and 43."""
    return write_openml_cache(tmp_path / "openml-cache", (42, 43))
