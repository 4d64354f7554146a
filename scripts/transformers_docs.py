"""Regenerates the transformers host's generated docs: the layouts table, a block of
``docs/transformers-layouts.md``, and two tables of their own in ``results/``, linked from
``docs/transformers-architectures.md``: ``results/transformers-architectures.md`` (the
supported / refused architectures, from ``tests/hosts/transformers/zoo.py``, the test data) and
``results/transformers-census.md`` (from ``results/transformers-census.json``,
``scripts/transformers_census.py``'s receipt). Run ``python scripts/transformers_docs.py``
(``make docs`` does); tests fail on a stale block or table.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

__all__ = ["DOC", "TABLES", "blocks", "render_into", "main"]

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "transformers-layouts.md"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the architectures the tests cover are test data: read from tests/, never from the package
zoo = _load("transformers_zoo", ROOT / "tests" / "hosts" / "transformers" / "zoo.py")
architectures_table, layouts_table = zoo.architectures_table, zoo.layouts_table
census = _load("transformers_census", ROOT / "scripts" / "transformers_census.py")
census_report = _load("transformers_census_report",
                      ROOT / "scripts" / "transformers_census_report.py")


def _census() -> str:
    return ("# The transformers census\n\n"
            + census_report.census_markdown(json.loads(census.RECEIPT.read_text())))


def _architectures() -> str:
    return "# The transformers host's tested architectures\n\n" + architectures_table()


# generated tables with a file of their own: path -> its renderer
TABLES: dict[Path, Callable[[], str]] = {
    ROOT / "results" / "transformers-architectures.md": _architectures,
    ROOT / "results" / "transformers-census.md": _census,
}


def blocks() -> dict[str, Callable[[], str]]:
    """Block name (``<!-- NAME:begin -->`` … ``<!-- NAME:end -->``) -> its renderer."""
    return {"layouts": layouts_table}


def render_into(text: str, names: list[str] | None = None) -> str:
    """``text`` with every generated block (or those ``names``) replaced by its current content."""
    for name, render in blocks().items():
        if names and name not in names:
            continue
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        head, found, rest = text.partition(begin)
        if not found or end not in rest:
            raise ValueError(f"{DOC.name} lacks the {begin} … {end} markers")
        _, _, tail = rest.partition(end)
        text = f"{head}{begin}\n{render()}{end}{tail}"
    return text


def main(names: list[str] | None = None) -> None:
    DOC.write_text(render_into(DOC.read_text(), names or sys.argv[1:]))
    print(f"updated {DOC.relative_to(ROOT)}")
    for path, render in TABLES.items():
        path.write_text(render())
        print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
