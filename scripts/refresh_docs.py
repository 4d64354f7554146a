"""Rewrite every `oretrofit demo-host compare` table in the documents from the receipts it names.

    python scripts/refresh_docs.py            # README.md, docs/*.md, results/demo-host/history/*.md
    python scripts/refresh_docs.py --check    # change nothing; exit 1 if a table is stale or missing
    python scripts/refresh_docs.py FILE.md ...

Run from the repository root (receipt paths in the commands are relative to it); `make docs` runs
this and scripts/history_index.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def documents(root: Path = ROOT) -> list[Path]:
    """The Markdown documents that may hold comparison blocks."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")),
            *sorted((root / "results/demo-host/history").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    from oretrofit.demo_host.documents import refresh_documents

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="documents (default: all of them)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when stale")
    args = parser.parse_args(argv)
    files = args.files or [path.relative_to(ROOT) for path in documents()]
    if not args.files:
        os.chdir(ROOT)  # the documents are named relative to the repository root
    try:
        stale = refresh_documents(files, check=args.check, root=ROOT)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
