"""The verb structure: product verbs first, the paper's runners under `reproduce`, the demo host's
tools under `demo-host`, the old names as hidden aliases, every help a screen, no torch for --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from oretrofit.cli._aliases import fixed
from oretrofit.cli.app import app
from oretrofit.cli.demo_host import RENAMED

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["patch", "check", "calibrate", "regress", "reproduce", "tables", "sweep", "experiment"]


def _invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _paths(command=None, path=()):
    """Every command path under the app, groups included (hidden aliases too)."""
    command = command or get_command(app)
    yield list(path)
    for name in getattr(command, "commands", {}):
        yield from _paths(command.commands[name], (*path, name))


def test_help_lists_the_product_verbs_first_and_no_pretrain_verb() -> None:
    result = _invoke("--help")
    assert result.exit_code == 0
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed[:len(PRODUCT)] == PRODUCT and listed[-1] == "demo-host"
    assert not [name for name in listed if name.startswith("pretrain")]


def test_reproduce_groups_the_paper_runners() -> None:
    listed = _invoke("reproduce", "--help").output.split("Commands:")[1]
    assert [line.split()[0] for line in listed.splitlines() if line.strip()] == [
        "table2", "table7", "matrix", "tables", "study", "operators", "hosts"]
    table2 = _invoke("reproduce", "table2", "--help").output
    assert "TABLE" not in table2 and "--offline-standins" in table2  # the preset is fixed, the rest is regress's


def test_demo_host_group_holds_the_training_tools() -> None:
    listed = _invoke("demo-host", "--help").output.split("Commands:")[1]
    assert [line.split()[0] for line in listed.splitlines() if line.strip()] == [
        "train", "export", "average", "eval", "card", "compare"]


@pytest.mark.parametrize("path", [p for p in _paths() if p], ids=" ".join)
def test_every_verbs_help_fits_a_screen(path: list[str]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) <= 50, result.output


@pytest.mark.parametrize("old", [*RENAMED, "pretrain-refresh-docs"])
def test_old_names_are_hidden_aliases_that_print_the_new_name(old: str) -> None:
    assert old not in _invoke("--help").output
    result = _invoke(old, "--help")
    assert result.exit_code == 0 and "Renamed:" in result.output


def test_an_alias_runs_the_new_verb_and_says_its_name(tmp_path) -> None:
    old = _invoke("pretrain-compare", "--receipt", f"gone={tmp_path / 'no.json'}")
    new = _invoke("demo-host", "compare", "--receipt", f"gone={tmp_path / 'no.json'}")
    assert old.exit_code == new.exit_code == 2 and "no.json does not exist" in old.stderr
    assert "`oretrofit pretrain-compare` is now `oretrofit demo-host compare`" in old.stderr
    assert "is now" not in new.stderr


def test_reproduce_operators_and_study_are_the_runners_own_commands(tmp_path) -> None:
    result = _invoke("reproduce", "operators", "--quick", "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["quick"] is True and (tmp_path / "operators-quick.md").is_file()
    bad = _invoke("reproduce", "study", "nope", "--out", tmp_path)
    assert bad.exit_code == 2 and "'nope' is not one of adapters" in bad.output


def test_fixed_sets_an_argument_and_drops_it_from_the_command_line() -> None:
    seen = {}

    def run(table: str = typer.Argument(...), seeds: str = typer.Option("1", "--seeds")) -> None:
        seen.update(table=table, seeds=seeds)

    group = typer.Typer()
    group.command("a")(fixed(run, table="t2"))
    group.command("b")(lambda: None)
    assert CliRunner().invoke(group, ["a", "--seeds", "7"]).exit_code == 0
    assert seen == {"table": "t2", "seeds": "7"}
    assert CliRunner().invoke(group, ["a", "x"]).exit_code == 2  # no TABLE argument any more


def test_version_prints_the_package_version() -> None:
    from oretrofit import __version__
    result = _invoke("--version")
    assert result.exit_code == 0 and result.output == f"oretrofit {__version__}\n"


def test_help_does_not_import_torch() -> None:
    code = ("import sys\nfrom oretrofit.cli.app import main\nsys.argv = ['oretrofit', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('torch loaded' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert "Commands:" in done.stdout and done.stderr.strip().splitlines()[-1] == "no torch", done.stderr


def test_hosts_report_module_still_runs_as_before() -> None:
    done = subprocess.run([sys.executable, "-m", "oretrofit.hosts.transformers.report", "--help"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert done.returncode == 0 and "--out" in done.stdout
