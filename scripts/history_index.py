"""Write results/demo-host/history/index.md: one row per demo-host run, from its receipts.

    python scripts/history_index.py           # rewrite the index
    python scripts/history_index.py --check   # change nothing; exit 1 if the index is stale

A run is a folder of history/ (attempt-*: trained and not shipped; shipped/*: shipped before)
or the shipped checkpoint under oretrofit/data/. Each row reads the run's model card (recipe,
steps), its evaluation receipt (mean host R² on the four evaluation datasets) and the validation
receipt of the same checkpoint and preset (mean host R² on the validation suite, the number every
choice was made on). Nothing is typed by hand; `make docs` runs this.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HISTORY = Path("results/demo-host/history")
SHIPPED = Path("oretrofit/data")
HOST = "tabpfn_v3_demo"


def _first(folder: Path, *names: str) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def _mean_r2(receipt: dict[str, Any]) -> float:
    """Mean over the receipt's datasets of the host's mean R² over split seeds."""
    return fmean(row[HOST]["mean"] for row in receipt["summary"].values() if HOST in row)


def _card_table(lines: list[str], header: str) -> list[list[str]]:
    start = next((n for n, line in enumerate(lines) if line.startswith(header)), None)
    if start is None:
        return []
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def recipe_and_steps(card: Path | None) -> tuple[str, str]:
    """``(recipe, steps)`` read from a model card written by `oretrofit demo-host card`."""
    if card is None:
        return "–", "–"
    lines = card.read_text().splitlines()
    fields = {row[0].strip("`"): row[1] for row in _card_table(lines, "| field |") if len(row) == 2}
    stages = _card_table(lines, "| stage | steps |")
    steps = re.search(r"^- training: (\d+) steps", card.read_text(), re.M)
    parts = [f"{len(stages)} stage(s)" if stages else None,
             f"{stages[0][3]} tasks/step" if stages else None,
             "peak lr " + " → ".join(dict.fromkeys(s[4] for s in stages)) if stages else None,
             f"embed_dim {fields['embed_dim']}" if "embed_dim" in fields else None,
             f"{fields['nlayers']} ICL layers" if "nlayers" in fields else None,
             *(s[5] for s in stages[-1:] if s[5] != "–"),
             f"{fields['workers']} workers" if fields.get("workers") not in (None, "None", "1") else None]
    return "; ".join(p for p in parts if p), steps.group(1) if steps else "–"


def validation_score(receipt: dict[str, Any], validation: list[dict[str, Any]]) -> str:
    """Mean validation R² of the receipt's checkpoint at its preset ('–' when never validated)."""
    host = receipt["hosts"][HOST]
    same = [v for v in validation if v["hosts"].get(HOST, {}).get("sha256") == host["sha256"]]
    preset = [v for v in same if v["hosts"][HOST].get("inference") == host.get("inference")]
    chosen = preset or same
    return f"{_mean_r2(chosen[-1]):.3f}" if chosen else "–"


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def exported_run(card: Path) -> str | None:
    """The run folder a shipped card's checkpoint was exported from (its export command's --run)."""
    found = re.search(r"(?:pretrain-export|demo-host export) --run (\S+)", card.read_text())
    return found.group(1) if found else None


def rows(root: Path = ROOT) -> list[list[str]]:
    """One row per run: run, recipe, steps, evaluation and validation mean R², shipped."""
    history = root / HISTORY
    validation = [json.loads(p.read_text()) for p in sorted((history / "validation").glob("*.json"))]
    validation = [v for v in validation if v["hosts"]]
    shipped_card = root / SHIPPED / "tabpfn-v3-demo.md"
    shipped_run = exported_run(shipped_card)
    folders = [(f, "no") for f in history.glob("attempt-*")] + \
              [(f, "shipped before") for f in (history / "shipped").iterdir()]
    table = []
    for folder, status in sorted(folders, key=lambda item: _natural(item[0].name)):
        receipt_path = _first(folder, "eval.json", "tabpfn-v3-demo-eval.json")
        if receipt_path is None:
            continue
        receipt = json.loads(receipt_path.read_text())
        host = receipt["hosts"][HOST]
        card = _first(folder, "card.md", "tabpfn-v3-demo.md")
        if shipped_run and Path(host["path"]).parent.name == Path(shipped_run).name:  # its run folder shipped
            status, card = "shipped now", card or shipped_card
        recipe, steps = recipe_and_steps(card)
        table.append([f"[{folder.name.removeprefix('attempt-')}]({receipt_path.relative_to(history).as_posix()})",
                      f"`{host['sha256'][:12]}`", recipe, steps, f"{_mean_r2(receipt):.3f}",
                      validation_score(receipt, validation), status])
    return table


def render(root: Path = ROOT) -> str:
    header = ["run", "checkpoint", "recipe", "steps", "evaluation R²", "validation R²", "shipped"]
    lines = ["# Demo-host training history: index", "",
             "<!-- generated by `python scripts/history_index.py` (`make docs`) from the receipts; "
             "do not edit -->", "",
             "Every run trained for the demo host, one row each: the recipe and steps from its model "
             "card, the mean host R² over the four evaluation datasets (its evaluation receipt, "
             "linked) and over the validation suite (the validation receipt of the same checkpoint "
             "and preset; choices were made on this column), and whether it shipped. What each run "
             "tried and why is in [attempts.md](attempts.md); the choices, with their rules and "
             "tables, in [choices.md](choices.md).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(root)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when stale")
    args = parser.parse_args(argv)
    index, text = ROOT / HISTORY / "index.md", render()
    stale = not index.is_file() or index.read_text() != text
    if not args.check and stale:
        index.write_text(text)
    print(f"{index.relative_to(ROOT)}: {'stale' if stale and args.check else 'up to date' if not stale else 'rewritten'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
