"""`oretrofit check`: contracts and answers of a tiny model saved with save_pretrained, as JSON and
a table, at the settings given or the library's (the real SmolLM2: test_check_smollm2.py)."""

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
from hosts.transformers.tiny_text import word_tokenizer  # noqa: E402


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
    """Save a word-level tokenizer beside a tiny model (:func:`word_tokenizer`)."""
    word_tokenizer().save_pretrained(folder)
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
    assert "agreement, full-o" in table.output and "all contracts hold" in table.output
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
    assert data["texts"] == "built-in" and data["rows"] >= 30 and data["budget_reached"] is False
    assert 1 <= data["batches"] < data["rows"]           # one forward per length of line
    assert len(data["texts_sha256"]) == 64 and data["tokens"] > data["rows"]
    assert spec["host"] == "transformers" and set(spec["site_tau"]) == set(spec["sites"])
    assert min(spec["site_tau"].values()) > 1e-6 and len(set(spec["site_tau"].values())) > 3

    # measured as the spec runs, each site at its calibrated τ (≥ 5e-5 here, the tiny model's
    # carriers being small): null insertion exact and the embeddings kept, while the hidden
    # states move by more than agreement's 1e-4 (each gate by up to the calibration's δ = 1e-3)
    result = CliRunner().invoke(cli, ["check", str(folder), "--spec", str(spec_file), "--json"])
    summary = json.loads(result.stdout)
    assert summary["spec"]["site_tau"] == spec["site_tau"] and summary["eps"] == spec["eps"]
    assert [a["arm"] for a in summary["agreement"]] == ["full-o"]
    assert summary["null_insertion"]["inserted_max_abs"] == 0
    assert summary["null_insertion"]["old_max_delta"] <= 1e-4
    assert summary["answers"]["arms"][0]["min_cosine"] >= 0.999999
    assert 1e-4 < summary["agreement"][0]["relative_max_diff"] < 1e-2
    assert result.exit_code == 1 and [f.split(":")[0] for f in summary["failed"]] == [
        "agreement (full-o"]
    table = CliRunner().invoke(cli, ["check", str(folder), "--spec", str(spec_file)])
    assert table.exit_code == 1 and "spec spec.json" in table.output

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


def test_settings_default_to_the_librarys_and_eps_is_an_option(cli: typer.Typer,
                                                               tmp_path: Path) -> None:
    import inspect

    from oretrofit import retrofit
    folder = _saved("Llama", tmp_path / "llama")
    defaults = inspect.signature(retrofit).parameters
    summary = json.loads(CliRunner().invoke(cli, ["check", str(folder), "--json"]).stdout)
    assert (summary["tau"], summary["eps"]) == (defaults["tau"].default, defaults["eps"].default)
    assert all((a["tau"], a["eps"]) == (summary["tau"], summary["eps"])
               for a in summary["agreement"])
    assert summary["answers"] is None            # no tokenizer in the folder
    given = json.loads(CliRunner().invoke(cli, ["check", str(folder), "--arm", "full-o", "--tau",
                                                "1e-7", "--eps", "1e-9", "--json"]).stdout)
    assert given["arms"] == ["full-o"] and (given["tau"], given["eps"]) == (1e-7, 1e-9)
    assert given["agreement"][0]["eps"] == 1e-9 and given["holds"]


def test_a_setting_that_moves_the_answers_fails_naming_the_sites(cli: typer.Typer,
                                                                 tmp_path: Path) -> None:
    """ε far above the rows' mass Σ_j e^{s_ij} silences every head: the sentence embeddings (a
    folder's AutoModel has no LM head) turn away and the attention sites are named."""
    folder = _with_tokenizer(_saved("Llama", tmp_path / "llama"))
    lines = tmp_path / "prompts.txt"
    lines.write_text("The cat sits outside.\n\nA man is playing a guitar on the street.\n")
    kept = CliRunner().invoke(cli, ["check", str(folder), "--text-file", str(lines), "--json"])
    assert kept.exit_code == 0, kept.output
    answers = json.loads(kept.stdout)["answers"]
    assert answers["kind"] == "embed" and answers["prompts"] == 2
    assert all(a["min_cosine"] >= 0.999999 and a["sites"] == [] for a in answers["arms"])
    moved = CliRunner().invoke(cli, ["check", str(folder), "--arm", "oa", "--eps", "1e3",
                                     "--text-file", str(lines), "--json"])
    assert moved.exit_code == 1
    summary = json.loads(moved.stdout)
    arm = summary["answers"]["arms"][0]
    assert arm["min_cosine"] < 0.999 and len(arm["sites"]) == 2       # 2 attention sites
    assert {s["site"] for s in arm["sites"]} == {"layers.0.self_attn", "layers.1.self_attn"}
    assert any(f.startswith("answers (oa: min cosine ") and "layers.0.self_attn (" in f
               for f in summary["failed"]), summary["failed"]
    table = CliRunner().invoke(cli, ["check", str(folder), "--arm", "oa", "--eps", "1e3",
                                     "--text-file", str(lines)])
    text = " ".join(table.output.split())
    assert table.exit_code == 1 and "moved most by layers.0.self_attn (0." in text
    assert "some contracts do not hold" in text


def test_text_file_needs_a_tokenizer_and_spec_excludes_eps(cli: typer.Typer,
                                                           tmp_path: Path) -> None:
    folder = _saved("Llama", tmp_path / "llama")
    lines = tmp_path / "prompts.txt"
    lines.write_text("The cat sits outside.\n")
    result = CliRunner().invoke(cli, ["check", str(folder), "--text-file", str(lines)])
    assert result.exit_code == 2 and "holds no tokenizer" in result.output
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    result = CliRunner().invoke(cli, ["check", str(_with_tokenizer(folder)), "--text-file",
                                      str(empty)])
    assert result.exit_code == 2 and "holds no prompt" in result.output
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    mixed = CliRunner().invoke(cli, ["check", str(folder), "--spec", str(spec), "--eps", "0"])
    assert mixed.exit_code == 2 and "drop --eps" in mixed.output
