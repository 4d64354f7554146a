"""scripts/gpu_check.sh cannot run without a GPU; its syntax and every CLI option it passes can
be checked here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from oretrofit.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _commands(marker: str) -> list[list[str]]:
    """The words of each command line (continuations joined) that starts with ``marker``."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    return [line.split(marker, 1)[1].split() for line in text.splitlines() if marker in line
            and not line.lstrip().startswith(("#", "ORETROFIT="))]


def test_syntax():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_oretrofit_option_exists():
    commands = _commands('"${ORETROFIT[@]}"')
    assert [c[:2] for c in commands] == [["sweep", "operators"], ["regress", "--datasets"]]
    for words in commands:
        verb = [w for w in words[:2] if not w.startswith("-")]
        help_text = CliRunner().invoke(app, [*verb, "--help"], terminal_width=200).output
        for option in (w for w in words if w.startswith("--")):
            assert re.search(rf"{re.escape(option)}\b", help_text), f"{verb} has no {option}"


def test_attention_script_options_exist(script_help):
    words = _commands("scripts/gpu_attention.py")[0]
    help_text = script_help("scripts/gpu_attention.py")
    assert all(w in help_text for w in words if w.startswith("--"))
    assert "--device cuda" in SCRIPT.read_text() and "results/cuda" in SCRIPT.read_text()
