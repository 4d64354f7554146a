"""Reliability, round 4, what the loaders read: OpenML cache files are checked before openml
parses them (MD5, column count from the header, a broken description named), numbers stored as
strings are coded as numbers, an infinite target is refused, a special file as --data is named,
and a killed OpenML load's scratch copy is swept."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from oretrofit._files.atomic import TEMP_SUFFIX
from oretrofit.regress.data import MAX_FEATURES, DatasetUnavailable, load_dataset


def _folder(cache: Path, did: int = 42) -> Path:
    return cache / "org" / "openml" / "www" / "datasets" / str(did)


def test_an_arff_whose_md5_differs_from_its_description_is_refused(openml_cache):
    arff = _folder(openml_cache) / "dataset.arff"
    arff.write_text(arff.read_text().replace("151.0", "152.0", 1))
    with pytest.raises(DatasetUnavailable, match=rf"the OpenML cache file {arff} has MD5 "
                                                 r"[0-9a-f]{32}, but .*42/description.xml "
                                                 r"records [0-9a-f]{32}: the table is not the "
                                                 r"one described"):
        load_dataset(42, openml_cache=openml_cache, network=False)


def test_an_arff_header_wider_than_the_limit_is_refused_before_its_data(openml_cache):
    arff = _folder(openml_cache) / "dataset.arff"
    header = "".join(f"@attribute a{i} REAL\n" for i in range(1_000_000))
    arff.write_text(f"@relation wide\n{header}@attribute target REAL\n@data\n")
    started = time.perf_counter()
    with pytest.raises(DatasetUnavailable, match=rf"openml:42: {MAX_FEATURES + 1} or more "
                                                 rf"feature columns, more than the "
                                                 rf"{MAX_FEATURES} TabPFN was pretrained for"):
        load_dataset(42, openml_cache=openml_cache, network=False)
    assert time.perf_counter() - started < 5.0


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_data_file_wider_than_the_limit_is_refused_before_its_rows(tmp_path, monkeypatch,
                                                                     suffix):
    """A --data table of 2,001 feature columns was read whole (every row) before the limit
    applied; its header (or parquet metadata) is counted first, as the OpenML cache's is."""
    path = tmp_path / f"wide{suffix}"
    frame = pd.DataFrame(np.zeros((3, MAX_FEATURES + 2)),
                         columns=[*(f"a{i}" for i in range(MAX_FEATURES + 1)), "y"])
    frame.to_parquet(path) if suffix == ".parquet" else frame.to_csv(path, index=False)
    for reader in ("read_csv", "read_parquet"):
        monkeypatch.setattr(pd, reader, lambda *a, **k: pytest.fail("rows read before the limit"))
    with pytest.raises(DatasetUnavailable, match=rf"file:{path}#y: {MAX_FEATURES + 1} feature "
                                                 rf"columns, more than the {MAX_FEATURES}"):
        load_dataset(f"file:{path}#y")


def test_a_device_in_the_openml_cache_is_refused_not_copied(openml_cache):
    features = _folder(openml_cache) / "features.xml"
    features.symlink_to("/dev/zero")
    with pytest.raises(DatasetUnavailable, match=rf"the OpenML cache file {features} is a "
                                                 r"character device, not a regular file; "
                                                 r"delete it"):
        load_dataset(42, openml_cache=openml_cache, network=False)


def test_numbers_stored_as_strings_are_coded_as_numbers(tmp_path):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"size": ["2", "10", "1.5", None, "2"] * 8,
                  "y": np.arange(40, dtype=float)}).to_parquet(path)
    ds = load_dataset(f"file:{path}#y")
    assert ds.X[:3, 0].tolist() == [2.0, 10.0, 1.5] and np.isnan(ds.X[3, 0])


def test_an_infinite_target_is_refused_not_dropped(tmp_path):
    path = tmp_path / "t.csv"
    y = np.arange(40, dtype=float)
    y[7] = np.inf
    pd.DataFrame({"a": np.arange(40.0), "y": y}).to_csv(path, index=False)
    with pytest.raises(DatasetUnavailable, match=r"target column 'y' holds inf; values must be "
                                                 r"finite"):
        load_dataset(f"file:{path}#y")


def test_a_special_file_as_data_is_named_for_what_it_is(special_file):
    path, what = special_file
    with pytest.raises(DatasetUnavailable, match=rf"data file {path} is {what}, not a regular "
                                                 r"file; pass an existing CSV or parquet file"):
        load_dataset(f"file:{path}#y")


def test_a_killed_openml_loads_scratch_copy_is_swept_by_the_next(openml_cache, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    host = os.uname().nodename.replace(".", "-")
    killed = tmp_path / f"oretrofit-openml.{host}.999999999.abcd{TEMP_SUFFIX}"
    (killed / "org").mkdir(parents=True)
    load_dataset(42, openml_cache=openml_cache, network=False)
    assert not killed.exists()
    assert not list(tmp_path.glob("oretrofit-openml*"))
