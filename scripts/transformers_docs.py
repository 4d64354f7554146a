"""Regenerates the generated blocks of ``docs/transformers.md``: the layouts table, the
architecture tables (both from ``tests/hosts/transformers/zoo.py``, the test data) and
verbatim quotes of ``results/hosts.md`` and ``results/bench_hosts.md``. Run
``python scripts/transformers_docs.py`` (``make docs`` does); tests fail on a stale block.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable

__all__ = ["DOC", "blocks", "render_into", "main"]

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "transformers.md"
# the architectures the tests cover are test data: read from tests/, never from the package
_spec = importlib.util.spec_from_file_location("transformers_zoo",
                                               ROOT / "tests" / "hosts" / "transformers" / "zoo.py")
zoo = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)
architectures_table, layouts_table = zoo.architectures_table, zoo.layouts_table


def _quote(path: str) -> Callable[[], str]:
    return lambda: (ROOT / path).read_text().strip() + "\n"


def blocks() -> dict[str, Callable[[], str]]:
    """Block name (``<!-- NAME:begin -->`` … ``<!-- NAME:end -->``) -> its renderer."""
    return {"layouts": layouts_table, "architectures": architectures_table,
            "hosts": _quote("results/hosts.md"), "bench_hosts": _quote("results/bench_hosts.md")}


def render_into(text: str) -> str:
    """``text`` with every generated block replaced by its current content."""
    for name, render in blocks().items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        head, found, rest = text.partition(begin)
        if not found or end not in rest:
            raise ValueError(f"docs/transformers.md lacks the {begin} … {end} markers")
        _, _, tail = rest.partition(end)
        text = f"{head}{begin}\n{render()}{end}{tail}"
    return text


def main() -> None:
    DOC.write_text(render_into(DOC.read_text()))
    print(f"updated {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
