"""The self-check: on a transformers release newer than every tested one, the host verifies the
user's architecture before covering it, instead of refusing the release by list.

For each outermost ``PreTrainedModel`` of the model being retrofitted, a tiny random model of the
same class is built from its own config, shrunk (:mod:`.shrink`, with its attention
implementation), and the paper's contracts are measured on it (:func:`.check.check`: τ→0
agreement and exact revert under ``oa`` and ``full-o``, null insertion, mask-free padding). All
hold: the model is admitted, with a one-line notice (:class:`UntestedReleaseWarning`, once per
architecture in a process); one fails: :class:`RetrofitError` naming the contract, the release
and the ``pip install`` of the tested range.

The result is kept per (model class, attention implementation, transformers release, oretrofit
version) in memory and on disk, ``<cache>/selfcheck/*.json`` (:func:`oretrofit._files.provenance.
cache_dir`: ``$ORETROFIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/oretrofit``), written whole
(:mod:`oretrofit._files.atomic`), so it is measured once; a record that cannot be read is measured
again. A check that cannot run (no tiny model builds, or its forward raises) refuses and is not
kept.
"""

from __future__ import annotations

import contextvars
import re
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from ..._files.reading import FileRefused, read_json
from ..._surgery.host import RetrofitError
from ..._files.provenance import cache_dir, write_json_atomic
from ..._version import __version__
from .backbones import pretrained_models
from .check import check
from .releases import requirement, supported_text, transformers_version
from .shrink import GROUPS, shrunk_config, tiny_model

__all__ = ["UntestedReleaseWarning", "verify", "record_path", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
_RESULTS: dict[tuple[str, ...], dict[str, Any]] = {}      # key -> record, this process
_NOTIFIED: set[tuple[str, ...]] = set()
# set while a tiny model is retrofitted by the check itself: its own retrofit is not re-checked
_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("oretrofit_selfcheck",
                                                                  default=False)


class UntestedReleaseWarning(UserWarning):
    """A model admitted on a transformers release newer than every tested one, because its
    architecture passed the self-check."""


def _key(model: nn.Module) -> tuple[str, ...]:
    cls = type(model)
    return (f"{cls.__module__}.{cls.__qualname__}",
            str(getattr(model.config, "_attn_implementation", None)), transformers_version(),
            __version__)


def record_path(key: tuple[str, ...]) -> Path:
    """Where the record of ``key`` (model class, attention implementation, transformers and
    oretrofit versions) is kept."""
    name = "-".join([key[0].rpartition(".")[2], key[1], f"transformers{key[2]}",
                     f"oretrofit{key[3]}"])
    return cache_dir() / "selfcheck" / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".json")


def _stored(key: tuple[str, ...]) -> dict[str, Any] | None:
    """The record kept on disk for ``key``; None when there is none or it is not one (then it is
    measured again and rewritten)."""
    path = record_path(key)
    if not path.exists():
        return None
    try:
        record = read_json(path, "self-check record", "delete it; the next retrofit measures again")
    except (FileRefused, OSError):
        return None
    if not isinstance(record, dict) or record.get("key") != list(key) or not isinstance(
            record.get("failed"), list) or record.get("schema_version") != SCHEMA_VERSION:
        return None
    return record


def _measure(model: nn.Module, key: tuple[str, ...]) -> dict[str, Any]:
    """Build the tiny model (the first shrink that builds) and measure the contracts on it."""
    built, errors = None, []
    for name, groups in GROUPS.items():
        try:
            built = tiny_model(type(model), shrunk_config(model.config, groups),
                               attn_implementation=model.config._attn_implementation), name
            break
        except Exception as error:                  # noqa: BLE001 - the next shrink is tried
            errors.append(f"{name}: {type(error).__name__}: {str(error)[:200]}")
    if built is None:
        raise _cannot(key, "no tiny model of its config builds (" + "; ".join(errors) + ")")
    tiny, shrink = built
    token = _CHECKING.set(True)
    try:
        summary = check(tiny)
    except Exception as error:                      # noqa: BLE001 - refused, naming it
        raise _cannot(key, f"the contracts do not run on a tiny {type(tiny).__name__} "
                           f"({type(error).__name__}: {str(error)[:300]})") from error
    finally:
        _CHECKING.reset(token)
    return {"schema_version": SCHEMA_VERSION, "key": list(key), "shrink": shrink,
            "parameters": sum(p.numel() for p in tiny.parameters()),
            "failed": summary["failed"],
            "agreement": {a["arm"]: a["relative_max_diff"] for a in summary["agreement"]},
            "null_insertion": {k: summary["null_insertion"][k]
                               for k in ("old_max_delta", "inserted_max_abs")},
            "padding_max_delta": summary["padding_max_delta"]}


def _refusal(key: tuple[str, ...], what: str) -> RetrofitError:
    """The self-check's refusal on the release of ``key``: ``what`` went wrong, and the fix."""
    return RetrofitError(
        f"transformers {key[2]} is newer than every release the transformers host is tested on "
        f"({supported_text()}), and {what}; pip install \"{requirement()}\"")


def _cannot(key: tuple[str, ...], why: str) -> RetrofitError:
    return _refusal(key, f"the self-check of {key[0].rpartition('.')[2]} cannot run there: {why}")


def _record(model: nn.Module) -> dict[str, Any]:
    key = _key(model)
    record = _RESULTS.get(key) or _stored(key)
    if record is None:
        record = _measure(model, key)
        try:
            write_json_atomic(record_path(key), record)
        except OSError:
            pass                # an unwritable cache: kept in this process, measured again later
    _RESULTS[key] = record
    return record


def verify(model: nn.Module) -> None:
    """Admit ``model`` on an untested newer transformers release when each of its outermost
    ``PreTrainedModel`` s passes the self-check (module docstring); else :class:`RetrofitError`
    naming the failing contracts, the release and the fix. A tiny model the check itself
    retrofits is admitted as it is."""
    if _CHECKING.get():
        return
    for _, pretrained in pretrained_models(model):
        key, record = _key(pretrained), _record(pretrained)
        name = type(pretrained).__name__
        if record["failed"]:
            raise _refusal(key, f"{name} fails the self-check there: on a tiny random {name} "
                                f"of its config, {'; '.join(record['failed'])} (kept in "
                                f"{record_path(key)})")
        if key not in _NOTIFIED:
            _NOTIFIED.add(key)
            warnings.warn(
                f"oretrofit: transformers {key[2]} is newer than the releases oretrofit is tested "
                f"on ({supported_text()}); {name} passed the self-check on a tiny random copy "
                "(τ→0 agreement, exact revert, null insertion, mask-free padding), so it is "
                f"retrofitted (kept in {record_path(key)})", UntestedReleaseWarning, stacklevel=2)
