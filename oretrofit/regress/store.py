"""The run folder: one JSON file per finished cell, written atomically, plus the run's receipts.

    DIR/run.json                  settings that every cell shares (checkpoint SHA-256, protocol,
                                  device type, estimator settings); written once, checked after
    DIR/datasets/<slug>.json      each dataset's receipt (source, rows, SHA-256 of its content)
    DIR/invocations/<id>.json     one per command: environment, command line, grid, shard, backend
    DIR/cells/<key>.json          one per (dataset, seed, arm, τ[, variant]) cell: metrics and
                                  timings

``run.json`` also binds each per-site τ variant (:mod:`.variants`) under ``variants``: a later
run may add variants, never redefine one; each record is checked when read, and a variant cell
without a record is refused by :func:`read_variants`.

A cell file exists only once its cell has finished, so a killed run loses at most the cells in
flight, and re-running skips every cell that has a file (no cell is ever written twice).

One process at a time writes a folder: :meth:`RunFolder.lock` holds ``DIR/.lock``
(:func:`oretrofit._files.lock.hold_lock`: a killed run's lock is taken over, a live holder is
named in the refusal). The folder's own files and
subfolders (``.lock``, ``cells``, ``datasets``, ``invocations``; ``tables`` in :mod:`.tables`)
are never written through a link: a symbolic link or a hard-linked file in their place is
refused by name (:func:`oretrofit._files.atomic.refuse_link`), and the JSON records are replaced by a
rename, never written into. Under the lock, temporary files that a killed write left behind are
swept (:func:`oretrofit._files.atomic.sweep_temp_files`). Every record is read through
:func:`oretrofit._files.reading.read_json` (regular files of bounded size only).
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from .._files.atomic import own_folder, sweep_temp_files
from .._files.lock import FolderBusy, hold_lock
from .._files.reading import FileRefused
from .._files.reading import read_json as read_bounded_json
from .._files.json_numbers import as_written, encode_non_finite
from .._files.provenance import write_json_atomic
from .cell_fields import cell_problem, read_cell
from .data import Dataset, spec_slug
from .variants import check_record

__all__ = ["SCHEMA_VERSION", "Cell", "RunFolder", "RunMismatch", "FolderBusy", "read_cells",
           "read_json", "read_variants", "cell_id"]

SCHEMA_VERSION = 1
_WRITE_DIRS = ("", "cells", "datasets", "invocations")      # where the run writes


class RunMismatch(ValueError):
    """A run folder that holds results made with different settings than those requested."""


def read_json(path: Path, fix: str) -> Any:
    """A JSON file of a run folder; an unreadable one is an error naming it and ``fix``."""
    try:
        return read_bounded_json(path, "the run-folder record", fix)
    except FileRefused as exc:
        raise RunMismatch(str(exc)) from None


@dataclass(frozen=True, order=True)
class Cell:
    """One fit-and-predict: ``tau`` is None for ``base``, which no τ changes; ``variant`` names a
    per-site τ variant of the arm (its default τ is ``tau``), "" for a plain τ."""

    dataset: str
    seed: int
    arm: str
    tau: float | None
    variant: str = ""

    @property
    def key(self) -> str:
        tau = "" if self.tau is None else f"__tau{self.tau!r}"
        variant = f"__{self.variant}" if self.variant else ""
        return f"{spec_slug(self.dataset)}__s{self.seed}__{self.arm}{tau}{variant}"

    def label(self) -> str:
        tau = "" if self.tau is None else f" τ={self.tau:g}"
        variant = f" [{self.variant}]" if self.variant else ""
        return f"{self.dataset} · seed {self.seed} · {self.arm}{tau}{variant}"

    def record(self) -> dict[str, Any]:
        """The cell's identity as its file stores it (no ``variant`` key for a plain τ, as
        before variants existed)."""
        found = asdict(self)
        if not self.variant:
            del found["variant"]
        return found


def cell_id(cell: Mapping[str, Any]) -> tuple[str, float | None, str | None]:
    """``(arm, τ, variant)`` of a stored cell; None for a plain τ (whose file has no variant)."""
    return cell["arm"], cell["tau"], cell.get("variant") or None


class RunFolder:
    """Reads and writes one run folder (see module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.cells_dir = self.path / "cells"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder's lock for the block (module docstring); refuse a live holder."""
        with hold_lock(self.path / ".lock", self.path):
            yield

    def sweep(self) -> list[Path]:
        """Delete temporary files of killed writes (call under :meth:`lock`); returns them."""
        return [p for d in _WRITE_DIRS if (self.path / d).is_dir()
                and not (self.path / d).is_symlink() for p in sweep_temp_files(self.path / d)]

    def check_cells(self) -> None:
        """Read every cell file, so a corrupt one is named before anything runs."""
        self.cells()

    def bind(self, settings: Mapping[str, Any]) -> None:
        """Write ``run.json`` on first use; afterwards refuse different shared settings."""
        manifest = self.path / "run.json"
        if os.path.lexists(manifest):
            found = self.settings()
            if found != as_written(settings):
                raise RunMismatch(
                    f"{self.path} holds results made with other settings "
                    f"({_difference(found, settings)}); use a new --out folder for these "
                    "settings")
            return
        write_json_atomic(manifest, {"schema_version": SCHEMA_VERSION,
                                     "kind": "oretrofit.regress.run", "settings": settings})

    def settings(self) -> dict[str, Any]:
        manifest = self.path / "run.json"
        if not os.path.lexists(manifest):
            raise FileNotFoundError(f"{self.path} is not a regression run folder (no run.json); "
                                    "run `oretrofit regress --out DIR ...` first")
        found = read_json(manifest, "restore it or re-run into a new --out folder")
        if not isinstance(found, dict) or not isinstance(found.get("settings"), dict):
            raise RunMismatch(f"{manifest} has no settings object; restore it or re-run into a "
                              "new --out folder")
        return found["settings"]

    def record_dataset(self, dataset: Dataset) -> str:
        """Store a dataset's receipt and return the spec the folder knows it by (its cells'
        ``dataset``): a local table (a ``file:`` spec) is known by its content, so a table
        recorded before under another path with the same SHA-256 (the file moved or copied)
        is that one's spec, and nothing is recorded twice. A different checksum under the
        same spec is refused."""
        path = self.path / "datasets" / f"{spec_slug(dataset.spec)}.json"
        receipt = dataset.receipt()
        if os.path.lexists(path):
            fix = "delete it; the next run records the dataset again"
            known = read_json(path, fix)
            if not isinstance(known, dict) or "sha256" not in known:
                raise RunMismatch(f"{path} is not a dataset receipt (a JSON object with "
                                  f"sha256); {fix}")
            if known["sha256"] != receipt["sha256"]:
                raise RunMismatch(f"dataset {dataset.spec} changed since this run folder was "
                                  f"made (SHA-256 {known['sha256'][:12]}… now "
                                  f"{receipt['sha256'][:12]}…); use a new --out folder")
            return dataset.spec
        if dataset.spec.startswith("file:"):
            known = [spec for spec, found in self.datasets().items()
                     if spec.startswith("file:") and found.get("sha256") == receipt["sha256"]]
            if known:
                return known[0]
        write_json_atomic(own_folder(path.parent) / path.name, receipt)
        return dataset.spec

    def datasets(self) -> dict[str, dict[str, Any]]:
        fix = "delete it; the next run records the dataset again"
        return {r["spec"]: r for r in (read_json(p, fix)
                                       for p in sorted((self.path / "datasets").glob("*.json")))}

    def record_invocation(self, record: Mapping[str, Any]) -> Path:
        stamp = record.get("environment", {}).get("created_utc", "").replace(":", "")
        # Two commands of one process can start within the same second: a random suffix keeps
        # every invocation's receipt instead of letting the second overwrite the first.
        name = f"{stamp}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        return write_json_atomic(own_folder(self.path / "invocations") / name,
                                 {"schema_version": SCHEMA_VERSION, **record})

    def bind_variants(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        """Add the variants (``<arm>/<name>`` -> record) to ``run.json``; one already there with a
        different record is refused (call after :meth:`bind`, under :meth:`lock`)."""
        if not records:
            return
        known = self.variants()
        wanted = as_written(dict(records))
        for key, record in wanted.items():
            if key in known and known[key] != record:
                raise RunMismatch(
                    f"{self.path} already ran variant {key} with another definition "
                    f"({_difference(known[key], record)}); use a new --out folder, or keep the "
                    "spec this folder was run with")
        if any(key not in known for key in wanted):
            manifest = self.path / "run.json"
            found = read_json(manifest, "restore it or use a new --out folder")
            found["variants"] = {**known, **wanted}
            write_json_atomic(manifest, found)

    def variants(self) -> dict[str, dict[str, Any]]:
        """The variants bound in ``run.json`` (``<arm>/<name>`` -> record), each checked
        (:func:`.variants.check_record`): an edited record is an error naming the file."""
        self.settings()
        manifest = self.path / "run.json"
        fix = "restore it or re-run into a new --out folder"
        found = read_json(manifest, fix).get("variants") or {}
        if not isinstance(found, dict):
            raise RunMismatch(f"{manifest}: variants must be an object of <arm>/<name> -> "
                              f"record, got {found!r:.60}; {fix}")
        for key, record in found.items():
            try:
                check_record(key, record)
            except (ValueError, TypeError) as exc:
                raise RunMismatch(f"{manifest}: variant {key} is not as a run binds it ({exc}); "
                                  f"{fix}") from None
        return found

    def done(self, cell: Cell) -> bool:
        return (self.cells_dir / f"{cell.key}.json").is_file()

    def write_cell(self, cell: Cell, result: Mapping[str, Any]) -> Path:
        return write_json_atomic(own_folder(self.cells_dir) / f"{cell.key}.json",
                                 {"schema_version": SCHEMA_VERSION, **cell.record(), **result})

    def cells(self) -> list[dict[str, Any]]:
        fix = "delete it and re-run; the run recomputes that cell"
        found = [(p, read_cell(read_json(p, fix))) for p in sorted(self.cells_dir.glob("*.json"))]
        for path, cell in found:
            problem = cell_problem(cell)
            if problem is not None:
                raise RunMismatch(f"{path} {problem}; {fix}")
        return [cell for _, cell in found]


def _results(cell: Mapping[str, Any]) -> list[Any]:
    """A cell's RMSE and R², comparable with ``==`` (a NaN R² by its name: NaN != NaN)."""
    return encode_non_finite([cell["rmse"], cell["r2"]])


def _difference(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    wanted = as_written(wanted)
    keys = sorted(k for k in {*found, *wanted} if found.get(k) != wanted.get(k))
    return "; ".join(f"{k}: {found.get(k)!r} there, {wanted.get(k)!r} now" for k in keys)


def read_variants(folders: Iterable[str | os.PathLike[str]],
                  cells: Iterable[Mapping[str, Any]] = ()) -> dict[str, dict[str, Any]]:
    """The variants of run folders merged; one defined differently in two folders is refused,
    and so is a variant cell of ``cells`` whose variant no folder defines."""
    merged: dict[str, dict[str, Any]] = {}
    folders = list(folders)
    for folder in map(RunFolder, folders):
        for key, record in folder.variants().items():
            if key in merged and merged[key] != record:
                raise RunMismatch(f"variant {key} is defined differently in {folder.path} than "
                                  f"in an earlier folder ({_difference(merged[key], record)}); "
                                  "render them separately")
            merged[key] = record
    unbound = sorted({f"{c['arm']}/{c['variant']}" for c in cells if c.get("variant")} - {*merged})
    if unbound:
        raise RunMismatch(f"cells of variant {', '.join(unbound)} are in "
                          f"{', '.join(map(str, folders))} but its run.json defines no such "
                          "variant; restore run.json or re-run into a new --out folder")
    return merged


def read_cells(folders: Iterable[str | os.PathLike[str]]
               ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Merge run folders (e.g. shards): their settings must agree; cells are unioned by key.

    Returns ``(settings, dataset receipts by spec, cells sorted by (dataset, τ, arm, variant,
    seed))``.
    """
    settings: dict[str, Any] | None = None
    datasets: dict[str, dict[str, Any]] = {}
    cells: dict[tuple, dict[str, Any]] = {}
    for folder in map(RunFolder, folders):
        found = folder.settings()
        if settings is not None and found != settings:
            raise RunMismatch(f"{folder.path} was made with other settings than the first "
                              f"folder ({_difference(settings, found)}); render them "
                              "separately, or compare them with `oretrofit tables "
                              "--across-hosts`")
        settings = found
        for spec, receipt in folder.datasets().items():
            if spec in datasets and datasets[spec]["sha256"] != receipt["sha256"]:
                raise RunMismatch(f"dataset {spec} differs between run folders")
            datasets[spec] = receipt
        for cell in folder.cells():
            key = (cell["dataset"], cell["seed"], *cell_id(cell))
            if key in cells and _results(cells[key]) != _results(cell):
                raise RunMismatch(f"cell {key} has different results in two run folders")
            cells[key] = cell
    if settings is None:
        raise ValueError("no run folder given")
    order = sorted(cells, key=lambda k: (k[0], -1.0 if k[3] is None else k[3], k[2],
                                         k[4] or "", k[1]))
    return settings, datasets, [cells[k] for k in order]
