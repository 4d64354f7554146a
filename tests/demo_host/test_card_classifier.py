"""The classifier's card: read from its run, the regressor it started from and its evaluation receipt."""

import dataclasses
import json

import pytest

from oretrofit._files.provenance import sha256_file
from oretrofit.demo_host.card_classifier import CLASSIFIER_NAME, RANDOM_NAME, beats_random, write_classifier_card
from oretrofit.demo_host.evaluate import summarise
from oretrofit.demo_host.evaluate_classifier import markdown_table
from oretrofit.demo_host.train import export_checkpoint, train

from .test_train import TINY

SCORES = {"sklearn:iris": {CLASSIFIER_NAME: (0.9, 0.3), RANDOM_NAME: (0.33, 1.1), "logistic_regression": (0.95, 0.2)},
          "sklearn:wine": {CLASSIFIER_NAME: (0.5, 1.2), RANDOM_NAME: (0.4, 1.1), "logistic_regression": (0.97, 0.1)}}


def _receipt(checkpoint):
    rows = [{"dataset": d, "seed": s, "model": m, "accuracy": acc + 0.01 * s, "log_loss": loss}
            for d, by_model in SCORES.items() for s in range(2) for m, (acc, loss) in by_model.items()]
    return {"kind": "oretrofit.pretrain.classification", "n_seeds": 2, "results": rows,
            "summary": {m: summarise(rows, m) for m in ("accuracy", "log_loss")},
            "hosts": {CLASSIFIER_NAME: {"path": str(checkpoint), "sha256": "cd" * 32}},
            "datasets": {d: {"loader": f"load_{d[8:]}(return_X_y=True)", "n_rows": 150, "n_features": 4,
                             "n_classes": 3, "sha256": "ef" * 32} for d in SCORES}}


def test_better_than_random_needs_both_accuracy_and_log_loss(tmp_path):
    verdicts = {c["dataset"]: c["better"] for c in beats_random(_receipt(tmp_path))}
    assert verdicts == {"sklearn:iris": True, "sklearn:wine": False}


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cls")
    train(folder / "reg", dataclasses.replace(TINY, max_steps=1), progress=False)
    regressor = export_checkpoint(folder / "reg", folder / "tabpfn-v3-reg.ckpt")
    cfg = dataclasses.replace(TINY, task="classifier", warm_start=str(regressor), max_steps=2)
    train(folder / "cls", cfg, progress=False)
    return folder, regressor


def test_card_names_its_start_architecture_prior_and_scores(classifier_run):
    folder, regressor = classifier_run
    receipt = _receipt(folder / "cls" / "tabpfn-v3-demo-classifier.ckpt")
    (folder / "eval.json").write_text(json.dumps(receipt))
    text = write_classifier_card(folder / "cls", folder / "eval.json", folder / "card.md",
                                 training_command="oretrofit demo-host train --task classifier").read_text()
    assert (folder / "card-loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"starting from the demo regressor `tabpfn-v3-reg.ckpt` (sha256 `{sha256_file(regressor)}`)" in text
    assert "| `max_num_classes` | 10 |" in text and "| `embed_dim` | 16 |" in text
    assert "| `binary_fraction` | 0.3 |" in text and "| `max_rows` | 40 |" in text
    assert "2 steps in" in text and f"sha256 `{'cd' * 32}`" in text
    assert markdown_table(receipt) in text
    assert "- sklearn:iris: accuracy 0.905 vs 0.335, log-loss 0.300 vs 1.100 — better" in text
    assert "- sklearn:wine: accuracy 0.505 vs 0.405, log-loss 1.200 vs 1.100 — NOT better" in text
    assert "oretrofit demo-host train --task classifier\n```" in text


def test_a_regression_receipt_is_refused(classifier_run, tmp_path):
    folder, _ = classifier_run
    (tmp_path / "eval.json").write_text(json.dumps({"kind": "oretrofit.pretrain.evaluation", "hosts": {}}))
    with pytest.raises(ValueError, match="not a classification receipt"):
        write_classifier_card(folder / "cls", tmp_path / "eval.json", tmp_path / "card.md", training_command="x")
