"""`oretrofit check`: contracts of a tiny model saved with save_pretrained, as JSON and a table."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from oretrofit.cli import calibrate as calibrate_verb  # noqa: E402
from oretrofit.cli import check as check_verb  # noqa: E402
from hosts.transformers import zoo  # noqa: E402


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)          # keep `check` a sub-command
    check_verb.register(app)
    calibrate_verb.register(app)
    return app


def _saved(name: str, folder: Path, seed: int = 0) -> Path:
    arch = next(a for a in zoo.ARCHITECTURES + zoo.REFUSED if a.name == name)
    zoo.build(arch, seed).save_pretrained(folder)
    return folder


def _with_tokenizer(folder: Path) -> Path:
    """Save a word-level tokenizer beside a tiny model: the built-in calibration text's first
    words (ids 4…) within the model's vocabulary of 99, every other word [UNK]."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from oretrofit.hosts.transformers.calibrate import builtin_texts
    words = sorted({w for line in builtin_texts() for w in line.split()})[:90]
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3,
             **{w: i + 4 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                            pad_token="[PAD]").save_pretrained(folder)
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
    folder = _saved("Mamba", tmp_path / "mamba")
    refused = CliRunner().invoke(cli, ["check", str(folder)])
    assert refused.exit_code == 2 and "attention interface" in refused.output
    missing = CliRunner().invoke(cli, ["check", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "minilm, smollm2" in missing.output


@pytest.mark.parametrize("verb", [["check", "--json"], ["calibrate", "--out", "spec.json"]])
def test_a_nan_weight_is_named_before_anything_is_measured(cli: typer.Typer, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           verb: list[str]) -> None:
    """`check` reported "agreement 0.0" and "revert not bit-identical", never naming the weight,
    and its JSON held a bare NaN; `calibrate` said a site "saw no non-zero carrier"."""
    import torch
    arch = next(a for a in zoo.ARCHITECTURES if a.name == "Llama")
    model = zoo.build(arch, 0)
    with torch.no_grad():
        model.get_parameter("layers.1.mlp.up_proj.weight")[0, :3] = float("nan")
        model.get_parameter("norm.weight")[0] = float("inf")
    folder = tmp_path / "llama"
    model.save_pretrained(folder)
    _with_tokenizer(folder)
    monkeypatch.chdir(tmp_path)
    args = [verb[0], str(folder), *verb[1:]] if verb[0] == "check" else [
        verb[0], "--model", str(folder), *verb[1:]]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and result.stdout == ""
    message = " ".join(result.output.split())
    assert "2 weight(s) hold NaN or infinite values: layers.1.mlp.up_proj.weight (3 of " in message
    assert "norm.weight (1 of " in message and "no contract can be measured and no τ" in message
    assert not (tmp_path / "spec.json").exists()


def test_calibrate_then_check_under_the_spec(cli: typer.Typer, tmp_path: Path) -> None:
    folder = _with_tokenizer(_saved("Llama", tmp_path / "llama"))
    spec_file = tmp_path / "spec.json"
    made = CliRunner().invoke(cli, ["calibrate", "--model", str(folder), "--out", str(spec_file)])
    assert made.exit_code == 0, made.output
    spec = json.loads(spec_file.read_text())
    data = spec["calibration"]["data"]
    assert data["texts"] == "built-in" and data["rows"] == data["batches"] >= 30
    assert len(data["texts_sha256"]) == 64 and data["tokens"] > data["rows"]
    assert spec["host"] == "transformers" and set(spec["site_tau"]) == set(spec["sites"])
    assert min(spec["site_tau"].values()) > 1e-6 and len(set(spec["site_tau"].values())) > 3

    result = CliRunner().invoke(cli, ["check", str(folder), "--spec", str(spec_file), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["spec"]["site_tau"] == spec["site_tau"] and summary["holds"]
    assert [a["arm"] for a in summary["agreement"]] == ["full-o"]
    assert summary["null_insertion"]["inserted_max_abs"] == 0
    assert summary["null_insertion"]["old_max_delta"] <= 1e-4
    table = CliRunner().invoke(cli, ["check", str(folder), "--spec", str(spec_file)])
    assert table.exit_code == 0 and "spec spec.json" in table.output

    lines = tmp_path / "lines.txt"
    lines.write_text("The cat sits outside.\n\nA man is playing a guitar on the street.\n")
    own = tmp_path / "own.json"
    made = CliRunner().invoke(cli, ["calibrate", "--model", str(folder), "--text-file", str(lines),
                                    "--max-tokens", "4", "--out", str(own)])
    assert made.exit_code == 0, made.output
    data = json.loads(own.read_text())["calibration"]["data"]
    assert data["texts"] == str(lines) and data["rows"] == 2 and data["tokens"] == 8

    # --exclude leaves sites out of the calibration and the spec, which records the pattern
    fewer = tmp_path / "fewer.json"
    made = CliRunner().invoke(cli, ["calibrate", "--model", str(folder), "--text-file", str(lines),
                                    "--exclude", "*.mlp", "--out", str(fewer)])
    assert made.exit_code == 0, made.output
    excluded = json.loads(fewer.read_text())
    assert excluded["exclude"] == ["*.mlp"]
    assert set(excluded["site_tau"]) == {s for s in spec["site_tau"] if not s.endswith(".mlp")}
    assert len(excluded["site_tau"]) < len(spec["site_tau"])


def test_a_spec_for_another_model_is_refused(cli: typer.Typer, tmp_path: Path) -> None:
    folder = _with_tokenizer(_saved("Llama", tmp_path / "llama"))
    spec_file = tmp_path / "spec.json"
    made = CliRunner().invoke(cli, ["calibrate", "--model", str(folder), "--out", str(spec_file)])
    assert made.exit_code == 0, made.output
    for other, message in ((_saved("Llama", tmp_path / "other", seed=1), "other weights"),
                           (_saved("BERT", tmp_path / "bert"), "does not apply to this BertModel")):
        refused = CliRunner().invoke(cli, ["check", str(other), "--spec", str(spec_file)])
        assert refused.exit_code == 2 and message in refused.output, refused.output
    for flags in (["--tau", "1e-6"], ["--arm", "full-o"]):
        mixed = CliRunner().invoke(cli, ["check", str(folder), "--spec", str(spec_file), *flags])
        assert mixed.exit_code == 2 and f"drop {flags[0]}" in mixed.output
