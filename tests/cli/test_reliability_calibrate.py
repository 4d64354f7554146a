"""The reliability sweep of `oretrofit calibrate`, `check --spec` and `patch --spec` through the
real entry point: every refusal is one plain ``error:`` line naming the fix, given before any
calibration runs where it can be, and ``--out`` never replaces a file that is not a spec."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from .test_check import _saved, _with_tokenizer
from .test_reliability import _cli, _refused

ROOT = Path(__file__).resolve().parents[2]
DEMO_SPEC = ROOT / "results" / "demo-host" / "calibrated" / "spec-full-o.json"
TABPFN = ["calibrate", "--model-path", "demo", "--dataset", "sklearn:diabetes"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT (64 positions) with a word-level tokenizer."""
    return _with_tokenizer(_saved("BERT", tmp_path_factory.mktemp("bert") / "bert"))


@pytest.fixture()
def bert_spec(capsys, monkeypatch, bert: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bert-spec.json"
    code, _, err = _cli(capsys, monkeypatch, "calibrate", "--model", bert, "--out", out)
    assert code == 0 and out.is_file(), err
    return out


# --- calibrate --out ---------------------------------------------------------------------------

def test_out_is_checked_before_calibrating_and_never_replaces_another_file(capsys, monkeypatch,
                                                                          tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    _refused(_cli(capsys, monkeypatch, *TABPFN, "--out", folder),
             f"--out {folder} is a folder; give the spec's file path")
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    _refused(_cli(capsys, monkeypatch, *TABPFN, "--out", data),
             f"--out {data} exists and is not a patch spec", "choose another path")
    assert data.read_text() == "a,b\n1,2\n"                      # untouched
    _refused(_cli(capsys, monkeypatch, *TABPFN, "--out", data / "spec.json"),
             f"{data} is a file, not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv", "folder"]


def test_out_replaces_an_existing_spec_and_creates_missing_folders(capsys, monkeypatch, bert,
                                                                   tmp_path):
    out = tmp_path / "new" / "dir" / "spec.json"
    assert _cli(capsys, monkeypatch, "calibrate", "--model", bert, "--out", out)[0] == 0
    code, stdout, _ = _cli(capsys, monkeypatch, "calibrate", "--model", bert, "--delta", "0.01",
                           "--out", out)
    assert code == 0 and "spec written to" in stdout
    assert json.loads(out.read_text())["calibration"]["delta"] == 0.01
    assert [p.name for p in out.parent.iterdir()] == ["spec.json"]     # no temporary left


# --- calibrate, TabPFN v3 form -----------------------------------------------------------------

def test_tabpfn_data_refusals_name_the_dataset_and_the_fix(capsys, monkeypatch, tmp_path):
    out = tmp_path / "spec.json"
    _refused(_cli(capsys, monkeypatch, *TABPFN, "--seed", "-1", "--out", out),
             "dataset sklearn:diabetes: a split seed is an integer >= 0, got -1")
    tiny = tmp_path / "tiny.csv"
    pd.DataFrame({"a": [1.0, 2.0], "y": [1.0, 2.0]}).to_csv(tiny, index=False)
    _refused(_cli(capsys, monkeypatch, "calibrate", "--model-path", "demo", "--dataset",
                  f"file:{tiny}#y", "--out", out), "TabPFN needs at least 2",
             "use a table with at least 4 rows")
    constant = tmp_path / "constant.csv"
    pd.DataFrame({"a": np.zeros(40), "y": np.arange(40.0)}).to_csv(constant, index=False)
    _refused(_cli(capsys, monkeypatch, "calibrate", "--model-path", "demo", "--dataset",
                  f"file:{constant}#y", "--out", out),
             f"TabPFN cannot fit the train rows of file:{constant}#y (seed 11)",
             "calibrate on a dataset it can fit")
    assert not out.exists()


# --- calibrate, transformers form --------------------------------------------------------------

def test_text_files_that_are_not_text_are_named(capsys, monkeypatch, bert, tmp_path):
    out = tmp_path / "spec.json"
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    _refused(_cli(capsys, monkeypatch, "calibrate", "--model", bert, "--text-file", latin1,
                  "--out", out), f"--text-file {latin1} is not UTF-8 text", "give a UTF-8")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n")
    _refused(_cli(capsys, monkeypatch, "calibrate", "--model", bert, "--text-file", blank,
                  "--out", out), "no non-blank line")
    assert not out.exists()


def test_long_lines_are_cut_to_the_models_positions(capsys, monkeypatch, bert, tmp_path):
    """A line longer than the model's 64 positions was a RuntimeError from the embeddings."""
    long = tmp_path / "long.txt"
    long.write_text(("the cat sat on the mat " * 400 + "\n") * 2)
    out = tmp_path / "spec.json"
    assert _cli(capsys, monkeypatch, "calibrate", "--model", bert, "--text-file", long,
                "--out", out)[0] == 0
    data = json.loads(out.read_text())["calibration"]["data"]
    assert data["max_tokens"] == 64 and data["tokens"] == 2 * 64
    _refused(_cli(capsys, monkeypatch, "calibrate", "--model", bert, "--text-file", long,
                  "--max-tokens", "100000", "--out", tmp_path / "other.json"),
             "max_tokens 100000 exceeds the 64 positions BertModel takes",
             "use --max-tokens 64 or fewer")


def test_a_text_past_the_token_budget_is_read_up_to_it_with_a_note(capsys, monkeypatch, bert,
                                                                    tmp_path):
    """A text of any length costs the budget: the calibration says where the budget cut it and
    which option raises it, and the spec records it."""
    text = tmp_path / "many.txt"
    text.write_text("the cat sat on the mat\n" * 5000)
    out = tmp_path / "spec.json"
    code, stdout, err = _cli(capsys, monkeypatch, "calibrate", "--model", bert, "--text-file",
                             text, "--token-budget", "400", "--out", out)
    assert code == 0 and "spec written to" in stdout
    data = json.loads(out.read_text())["calibration"]["data"]
    assert data["budget_reached"] is True and data["token_budget"] == 400
    assert (data["rows"], data["tokens"]) == (66, 396)          # 6 words a line (no specials)
    assert (f"note: the calibration text was read up to the token budget of 400 tokens: τ is "
            f"calibrated on its first 66 non-blank lines (396 tokens) and the rest was not read; "
            f"raise the budget (token_budget=, --token-budget)") in err
    _refused(_cli(capsys, monkeypatch, "calibrate", "--model", bert, "--text-file", text,
                  "--token-budget", "0", "--out", tmp_path / "other.json"),
             "token_budget must be an integer of at least the 64 tokens a line may keep, got 0")
    _refused(_cli(capsys, monkeypatch, "calibrate", "--model-path", "demo", "--dataset",
                  "sklearn:diabetes", "--token-budget", "10", "--out", tmp_path / "t.json"),
             "--token-budget belong to the transformers form")


# --- check --spec and patch --spec -------------------------------------------------------------

def test_check_refuses_a_spec_of_another_model_naming_it(capsys, monkeypatch, bert, bert_spec,
                                                          tmp_path):
    llama = _with_tokenizer(_saved("Llama", tmp_path / "llama"))
    _refused(_cli(capsys, monkeypatch, "check", llama, "--spec", bert_spec),
             "the patch spec (made for host 'transformers', a BertModel) does not apply to this "
             "LlamaModel", "re-create it from this model")
    _refused(_cli(capsys, monkeypatch, "check", bert, "--spec", DEMO_SPEC),
             "made for host 'tabpfn-v3', but this BertModel is patched by host 'transformers'")
    other = _with_tokenizer(_saved("BERT", tmp_path / "bert-other", seed=1))
    _refused(_cli(capsys, monkeypatch, "check", other, "--spec", bert_spec),
             "the spec was calibrated on other weights")


@pytest.mark.parametrize("edit, message", [
    ({"site_tau": [1]}, "site_tau must be an object of pattern -> τ"),
    ({"targets": "icl.*", "site_tau": {}}, "targets must be a list of site names or patterns"),
    ({"calibration": {"data": "x"}}, "calibration record must be an object"),
    ({"tau": float("nan")}, "tau must be a positive finite number")])
def test_patch_and_check_refuse_a_spec_entry_of_the_wrong_type(capsys, monkeypatch, bert,
                                                               tmp_path, edit, message):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**json.loads(DEMO_SPEC.read_text()), **edit}))
    _refused(_cli(capsys, monkeypatch, "patch", "--model-path", "demo", "--spec", spec),
             message, "re-create the spec")
    _refused(_cli(capsys, monkeypatch, "check", bert, "--spec", spec), message)


def test_patch_refuses_a_transformers_spec_naming_both_hosts(capsys, monkeypatch, bert_spec):
    _refused(_cli(capsys, monkeypatch, "patch", "--model-path", "demo", "--spec", bert_spec),
             "made for host 'transformers', but this TabPFNV3 is patched by host 'tabpfn-v3'")
