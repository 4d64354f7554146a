"""The wheel's documentation: the README, the citation and every page of docs/, with every file
their relative links reach (followed from page to page), installed in the checkout's layout
under ``<prefix>/share/doc/oretrofit/`` so that every link resolves there as it does in the
checkout (the project has no public repository address for absolute links yet).
``tests/test_wheel.py`` follows every relative link of every installed page."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
DOC_ROOTS = ["README.md", "CITATION.cff",
             *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    """The relative link targets of a markdown page, anchors dropped, code blocks skipped."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    targets = (link.split("#", 1)[0] for link in _LINK.findall(text))
    return [t for t in targets if t and not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def linked_files(roots: list[str]) -> list[str]:
    """``roots`` and every file reached from them through relative links, as paths relative
    to the checkout; a link to a missing file or out of the checkout is an error."""
    found, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        page = ROOT / name
        if page.suffix != ".md":
            continue
        for target in relative_links(page):
            path = (page.parent / target).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                raise FileNotFoundError(f"{name} links {target}, which is not in the checkout")
            if path.is_file():
                todo.append(path.relative_to(ROOT).as_posix())
    return sorted(found)


def data_files(roots: list[str]) -> list[tuple[str, list[str]]]:
    """setuptools' ``data_files``: each linked file under share/doc/oretrofit at its own path."""
    folders: dict[str, list[str]] = defaultdict(list)
    for name in linked_files(roots):
        folders[Path("share/doc/oretrofit", name).parent.as_posix()].append(name)
    return sorted(folders.items())


setup(data_files=data_files(DOC_ROOTS))
