"""Markdown pipe tables: the one place the project lays them out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["pipe_table"]

_RULES = {"left": "---", "right": "---:"}


def pipe_table(header: Sequence[str], rows: Iterable[Sequence[object]],
               align: Sequence[str] | None = None) -> str:
    """A Markdown pipe table: ``| h1 | h2 |``, the rule ``|---|---:|``, then ``| c1 | c2 |`` a row.

    Cells are written as ``str(cell)``, unescaped; ``align[i]`` is ``"left"`` (``---``, the
    default) or ``"right"`` (``---:``). Lines are joined by ``"\\n"``, without a final newline.
    """
    align = ["left"] * len(header) if align is None else list(align)
    if len(align) != len(header) or not set(align) <= _RULES.keys():
        raise ValueError(f"align needs one of {sorted(_RULES)} for each of the {len(header)} "
                         f"header columns, got {align}")
    lines = [_line(header), "|" + "|".join(_RULES[a] for a in align) + "|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {list(row)} has {len(row)} cells; the header has "
                             f"{len(header)}: pad or trim the row")
        lines.append(_line(row))
    return "\n".join(lines)


def _line(cells: Sequence[object]) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"
