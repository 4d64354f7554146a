"""The files of an OpenML cache entry, checked before openml reads them.

openml trusts its cache: a ``description.xml`` it cannot parse is reported as a network error,
a ``dataset.arff`` whose MD5 differs from the one its description records is parsed all the
same, and an ARFF header declaring a million attributes is parsed whole before oretrofit's
column limit could apply. :func:`check_cache_entry` reads the description (bounded, through
:func:`oretrofit._files.reading.read_bytes`), refuses a broken one as the broken cache file it is,
refuses an ARFF whose MD5 differs (naming both files), and counts the columns of the ARFF header
(or the parquet file's metadata) against the limit before any data row is read.
"""

from __future__ import annotations

import hashlib
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Iterable

from .._files.reading import FileRefused, read_bytes, regular_file

__all__ = ["check_cache_entry", "parquet_columns"]

_OML = "{http://openml.org/openml}"
_HEADER_LINE = 1 << 20                  # the longest ARFF header line read (bytes)
_REFETCH = "delete it (a run with network access downloads it again)"


def _description(folder: Path, broken: Callable[[str], Exception]) -> ET.Element:
    path = folder / "description.xml"
    data = read_bytes(path, "the OpenML cache file", "xml", _REFETCH)
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise broken(f"the OpenML cache file {path} is broken (not XML: {exc}); {_REFETCH} "
                     "or restore it") from None
    if root.tag != f"{_OML}data_set_description":
        raise broken(f"the OpenML cache file {path} is broken (it is no dataset description: "
                     f"root element {root.tag!r}); {_REFETCH} or restore it")
    return root


def _check_md5(folder: Path, description: ET.Element, broken: Callable[[str], Exception]
               ) -> None:
    expected = (description.findtext(f"{_OML}md5_checksum") or "").strip().lower()
    arff = folder / "dataset.arff"
    if not expected:
        return
    digest = hashlib.md5(usedforsecurity=False)
    with open(arff, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise broken(f"the OpenML cache file {arff} has MD5 {digest.hexdigest()}, but "
                     f"{folder / 'description.xml'} records {expected}: the table is not the "
                     "one described (edited, truncated or from another dataset); delete both "
                     "(a run with network access downloads them again) or restore them")


def _arff_columns(path: Path, most: int, broken: Callable[[str], Exception]) -> int:
    """The number of ``@attribute`` lines of an ARFF header, read up to ``@data`` (or until
    the count passes ``most``), line by line with a bounded line length."""
    count = 0
    with open(path, "rb") as fh:
        while line := fh.readline(_HEADER_LINE):
            if len(line) == _HEADER_LINE and not line.endswith(b"\n"):
                raise broken(f"the OpenML cache file {path} has a header line longer than "
                             f"{_HEADER_LINE} bytes; {_REFETCH}")
            word = line.lstrip()[:10].lower()
            if word.startswith(b"@data"):
                break
            count += word.startswith(b"@attribute")
            if count > most:
                break
    return count


def parquet_columns(path: Path) -> int:
    """The number of columns of a parquet file, from its metadata alone (no row is read)."""
    import pyarrow.parquet as pq
    return pq.read_metadata(path).num_columns


def check_cache_entry(folder: Path, did: int, names: Iterable[str], max_features: int,
                      broken: Callable[[str], Exception],
                      too_wide: Callable[[str], Exception]) -> None:
    """Check the cache entry of dataset ``did`` in ``folder`` (module docstring); every file of
    ``names`` there must be a regular file within its size cap. ``broken`` builds the error for
    a broken file, ``too_wide(count)`` the one for a table of more than ``max_features``
    features (row-id and ignored attributes do not count; ``count`` says how many it has,
    "2001 or more" where the ARFF header was read no further)."""
    try:
        for name in names:
            if os.path.lexists(folder / name):
                regular_file(folder / name, "the OpenML cache file",
                             "xml" if name.endswith(".xml") else "table", _REFETCH)
        if not (folder / "description.xml").exists():
            return                                # openml downloads it
        description = _description(folder, broken)
        skipped = 1 + sum(1 for tag in ("row_id_attribute", "ignore_attribute")  # + the target
                          for _ in description.iterfind(f"{_OML}{tag}"))
        parquet, arff = folder / f"dataset_{did}.pq", folder / "dataset.arff"
        if parquet.exists():
            columns = parquet_columns(parquet)
            if columns > max_features + skipped:
                raise too_wide(str(columns - skipped))
        elif arff.exists():
            columns = _arff_columns(arff, max_features + skipped, broken)
            if columns > max_features + skipped:
                raise too_wide(f"{columns - skipped} or more")
        if arff.exists():
            _check_md5(folder, description, broken)
    except FileRefused as exc:
        raise broken(str(exc)) from None
