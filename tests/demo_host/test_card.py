"""The model card is generated from the run state and an evaluation receipt, targets judged from numbers."""

import dataclasses
import json

import pytest
import typer

from oretrofit.demo_host.card import HOST_NAME, compare_runs, targets_met, write_card
from oretrofit.demo_host.evaluate import BASELINES, markdown_table, summarise
from oretrofit.demo_host.train import CHECKPOINT_NAME, train

from .test_train import TINY

R2 = {"sklearn:diabetes": {HOST_NAME: 0.45, "ridge": 0.44, "gp_rbf_white": 0.46},
      "sklearn:friedman1": {HOST_NAME: 0.80, "random_forest": 0.77}}


def _receipt(checkpoint):
    rows = [{"dataset": d, "seed": s, "model": m, "r2": R2[d].get(m, 0.1) + 0.01 * s}
            for d in R2 for s in range(2) for m in (HOST_NAME, *BASELINES)]
    return {"schema_version": 1, "n_seeds": 2, "results": rows, "summary": summarise(rows),
            "hosts": {HOST_NAME: {"path": str(checkpoint), "sha256": "ab" * 32}}}


def test_targets_are_judged_from_the_receipt(tmp_path):
    checks = {(c["dataset"], c["baseline"]): c["met"] for c in targets_met(_receipt(tmp_path))}
    assert checks == {("sklearn:diabetes", "ridge"): True,
                      ("sklearn:diabetes", "gp_rbf_white"): False,
                      ("sklearn:friedman1", "random_forest"): True}


def test_card_holds_architecture_steps_curve_table_and_command(tmp_path):
    run = tmp_path / "run"
    train(run, dataclasses.replace(TINY, max_steps=2), progress=False)
    receipt = _receipt(run / CHECKPOINT_NAME)
    (tmp_path / "eval.json").write_text(json.dumps(receipt))
    card = write_card(run, tmp_path / "eval.json", tmp_path / "card.md",
                      training_command="oretrofit pretrain-demo --budget 1m --out run")
    text = card.read_text()
    png = tmp_path / "card-loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 steps in" in text and "over 1 stage(s)" in text and "](card-loss.png)" in text
    assert "| `embed_dim` | 16 |" in text and "| `max_rows` | 40 |" in text
    assert markdown_table(receipt) in text
    assert "oretrofit pretrain-demo --budget 1m --out run\n```" in text  # a receipt without provenance
    receipt["environment"] = {"command": "oretrofit pretrain-eval --checkpoint run.ckpt --out eval.json"}
    (tmp_path / "eval.json").write_text(json.dumps(receipt))
    recorded = write_card(run, tmp_path / "eval.json", tmp_path / "card.md",
                          training_command="oretrofit pretrain-demo --budget 1m --out run").read_text()
    assert "--out run\noretrofit pretrain-eval --checkpoint run.ckpt --out eval.json\n```" in recorded
    given = write_card(run, tmp_path / "eval.json", tmp_path / "card.md",
                       training_command="oretrofit pretrain-demo --budget 1m --out run\n"
                                        "oretrofit pretrain-eval --checkpoint run.ckpt --out eval.json   # scored"
                       ).read_text()
    assert given.count("oretrofit pretrain-eval --checkpoint run.ckpt --out eval.json") == 1
    assert "--out eval.json   # scored\n```" in given
    longer = write_card(run, tmp_path / "eval.json", tmp_path / "card.md",
                        training_command="oretrofit pretrain-eval --checkpoint run.ckpt --out eval.json --seeds 5"
                        ).read_text()  # another command that merely starts like the receipt's
    assert "--seeds 5\noretrofit pretrain-eval --checkpoint run.ckpt --out eval.json\n```" in longer
    assert "sklearn:diabetes: host 0.455 vs gp_rbf_white 0.465 — MISSED" in text
    assert "Inference config (preset `v2.5`, 8 estimators): tabpfn's v2.5 regression default" in text


def test_card_of_a_second_stage_reports_totals_and_each_stage(tmp_path):
    train(tmp_path / "one", dataclasses.replace(TINY, max_steps=2), progress=False)
    wider = dataclasses.replace(TINY.prior, noise_max=3.0)
    train(tmp_path / "two", dataclasses.replace(TINY, max_steps=1, lr=5e-4, prior=wider),
          init_from=tmp_path / "one", progress=False)
    (tmp_path / "eval.json").write_text(json.dumps(_receipt(tmp_path / "two" / CHECKPOINT_NAME)))
    text = write_card(tmp_path / "two", tmp_path / "eval.json", tmp_path / "card.md",
                      training_command="two stages").read_text()
    assert "3 steps in" in text and "over 2 stage(s)" in text
    assert "| 1 | 2 |" in text and "| 2 | 1 |" in text and "`noise_max` 1.0 → 3.0" in text
    assert "| `noise_max` | 3.0 |" in text


def test_card_reads_a_prior_field_an_earlier_stage_did_not_record_as_its_default(tmp_path):
    import torch

    from oretrofit.demo_host.train import STATE_NAME

    train(tmp_path / "one", dataclasses.replace(TINY, max_steps=1), progress=False)
    state = torch.load(tmp_path / "one" / STATE_NAME, weights_only=True)
    del state["train_config"]["prior"]["linear_max_interactions"]  # as a run from before the field existed
    torch.save(state, tmp_path / "one" / STATE_NAME)
    additive = dataclasses.replace(TINY.prior, linear_max_interactions=0)
    train(tmp_path / "two", dataclasses.replace(TINY, max_steps=1, prior=additive),
          init_from=tmp_path / "one", progress=False)
    (tmp_path / "eval.json").write_text(json.dumps(_receipt(tmp_path / "two" / CHECKPOINT_NAME)))
    text = write_card(tmp_path / "two", tmp_path / "eval.json", tmp_path / "card.md",
                      training_command="two stages").read_text()
    assert "| 1 | 1 |" in text and "`linear_max_interactions` 3 → 0" in text


def _run_receipt(host_r2, sha="ab", cap=None):
    receipt = _receipt("host.ckpt")
    for row in receipt["results"]:
        if row["model"] == HOST_NAME:
            row["r2"] = host_r2[row["dataset"]] + 0.01 * row["seed"]
    receipt["summary"] = summarise(receipt["results"])
    receipt["hosts"][HOST_NAME]["sha256"] = sha * 32
    receipt.update(test_fraction=0.3, max_train_rows=cap,
                   datasets={d: {"sha256": d[:4] * 16} for d in R2})
    return receipt


def test_runs_are_compared_by_host_r2_and_targets_met():
    a = _run_receipt({"sklearn:diabetes": 0.50, "sklearn:friedman1": 0.70}, sha="aa")
    b = _run_receipt({"sklearn:diabetes": 0.40, "sklearn:friedman1": 0.80}, sha="bb")
    b["hosts"][HOST_NAME]["inference"] = "plain"        # a receipt without the field predates presets: v2.5
    lines = compare_runs({"a": a, "b": b}).splitlines()
    assert lines[0] == "| run | checkpoint | inference | sklearn:diabetes | sklearn:friedman1 | mean | targets met |"
    # seeds 0 and 1 add 0 and 0.01: means 0.505/0.705 and 0.405/0.805; baselines ridge 0.445, gp 0.465, rf 0.775
    assert lines[2] == "| a | `aaaaaaaaaaaa` | `v2.5` | 0.505 | 0.705 | 0.605 | 2/3 |"
    assert lines[3] == "| b | `bbbbbbbbbbbb` | `plain` | 0.405 | 0.805 | 0.605 | 1/3 |"
    no_targets = json.loads(json.dumps(a).replace("friedman1", "friedman2").replace("diabetes", "friedman3"))
    assert compare_runs({"v": no_targets}).splitlines()[2].endswith("| 0.605 | – |")


def test_runs_scored_on_other_data_or_without_a_host_are_refused():
    a = _run_receipt({"sklearn:diabetes": 0.5, "sklearn:friedman1": 0.7})
    capped = _run_receipt({"sklearn:diabetes": 0.5, "sklearn:friedman1": 0.7}, cap=100)
    with pytest.raises(ValueError, match="other data or splits"):
        compare_runs({"a": a, "capped": capped})
    other_cpu = json.loads(json.dumps(a))
    other_cpu["datasets"]["sklearn:friedman1"]["sha256"] = "f" * 64
    with pytest.raises(ValueError, match=r"checksum of sklearn:friedman1 differs\); rescore both"):
        compare_runs({"a": a, "other CPU": other_cpu})
    baselines_only = json.loads(json.dumps(a))
    del baselines_only["hosts"][HOST_NAME]
    with pytest.raises(ValueError, match="scores no tabpfn_v3_demo"):
        compare_runs({"a": a, "baselines": baselines_only})
    with pytest.raises(ValueError, match="at least one"):
        compare_runs({})


def test_compare_cli_reads_labelled_receipts_and_names_a_missing_file(tmp_path):
    from typer.testing import CliRunner

    from oretrofit.cli.demo_host import register

    app = typer.Typer()
    register(app)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_run_receipt({"sklearn:diabetes": 0.5, "sklearn:friedman1": 0.7})))
    ok = CliRunner().invoke(app, ["demo-host", "compare", "--receipt", f"first={path}"])
    assert ok.exit_code == 0 and "| first |" in ok.output
    missing = CliRunner().invoke(app, ["demo-host", "compare", "--receipt", f"gone={tmp_path / 'no.json'}"])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad = CliRunner().invoke(app, ["demo-host", "compare", "--receipt", str(path)])
    assert bad.exit_code == 2 and "is not LABEL=PATH" in bad.output


@pytest.mark.parametrize("preset,line", [
    ("plain-x16", "Inference config (preset `plain-x16`, 16 estimators): standardised columns only"),
    ("custom", "Inference config (preset `custom`): a config that matches no oretrofit preset."),
])
def test_card_names_the_presets_ensemble_size(tmp_path, preset, line):
    run = tmp_path / "run"
    train(run, dataclasses.replace(TINY, max_steps=1), progress=False)
    receipt = _receipt(run / CHECKPOINT_NAME)
    receipt["hosts"][HOST_NAME]["inference"] = preset
    (tmp_path / "eval.json").write_text(json.dumps(receipt))
    text = write_card(run, tmp_path / "eval.json", tmp_path / "card.md", training_command="x").read_text()
    assert line in text
