"""scripts/release_envs.py, shared by the release-compatibility sweeps: what its receipts show."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("release_envs", ROOT / "scripts" / "release_envs.py")
release_envs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(release_envs)


def test_pytest_summary_is_the_final_counts():
    output = "....F\nFAILED tests/x.py::t - AssertionError\n==== 1 failed, 4 passed, 2 warnings in 3.1s ===="
    assert release_envs.pytest_summary(output) == "1 failed, 4 passed, 2 warnings"
    assert release_envs.pytest_summary("ImportError while loading conftest") == "no summary"


def test_receipt_command_hides_machine_local_paths(tmp_path):
    command = release_envs.receipt_command("scripts/x.py", ["--venvs", str(tmp_path), "--releases",
                                                            "5.0.0"], {tmp_path: "VENVS"})
    assert command == "python scripts/x.py --venvs VENVS --releases 5.0.0"
    assert str(tmp_path) not in command


def test_markdown_table_escapes_cell_pipes():
    lines = release_envs.markdown_table(["a", "b"], [["x|y", 1]])
    assert lines == ["| a | b |", "| --- | --- |", "| x\\|y | 1 |"]
