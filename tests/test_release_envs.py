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


def test_tabpfn_compat_has_a_column_per_model_version(sweep_script):
    """The sweep's columns are the model versions of the host's table, and so is the receipt's
    header."""
    from oretrofit.hosts.tabpfn.versions import VERSIONS
    compat = sweep_script("tabpfn_compat")
    labels = tuple(v.label for v in VERSIONS)
    assert compat.LABELS == labels
    header = next(line for line in (ROOT / "results" / "tabpfn-compat.md").read_text().splitlines()
                  if line.startswith("| tabpfn |"))
    cells = [cell.strip() for cell in header.strip("|").split("|")]
    assert cells[5:5 + len(labels)] == list(labels)


def test_first_releases_are_the_receipts():
    """Each model version's ``first_release`` is the oldest release whose column in
    results/tabpfn-compat.md shows it retrofitted (a refused row: refused); ``-``: the release
    does not ship it, ``refused`` on a retrofitted row: a release the gate refuses ships it."""
    from packaging.version import Version

    from oretrofit.hosts.tabpfn.versions import VERSIONS
    lines = [line for line in (ROOT / "results" / "tabpfn-compat.md").read_text().splitlines()
             if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    for version in VERSIONS:
        column = header.index(version.label)
        shipped = [row[0] for row in rows if (row[column] == "refused") == (version.sites is None)
                   and row[column] != "-" and not row[column].startswith("not run")]
        assert min(shipped, key=Version) == version.first_release, version.label


def test_a_local_build_is_its_release():
    """``torch==2.13.0`` installs ``2.13.0+cpu`` from a CPU index: the layer has the release."""
    assert release_envs.same_release("2.13.0+cpu", "2.13.0")
    assert release_envs.same_release("2.14.1", "2.14.1")
    assert not release_envs.same_release("2.14.1+cu130", "2.14.0")
    assert not release_envs.same_release("2.13.0+cpu", "2.13.0+cu130")


def test_pytest_failures_are_the_short_summary_lines():
    output = "..F\nFAILED tests/x.py::t - AssertionError\nERROR tests/y.py - ImportError\n1 failed"
    assert release_envs.pytest_failures(output) == ["FAILED tests/x.py::t - AssertionError",
                                                    "ERROR tests/y.py - ImportError"]


def _make_list(name: str) -> list[str]:
    """The Makefile variable ``name`` (``:=``, ``\\``-continued) as its words."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith(f"{name} :="))
    return line.split(":=", 1)[1].split()


def test_the_sweeps_run_the_makefile_s_tests(sweep_script):
    """Each release sweep runs the test files its Makefile target runs on one release."""
    assert sweep_script("transformers_compat").TESTS == _make_list("TRANSFORMERS_TESTS")
    assert sweep_script("tabdpt_compat").TESTS == _make_list("TABDPT_TESTS")
    assert sweep_script("tabpfn_compat").TESTS == _make_list("TABPFN_TESTS")
    assert sweep_script("autogluon_compat").TESTS == _make_list("MITRA_TESTS")


def test_transformers_receipt_names_the_tests_of_each_row(sweep_script):
    """Rows that ran different test files (an older sweep's kept beside a rerun) each say which."""
    compat = sweep_script("transformers_compat")
    row = {"ok": True, "tests": "1 passed", "failures": [], "layer": [], "torch": "2.13.0",
           "wall_s": 1}
    rows = [{**row, "release": "4.53.3", "test_files": ["a.py"], "commit": "abc1234"},
            {**row, "release": "5.25.0", "test_files": ["a.py", "b.py"], "commit": "def5678"}]
    text = compat.render(rows, "python scripts/transformers_compat.py", "def5678")
    assert "A = `a.py`; B = `a.py`, `b.py`" in text
    assert "| 4.53.3 | pass | A |" in text and "| 5.25.0 | pass | B |" in text


def test_kept_tests_are_marked_with_the_commit_they_ran_on(sweep_script):
    """``--keep-tests``: a release's earlier passing test run stands for step 1, its cell marked
    with that run's commit (once, however often it is kept); a failed one is run again."""
    compat = sweep_script("tabpfn_compat")
    earlier = {"release": "8.0.1", "tests": "126 passed, 11 skipped", "tests_rc": 0,
               "failures": [], "from_commit": "ee1c536"}
    kept = compat._kept_tests(earlier)
    assert kept == {"tests": "126 passed, 11 skipped (ee1c536)", "tests_rc": 0, "failures": [],
                    "tests_commit": "ee1c536"}
    assert compat._kept_tests({**earlier, **kept, "from_commit": "abc1234"}) == kept
    assert compat._kept_tests({**earlier, "tests_rc": 1}) is None
    assert compat._kept_tests(None) is None
    row = {**earlier, **kept, "ok": True, "diabetes": {}, "demo": "runs", "torch": "2.13.0",
           "wall_s": 1}
    del row["from_commit"]
    text = compat.render([row], "python scripts/tabpfn_compat.py --keep-tests", "abc1234")
    assert "- a TabPFN tests cell followed by `(COMMIT)` ran on that commit" in text
    assert "| 8.0.1 | pass | 126 passed, 11 skipped (ee1c536) |" in text
