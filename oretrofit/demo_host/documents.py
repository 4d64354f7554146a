"""The comparison tables in the project's Markdown documents, regenerated from their commands.

A comparison is a fenced block holding one ``oretrofit demo-host compare --receipt "LABEL=PATH" ...``
command, followed (after a blank line) by the pipe table that command prints. The docs and the
demo host's run history show many; :func:`refresh_comparisons` rewrites each table from the
receipts its command names, or adds it under a new command, so a rescored receipt reaches every
document without a number typed by hand (``make docs`` runs :func:`refresh_documents` on every
document), and the documents' tests check the same tables with the same parser.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any, Callable, Iterable

from .._files.atomic import write_text_atomic
from .._files.reading import read_text
from .card import compare_runs
from .evaluate import SCORES, read_receipt

__all__ = ["Comparison", "comparisons", "labelled_receipts", "refresh_comparisons", "refresh_documents"]

COMMAND = "oretrofit demo-host compare"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One comparison block: its command and the table shown under it (lines ``start:end``; empty,
    with ``start == end`` just after the closing fence, where the command has no table yet)."""

    command: str  # the fenced lines, each stripped, joined with newlines
    table: str    # the pipe table's lines, each stripped
    start: int
    end: int
    indent: str   # the fence's indentation, which the table shares (a table inside a list item)

    def receipt_items(self) -> list[str]:
        """The command's ``LABEL=PATH`` arguments, in order."""
        argv = shlex.split(self.command.replace("\\\n", " "))
        return [value for flag, value in zip(argv, argv[1:]) if flag == "--receipt"]


def comparisons(text: str) -> list[Comparison]:
    """Every fenced ``oretrofit demo-host compare`` block in ``text`` and the pipe table after it."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        if not lines[i].strip().startswith("```"):  # an opening fence may name a language
            i += 1
            continue
        end = next((k for k in range(i + 1, len(lines)) if lines[k].strip() == "```"), None)
        if end is None:
            raise ValueError(f"the fence opened on line {i + 1} is never closed")
        command = "\n".join(line.strip() for line in lines[i + 1:end])
        start = end + 1
        while start < len(lines) and not lines[start].strip():
            start += 1
        stop = start
        while stop < len(lines) and lines[stop].strip().startswith("|"):
            stop += 1
        if command.startswith(COMMAND):
            if stop == start:  # no table yet: it goes right after the fence
                start = stop = end + 1
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            found.append(Comparison(command, "\n".join(line.strip() for line in lines[start:stop]),
                                    start, stop, indent))
        i = end + 1
    return found


def labelled_receipts(items: Iterable[str], root: Path = Path(".")) -> dict[str, dict[str, Any]]:
    """``{LABEL: receipt}`` for ``LABEL=PATH`` items, each PATH read relative to ``root``."""
    receipts = {}
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label:
            raise ValueError(f"--receipt {item!r} is not LABEL=PATH")
        receipts[label] = read_receipt(Path(root) / path, f"--receipt {item}", SCORES)
    return receipts


def refresh_comparisons(text: str, root: Path = Path(".")) -> tuple[str, int]:
    """``text`` with every comparison table replaced by what its command prints now (or added, a
    blank line after the fence and before what follows, where there is none), and how many tables
    changed. Receipt paths are read relative to ``root``; a table takes its fence's indentation."""
    lines = text.splitlines(keepends=True)
    changed = 0
    for block in reversed(comparisons(text)):  # from the end, so earlier line numbers stay valid
        table = compare_runs(labelled_receipts(block.receipt_items(), root)).strip()
        if table == block.table:
            continue
        rows = [f"{block.indent}{row}\n" for row in table.splitlines()]
        if not block.table:
            if block.end < len(lines) and lines[block.end].strip():
                rows.append("\n")
            rows.insert(0, "\n")
            if block.end == len(lines) and not lines[-1].endswith("\n"):
                rows.insert(0, "\n")
        lines[block.start:block.end] = rows
        changed += 1
    return "".join(lines), changed


def refresh_documents(paths: Iterable[Path], check: bool = False, root: Path = Path("."),
                      report: Callable[[str], Any] = print) -> int:
    """Refresh every comparison table in each document (``check``: change nothing), reporting one
    line per document; returns how many tables were stale. A missing receipt raises ValueError
    naming the document."""
    stale = 0
    for path in paths:
        try:
            text, changed = refresh_comparisons(
                read_text(path, "the document", "text", "give a Markdown file"), root)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        stale += changed
        if changed and not check:
            write_text_atomic(path, text)
        report(f"{path}: {changed} table(s) {'stale' if check else 'rewritten'}")
    return stale
