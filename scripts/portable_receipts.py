"""Rewrite the machine-local paths in the committed receipts the way oretrofit now records them.

    python scripts/portable_receipts.py           # rewrite the receipts and documents in place
    python scripts/portable_receipts.py --check   # change nothing; exit 1 if one names such a path

The receipts are every committed text file under results/, docs/ and oretrofit/data/, and
README.md. Each absolute path in them becomes what :func:`oretrofit._files.provenance.portable` makes
of it; nothing else changes (for a JSON file this is checked: every value but a string is the
same before and after), and a second run changes nothing. A path under another checkout of this
repository becomes relative to that checkout: the checkouts are git's worktrees and, for one since
removed, the folder above a recorded path whose tail is a tracked file of the repository
(``/x/wt32a/oretrofit/cli/app.py`` -> ``oretrofit/cli/app.py``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from oretrofit._files.provenance import _ABSOLUTE, portable

ROOT = Path(__file__).resolve().parents[1]
RECEIPTS = ("results", "docs", "oretrofit/data", "README.md")


def _git(root: Path, *args: str) -> list[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=True).stdout.splitlines()


def committed_texts(root: Path = ROOT) -> dict[str, str]:
    """Every committed file under :data:`RECEIPTS` that reads as UTF-8 text, by its path."""
    texts = {}
    for name in _git(root, "ls-files", "--", *RECEIPTS):
        try:
            texts[name] = (root / name).read_bytes().decode("utf-8")      # line ends as they are
        except (UnicodeDecodeError, FileNotFoundError):
            continue                               # a binary file, or one deleted but not staged
    return texts


def checkouts(texts: dict[str, str], root: Path = ROOT) -> list[Path]:
    """git's worktrees of this repository, and the folders above recorded paths whose tail is a
    tracked file (checkouts since removed)."""
    tracked = set(_git(root, "ls-files"))
    found = {Path(line.removeprefix("worktree ")) for line in _git(root, "worktree", "list", "--porcelain")
             if line.startswith("worktree ")}
    for text in texts.values():
        for path in _ABSOLUTE.findall(text):
            parts = Path(path).parts
            found.update(Path(*parts[:i]) for i in range(2, len(parts) - 1)
                         if "/".join(parts[i:]) in tracked)
    return sorted(found)


def _same_but_strings(before: Any, after: Any) -> bool:
    """Whether two JSON values differ in their strings only (keys and every other value equal)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return list(before) == list(after) and all(_same_but_strings(before[k], after[k]) for k in before)
    if isinstance(before, list) and isinstance(after, list):
        return len(before) == len(after) and all(map(_same_but_strings, before, after))
    if isinstance(before, str):
        return isinstance(after, str)
    return type(before) is type(after) and before == after


def rewrite(name: str, text: str, roots: list[Path]) -> str:
    """``text`` with its paths made portable; a JSON file whose other values would change fails."""
    new = portable(text, checkouts=roots)
    if name.endswith(".json") and new != text and not _same_but_strings(json.loads(text), json.loads(new)):
        raise ValueError(f"{name}: rewriting its paths would change more than strings")
    return new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a path is local")
    args = parser.parse_args(argv)
    texts = committed_texts()
    roots = checkouts(texts)
    rewritten = {name: rewrite(name, text, roots) for name, text in texts.items()}
    changed = [name for name, text in texts.items() if rewritten[name] != text]
    for name in changed:
        if not args.check:
            (ROOT / name).write_bytes(rewritten[name].encode("utf-8"))
        print(("names a machine-local path: " if args.check else "rewrote ") + name)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
