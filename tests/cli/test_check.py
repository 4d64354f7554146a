"""`oretrofit check`: contracts of a tiny model saved with save_pretrained, as JSON and a table."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from oretrofit.cli import check as check_verb  # noqa: E402
from oretrofit.patches import transformers_zoo as zoo  # noqa: E402


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)          # keep `check` a sub-command
    check_verb.register(app)
    return app


def _saved(name: str, folder: Path) -> Path:
    arch = next(a for a in zoo.ARCHITECTURES + zoo.REFUSED if a.name == name)
    zoo.build(arch).save_pretrained(folder)
    return folder


def test_json_reports_every_contract_holding(cli: typer.Typer, tmp_path: Path) -> None:
    folder = _saved("Llama", tmp_path / "llama")
    result = CliRunner().invoke(cli, ["check", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["class"] == "LlamaModel" and summary["host"] == "transformers"
    assert [a["arm"] for a in summary["agreement"]] == ["oa", "full-o"]
    assert all(a["relative_max_diff"] <= 1e-4 and a["revert_bit_identical"]
               for a in summary["agreement"])
    inserted = summary["null_insertion"]
    assert inserted["where"] == "middle" and inserted["inserted_max_abs"] == 0
    assert inserted["old_max_delta"] <= 1e-4
    assert summary["null_insertion_unpatched"]["old_max_delta"] > 1e-3
    assert summary["padding_max_delta"] <= 1e-4 and summary["holds"]
    assert summary["environment"]["packages"]["transformers"]


def test_table_and_arm_oa_fails_null_insertion(cli: typer.Typer, tmp_path: Path) -> None:
    folder = _saved("BERT", tmp_path / "bert")
    table = CliRunner().invoke(cli, ["check", str(folder), "--arm", "full-o", "--tau", "1e-6"])
    assert table.exit_code == 0, table.output
    assert "τ→0 agreement, full-o" in table.output and "all contracts hold" in table.output
    oa = CliRunner().invoke(cli, ["check", str(folder), "--arm", "oa", "--json"])
    assert oa.exit_code == 1                           # oa leaves LayerNorm β: zeros move
    assert json.loads(oa.stdout)["null_insertion"]["inserted_max_abs"] > 0


def test_refused_and_missing_models_exit_2_with_the_reason(cli: typer.Typer,
                                                           tmp_path: Path) -> None:
    folder = _saved("Falcon", tmp_path / "falcon")
    refused = CliRunner().invoke(cli, ["check", str(folder)])
    assert refused.exit_code == 2 and "attention interface" in refused.output
    missing = CliRunner().invoke(cli, ["check", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "minilm, smollm2" in missing.output
