"""make_classifier: a TabPFN v3 classifier checkpoint under every arm, and its decoder site."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oretrofit
from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn import releases
from oretrofit.tabpfn import build_model, load_checkpoint, make_classifier, make_regressor

from . import FAST


def _proba(classifier, data) -> np.ndarray:
    x_train, y_train, x_test = data
    return classifier.fit(x_train, y_train).predict_proba(x_test)


def test_fit_with_cache_equals_fit_preprocessors(classifier_ckpt, classes):
    """The cached decoder keys carry the train rows' presences too (fp64, τ = 0.5)."""
    from tabpfn import TabPFNClassifier
    if releases.always_quantizes_cache(TabPFNClassifier):
        with pytest.raises(RetrofitError, match="always quantize"):
            make_classifier(classifier_ckpt, "full-o", 0.5, fit_mode="fit_with_cache", **FAST)
        return
    fp64 = {"inference_precision": torch.float64}
    uncached = _proba(make_classifier(classifier_ckpt, "full-o", 0.5, **fp64, **FAST)[0], classes)
    cached, _ = make_classifier(classifier_ckpt, "full-o", 0.5, fit_mode="fit_with_cache", **fp64,
                                **FAST)
    np.testing.assert_allclose(_proba(cached, classes), uncached, rtol=1e-5, atol=0)


def _decoder_input(decoder: torch.nn.Module, train_emb: torch.Tensor) -> torch.Tensor:
    """What this tabpfn release hands the decoder: projected keys (8.5.0+) or embeddings."""
    return decoder.project_keys(train_emb) if hasattr(decoder, "project_keys") else train_emb


@torch.no_grad()
def _icl_probabilities(model, rows: torch.Tensor, targets: torch.Tensor, n: int) -> torch.Tensor:
    """ICL blocks, output norm and many-class decoder on row tokens ``(1, R, D)`` whose first
    ``n`` are train rows -> class probabilities of the test rows ``(R - n, T)``."""
    x = rows.clone()
    for block in model.icl_blocks:
        x, _ = block(x, n)
    x = model.output_norm(x)
    decoder = model.many_class_decoder
    logits = decoder(_decoder_input(decoder, x[:, :n]), x[:, n:], targets[None])
    return torch.softmax(logits[:, 0], -1)


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_null_train_row_leaves_the_other_rows_probabilities_unchanged(classifier_ckpt, arm):
    """A zero row token inserted among the train rows (with any label) changes no test row's
    probabilities under O (τ = 0.5, so presences are far from 1); unpatched, it does."""
    model, _, _ = build_model(load_checkpoint(classifier_ckpt))
    model = model.double()
    g = torch.Generator().manual_seed(0)
    n, m, width = 12, 5, model.output_norm.weight.shape[0]
    rows = torch.randn(1, n + m, width, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 3, (n,), generator=g)
    null_rows = torch.cat([rows[:, :4], rows.new_zeros(1, 1, width), rows[:, 4:]], dim=1)
    null_targets = torch.cat([targets[:4], torch.tensor([2]), targets[4:]])

    def shift() -> float:
        return float((_icl_probabilities(model, null_rows, null_targets, n + 1)
                      - _icl_probabilities(model, rows, targets, n)).abs().max())

    assert shift() > 1e-4                                        # the law fails unpatched
    with oretrofit.retrofitted(model, arm, 0.5):
        assert shift() <= 1e-12


def test_random_classifier_host(classes):
    classifier, result = make_classifier("random", "full-o", **FAST)
    assert type(result.model.many_class_decoder).__name__ == "OManyClassDecoder"
    proba = _proba(classifier, classes)
    assert proba.shape == (10, 3) and np.allclose(proba.sum(1), 1, atol=1e-6)


def test_patch_verb_takes_a_classifier_checkpoint(classifier_ckpt):
    import json

    import typer
    from typer.testing import CliRunner

    from oretrofit.cli import patch as patch_verb
    app = typer.Typer()
    app.callback()(lambda: None)
    patch_verb.register(app)
    result = CliRunner().invoke(app, ["patch", "--model-path", str(classifier_ckpt), "--arm",
                                      "oa", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["task"] == "classifier" and summary["sites"][-1]["site"] == "dec"


def test_tasks_are_not_mixed_up(classifier_ckpt, small_ckpt):
    with pytest.raises(RetrofitError, match="classifier checkpoint, not a regressor; use "
                                            "make_classifier"):
        make_regressor(classifier_ckpt, "oa", **FAST)
    with pytest.raises(RetrofitError, match="regressor checkpoint, not a classifier; use "
                                            "make_regressor"):
        make_classifier(small_ckpt, "oa", **FAST)
