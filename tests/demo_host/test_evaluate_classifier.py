"""demo-host eval of a classifier: every model on the same stratified splits, scores refittable by hand."""

import json

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, log_loss
from sklearn.model_selection import train_test_split

from oretrofit.demo_host.evaluate_classifier import (BASELINES, DIGITS_ROWS, TEST_FRACTION, _baseline,
                                                     evaluate_classifier, load_classification, markdown_table)
from oretrofit.tabpfn import write_random_checkpoint


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    host = write_random_checkpoint(folder / "tabpfn-v3-host.ckpt", "small", seed=0, task="classifier")
    receipt = evaluate_classifier({"host": host}, ["sklearn:iris"], n_seeds=1, receipt_path=folder / "eval.json",
                                  log=lambda _: None)
    return folder, receipt


def test_every_model_is_scored_and_the_baseline_refits_by_hand(scored):
    folder, receipt = scored
    assert sorted(r["model"] for r in receipt["results"]) == sorted(["host", *BASELINES])
    assert all(0.0 <= r["accuracy"] <= 1.0 and np.isfinite(r["log_loss"]) for r in receipt["results"])
    X, y, info = load_classification("sklearn:iris")
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=TEST_FRACTION, random_state=0, stratify=y)
    model = _baseline("logistic_regression", 0).fit(X_tr, y_tr)
    (row,) = [r for r in receipt["results"] if r["model"] == "logistic_regression"]
    assert row["accuracy"] == accuracy_score(y_te, model.predict(X_te))
    assert row["log_loss"] == pytest.approx(log_loss(y_te, model.predict_proba(X_te)), rel=1e-12)
    assert receipt["datasets"]["sklearn:iris"] == info and info["n_classes"] == 3
    assert json.loads((folder / "eval.json").read_text())["summary"] == receipt["summary"]
    table = markdown_table(receipt)
    assert "| sklearn:iris |" in table and "stratified 70/30 splits over 1 split seeds" in table


def test_digits_is_its_first_rows_and_checksums_are_stable():
    X, y, info = load_classification("sklearn:digits")
    assert X.shape == (DIGITS_ROWS, 64) and info["n_classes"] == 10
    assert info["sha256"] == load_classification("sklearn:digits")[2]["sha256"]
    assert info["loader"] == f"load_digits(return_X_y=True)[:{DIGITS_ROWS}]"


@pytest.mark.parametrize("spec", ["sklearn:diabetes", "openml:61"])
def test_an_unknown_dataset_is_refused_naming_the_choices(spec):
    with pytest.raises(ValueError, match="sklearn:iris, sklearn:wine"):
        load_classification(spec)


def test_the_eval_verb_scores_a_classifier_checkpoint_with_its_random_reference(scored):
    import typer
    from typer.testing import CliRunner

    from oretrofit.cli.demo_host import register
    from oretrofit.demo_host.card_classifier import CLASSIFIER_NAME, RANDOM_NAME

    folder, _ = scored
    app = typer.Typer()
    register(app)
    args = ["demo-host", "eval", "--checkpoint", str(folder / "tabpfn-v3-host.ckpt"), "--datasets", "sklearn:wine",
            "--seeds", "1", "--out", str(folder / "cli.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    receipt = json.loads((folder / "cli.json").read_text())
    assert receipt["kind"] == "oretrofit.pretrain.classification"
    assert sorted(receipt["hosts"]) == sorted([CLASSIFIER_NAME, RANDOM_NAME])
    refused = CliRunner().invoke(app, [*args, "--max-train-rows", "20"])
    assert refused.exit_code == 2 and "--max-train-rows: regression options" in refused.output
