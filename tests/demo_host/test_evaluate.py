"""pretrain-eval: every model on the same splits, train-row caps, baseline reuse only when comparable."""

import json
import os
import re

import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from oretrofit._files.provenance import portable
from oretrofit.demo_host.evaluate import BASELINES, TEST_FRACTION, _baseline, evaluate, markdown_table
from oretrofit.regress.data import load_dataset
from oretrofit.regress.protocol import rmse_r2
from oretrofit.tabpfn import write_random_checkpoint

CAP = 30


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    host = write_random_checkpoint(folder / "tabpfn-v3-host.ckpt", "small", seed=0)
    receipt = evaluate({"host": host}, ["sklearn:diabetes"], n_seeds=1, receipt_path=folder / "capped.json",
                       max_train_rows=CAP, log=lambda _: None)
    return folder, host, receipt


def test_every_model_is_scored_on_the_capped_split(capped):
    _, _, receipt = capped
    assert receipt["max_train_rows"] == CAP
    assert sorted(r["model"] for r in receipt["results"]) == sorted(["host", *BASELINES])
    assert all(np.isfinite(r["r2"]) for r in receipt["results"])
    # Ridge refitted by hand on the split's first CAP train rows gives the receipt's R² exactly.
    data = load_dataset("sklearn:diabetes")
    X_tr, X_te, y_tr, y_te = train_test_split(data.X, data.y, test_size=TEST_FRACTION, random_state=0)
    ridge = _baseline("ridge", 0, data.X.shape[1]).fit(X_tr[:CAP], y_tr[:CAP])
    expected = rmse_r2(y_te, ridge.predict(X_te))[1]
    (row,) = [r for r in receipt["results"] if r["model"] == "ridge"]
    assert row["r2"] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert "train rows capped at 30" in markdown_table(receipt)


def test_baselines_are_reused_only_under_the_same_cap(capped):
    folder, host, receipt = capped
    again = evaluate({"host": host}, ["sklearn:diabetes"], n_seeds=1, reuse_baselines=folder / "capped.json",
                     max_train_rows=CAP, log=lambda _: None)
    reused = {r["model"]: r for r in again["results"] if r.get("reused")}
    assert sorted(reused) == sorted(BASELINES)
    assert again["baselines_reused_from"]["path"] == portable(folder / "capped.json")  # no local path
    first = {r["model"]: r["r2"] for r in receipt["results"]}
    assert all(reused[m]["r2"] == first[m] for m in BASELINES)
    other_cap = evaluate({}, ["sklearn:diabetes"], n_seeds=1, reuse_baselines=folder / "capped.json",
                         max_train_rows=CAP + 10, log=lambda _: None)
    assert not any(r.get("reused") for r in other_cap["results"])
    assert other_cap["baselines_reused_from"] is None
    assert json.loads((folder / "capped.json").read_text())["max_train_rows"] == CAP


def test_a_cap_below_two_rows_is_refused():
    with pytest.raises(ValueError, match="max_train_rows must be at least 2"):
        evaluate({}, ["sklearn:diabetes"], max_train_rows=1)


def test_an_inference_preset_without_a_host_is_refused():
    """``demo-host eval --inference v2 --out R`` without --checkpoint ran the baselines and
    recorded nothing of the preset."""
    with pytest.raises(ValueError, match="inference preset 'v2' is for the hosts, and none is "
                                         "given.*--checkpoint"):
        evaluate({}, ["sklearn:diabetes"], inference="v2")


@pytest.mark.parametrize("text, message", [
    ('{"hosts": ', "the receipt {path} is not valid JSON (line 1, column 11: Expecting value"),
    ('{"hosts": {}, "hosts": {}}', "the receipt {path} gives the key 'hosts' twice in one "
                                   "object"),
    ("[1]", "not a `demo-host eval` receipt (a JSON object with hosts, summary; it lacks "
            "hosts, summary)")])
def test_a_receipt_that_is_not_one_is_named_by_the_option_that_gave_it(tmp_path, text, message):
    """`demo-host compare` / `eval --reuse-baselines` said "Expecting value: line 1 ..." or
    "AttributeError: 'list' object has no attribute 'get'", naming neither file nor option; a
    key given twice was kept silently (the receipt is read by the one strict parse)."""
    from oretrofit.demo_host.documents import labelled_receipts
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        labelled_receipts([f"run={path}"])
    assert str(refused.value).startswith(f"--receipt run={path}: {message.format(path=path)}")
    assert "written by `oretrofit demo-host eval --out`" in str(refused.value)
    with pytest.raises(ValueError, match=f"^--reuse-baselines {path}: "):
        evaluate({}, ["sklearn:diabetes"], n_seeds=1, reuse_baselines=path)


@pytest.mark.parametrize("make, what", [(os.mkfifo, "is a named pipe (FIFO), not a regular file"),
                                        (os.mkdir, "is a folder, not a regular file"),
                                        (lambda path: None, "does not exist")])
def test_a_receipt_that_is_no_file_is_named_for_what_it_is(tmp_path, make, what):
    """`demo-host compare --receipt run=FIFO` said "does not exist" (a folder too)."""
    from oretrofit.demo_host.documents import labelled_receipts
    path = tmp_path / "r.json"
    make(path)
    with pytest.raises(ValueError, match=rf"^--receipt run={path}: the receipt {path} "
                                         rf"{re.escape(what)}; give a receipt written by"):
        labelled_receipts([f"run={path}"])
