"""The shipped demo host: its checkpoint, evaluation receipt and model card describe the same weights."""

import json
from pathlib import Path

import oretrofit
from oretrofit._files.provenance import sha256_file
from oretrofit.demo_host.card import HOST_NAME
from oretrofit.demo_host.evaluate import DATASETS
from oretrofit.demo_host.inference import preset_of, recorded_preset
from oretrofit.hosts.tabpfn.checkpoints import build_model, load_checkpoint

DATA = Path(oretrofit.__file__).parent / "data"
CHECKPOINT = DATA / "tabpfn-v3-demo.ckpt"


def test_receipt_and_card_are_of_the_shipped_checkpoint():
    sha = sha256_file(CHECKPOINT)
    receipt = json.loads((DATA / "tabpfn-v3-demo-eval.json").read_text())
    host = receipt["hosts"][HOST_NAME]
    assert host["sha256"] == sha
    assert list(receipt["summary"]) == list(DATASETS)
    checkpoint = load_checkpoint(CHECKPOINT)   # weights-only, as `--model-path demo` reads it
    assert recorded_preset(host) == preset_of(checkpoint["inference_config"])
    card = (DATA / "tabpfn-v3-demo.md").read_text()
    assert f"sha256 `{sha}`" in card
    assert f"preset `{preset_of(checkpoint['inference_config'])}`" in card


def test_the_shipped_checkpoint_loads_strictly():
    model, config, inference = build_model(load_checkpoint(CHECKPOINT))
    assert config.embed_dim == 32 and not model.training
    assert inference.PREPROCESS_TRANSFORMS


CLASSIFIER = DATA / "tabpfn-v3-demo-classifier.ckpt"


def test_the_classifier_receipt_and_card_are_of_the_shipped_classifier():
    from oretrofit.demo_host.card_classifier import CLASSIFIER_NAME
    from oretrofit.demo_host.evaluate_classifier import DATASETS as CLASSIFICATION

    sha = sha256_file(CLASSIFIER)
    receipt = json.loads((DATA / "tabpfn-v3-demo-classifier-eval.json").read_text())
    assert receipt["hosts"][CLASSIFIER_NAME]["sha256"] == sha
    assert list(receipt["summary"]["accuracy"]) == list(CLASSIFICATION)
    card = (DATA / "tabpfn-v3-demo-classifier.md").read_text()
    assert f"sha256 `{sha}`" in card
    start = load_checkpoint(CLASSIFIER)["oretrofit"]["warm_start"]
    assert start["sha256"] == sha256_file(CHECKPOINT)                  # it started from the shipped regressor


def test_the_shipped_classifier_beats_random_weights_through_tabpfns_own_classifier():
    """tabpfn's TabPFNClassifier loads the file; on wine (a 70/30 stratified split) it is more
    accurate and has a lower log-loss than the same architecture with random weights."""
    from sklearn.datasets import load_wine
    from sklearn.metrics import accuracy_score, log_loss
    from sklearn.model_selection import train_test_split
    from tabpfn import TabPFNClassifier

    from oretrofit.demo_host.evaluate import random_reference_host

    X, y = load_wine(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    scores = {}
    for name, path in (("trained", CLASSIFIER), ("random", random_reference_host(CLASSIFIER))):
        proba = TabPFNClassifier(model_path=str(path), device="cpu", n_estimators=2, random_state=0
                                 ).fit(X_tr, y_tr).predict_proba(X_te)
        scores[name] = (accuracy_score(y_te, proba.argmax(axis=1)), log_loss(y_te, proba, labels=[0, 1, 2]))
    assert scores["trained"][0] > scores["random"][0] + 0.2
    assert scores["trained"][1] < scores["random"][1]
