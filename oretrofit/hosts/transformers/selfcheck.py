"""The self-check: on a transformers release newer than every tested one, and for a model whose
classes override methods of the transformers classes they subclass (:mod:`.overrides`) on any
release, the host verifies the user's architecture before covering it, instead of refusing the
release by list or trusting the subclass by its base class's name.

For each outermost ``PreTrainedModel`` of the model being retrofitted, a tiny random model of the
same class is built from its own config, shrunk (:mod:`.shrink`, with its attention
implementation), and the paper's contracts are measured on it (:func:`.check.check`: τ→0
agreement and exact revert under ``oa`` and ``full-o``, null insertion, mask-free padding). All
hold: the model is admitted, with a one-line notice (:class:`UntestedReleaseWarning` or
:class:`SubclassCheckedWarning`, once per architecture in a process); one fails:
:class:`RetrofitError` naming the contract and the overriding class and methods or the release
and the ``pip install`` of the tested range. An overriding class that the tiny model does not
hold (put into the model after it was built) cannot be measured, and is refused by name.

The result is kept per (model class, attention implementation, transformers release, oretrofit
version, and the digest of the overriding classes' code) in memory and on disk,
``<cache>/selfcheck/*.json`` (:func:`oretrofit._files.provenance.cache_dir`:
``$ORETROFIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/oretrofit``), written whole
(:mod:`oretrofit._files.atomic`), so it is measured once; a record that cannot be read is
measured again. A check that cannot run (no tiny model builds, or its forward raises) refuses
and is not kept.
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
from ..._files.provenance import cache_dir, oretrofit_version, write_json_atomic
from .backbones import pretrained_models
from .check import check
from .overrides import Override, code_digest, within
from .releases import requirement, supported_text, transformers_version, untested_newer
from .shrink import GROUPS, shrunk_config, tiny_model

__all__ = ["UntestedReleaseWarning", "SubclassCheckedWarning", "verify", "record_path",
           "SCHEMA_VERSION"]

SCHEMA_VERSION = 2
_RESULTS: dict[tuple[str, ...], dict[str, Any]] = {}      # key -> record, this process
_NOTIFIED: set[tuple[str, ...]] = set()
# set while a tiny model is retrofitted by the check itself: its own retrofit is not re-checked
_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("oretrofit_selfcheck",
                                                                  default=False)


class UntestedReleaseWarning(UserWarning):
    """A model admitted on a transformers release newer than every tested one, because its
    architecture passed the self-check."""


class SubclassCheckedWarning(UserWarning):
    """A model admitted although its classes override methods of the transformers classes they
    subclass, because a tiny copy of it passed the self-check."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _key(model: nn.Module, own: list[Override] | tuple = ()) -> tuple[str, ...]:
    """(model class, attention implementation, transformers and oretrofit versions), and the
    digest of ``own`` overriding classes' code where there are any."""
    return (_name(type(model)), str(getattr(model.config, "_attn_implementation", None)),
            transformers_version(), oretrofit_version(), *([code_digest(own)] if own else []))


def record_path(key: tuple[str, ...]) -> Path:
    """Where the record of ``key`` (:func:`_key`) is kept."""
    name = "-".join([key[0].rpartition(".")[2], key[1], f"transformers{key[2]}",
                     f"oretrofit{key[3]}", *key[4:]])
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


def _measure(model: nn.Module, key: tuple[str, ...], own: list[Override]) -> dict[str, Any]:
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
        raise _cannot(key, own, "no tiny model of its config builds (" + "; ".join(errors) + ")")
    tiny, shrink = built
    token = _CHECKING.set(True)
    try:
        summary = check(tiny)
    except Exception as error:                      # noqa: BLE001 - refused, naming it
        raise _cannot(key, own, f"the contracts do not run on a tiny {type(tiny).__name__} "
                                f"({type(error).__name__}: {str(error)[:300]})") from error
    finally:
        _CHECKING.reset(token)
    return {"schema_version": SCHEMA_VERSION, "key": list(key), "shrink": shrink,
            "parameters": sum(p.numel() for p in tiny.parameters()),
            "classes": sorted({_name(type(m)) for m in tiny.modules()}),
            "failed": summary["failed"],
            "agreement": {a["arm"]: a["relative_max_diff"] for a in summary["agreement"]},
            "null_insertion": {k: summary["null_insertion"][k]
                               for k in ("old_max_delta", "inserted_max_abs")},
            "padding_max_delta": summary["padding_max_delta"]}


def _overriding(own: list[Override]) -> str:
    return ("; ".join(o.describe() for o in own) + ", which the host relies on (it vouches for "
            "transformers' own code by its tested releases, not for a subclass's)")


def _there(key: tuple[str, ...]) -> str:
    return " there" if untested_newer(key[2]) else ""


def _refusal(key: tuple[str, ...], own: list[Override], what: str,
             fix: str = "make the override keep the contracts, or retrofit the model without it"
             ) -> RetrofitError:
    """The self-check's refusal for ``key``: on a release newer than every tested one (the fix:
    the tested releases), or of the ``own`` overriding classes (``fix``); ``what`` went wrong."""
    if untested_newer(key[2]):
        why = (f"transformers {key[2]} is newer than every release the transformers host is "
               f"tested on ({supported_text()})" + (f", {_overriding(own)}" if own else ""))
        fix = f'pip install "{requirement()}"'
    else:
        why = _overriding(own)
    return RetrofitError(f"{why}, and {what}; {fix}")


def _cannot(key: tuple[str, ...], own: list[Override], why: str) -> RetrofitError:
    return _refusal(key, own, f"the self-check of {key[0].rpartition('.')[2]} cannot run"
                              f"{_there(key)}: {why}")


def _record(model: nn.Module, key: tuple[str, ...], own: list[Override]) -> dict[str, Any]:
    record = _RESULTS.get(key) or _stored(key)
    if record is None:
        record = _measure(model, key, own)
        try:
            write_json_atomic(record_path(key), record)
        except OSError:
            pass                # an unwritable cache: kept in this process, measured again later
    _RESULTS[key] = record
    return record


def _notify(key: tuple[str, ...], own: list[Override], name: str) -> None:
    """The one-line notice of an admitted model, once per ``key`` in a process."""
    if key in _NOTIFIED:
        return
    _NOTIFIED.add(key)
    passed = (f"{name} passed the self-check on a tiny random copy (τ→0 agreement, exact "
              "revert, null insertion, mask-free padding), so it is retrofitted (kept in "
              f"{record_path(key)})")
    if untested_newer(key[2]):
        warnings.warn(f"oretrofit: transformers {key[2]} is newer than the releases oretrofit is "
                      f"tested on ({supported_text()}); {passed}", UntestedReleaseWarning,
                      stacklevel=3)
    else:
        warnings.warn(f"oretrofit: {'; '.join(o.describe() for o in own)}; {passed}",
                      SubclassCheckedWarning, stacklevel=3)


def verify(model: nn.Module, overridden: list[Override], newer: bool) -> None:
    """Admit ``model`` when each of its outermost ``PreTrainedModel`` s that needs it passes the
    self-check (module docstring): every one on a ``newer`` untested release, else those holding
    ``overridden`` classes (:func:`.overrides.overrides`); else :class:`RetrofitError` naming the
    failing contracts, the overriding classes or the release, and the fix. A tiny model the
    check itself retrofits is admitted as it is."""
    if _CHECKING.get():
        return
    for path, pretrained in pretrained_models(model):
        own = [o for o in overridden if within(o.path, path)]
        if not (newer or own):
            continue
        key = _key(pretrained, own)
        record = _record(pretrained, key, own)
        name = type(pretrained).__name__
        absent = [o for o in own if _name(o.cls) not in record["classes"]]
        if absent:
            missing = ", ".join(o.cls.__name__ for o in absent)
            raise _refusal(key, own, f"the self-check cannot measure {missing}: a tiny {name} "
                                     f"built from its config holds none (it was put into the "
                                     "model after the model was built)",
                           f"build it in the __init__ of a subclass of {name}, so the "
                           "self-check measures it, or retrofit the model without it")
        if record["failed"]:
            raise _refusal(key, own, f"{name} fails the self-check{_there(key)}: on a tiny random "
                                     f"{name} of its config, {'; '.join(record['failed'])} (kept "
                                     f"in {record_path(key)})")
        _notify(key, own, name)
