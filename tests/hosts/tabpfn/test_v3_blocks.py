"""The v3 host's patched blocks: the many-class decoder's source presences."""

from __future__ import annotations

import math

import pytest
import torch

import oretrofit
from oretrofit.tabpfn import build_model, load_checkpoint


@pytest.mark.parametrize("autocast", [False, True])
def test_zero_train_embeddings_add_no_class_mass(classifier_ckpt, autocast):
    """Train rows whose embedding is zero (a padded row) are sources of presence 0 in the
    decoder, also under CPU bf16 autocast, where the decoder keys carry the bias rounded to
    bf16: every real train row is class 1, the zero rows class 0, so class 0's probability is
    exactly 0, its logit the vendor's floor ``log(1e-5 + 3e-5)``, and class 1's ``log(1 + 3e-5)``."""
    model = build_model(load_checkpoint(classifier_ckpt))[0].eval()
    oretrofit.retrofit(model, "full-o", tau=1e-8)
    decoder = model.many_class_decoder
    g = torch.Generator().manual_seed(0)
    real = torch.randn(2, 6, decoder.input_size, generator=g)
    train = torch.cat([real, torch.zeros(2, 30, decoder.input_size)], dim=1)   # (B, N, E)
    targets = torch.cat([torch.ones(2, 6), torch.zeros(2, 30)], dim=1)
    test = torch.randn(2, 5, decoder.input_size, generator=g)
    # what the release hands the decoder: the projected keys from tabpfn 8.5.0 on, the
    # embeddings before (oretrofit.hosts.tabpfn.releases.decoder_keys)
    project = getattr(decoder, "project_keys", None)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = decoder(train if project is None else project(train), test, targets,
                         highest_target=1)
    floor = torch.log(torch.tensor(1e-5, dtype=logits.dtype) + 3e-5)
    assert logits.shape == (5, 2, decoder.max_num_classes)
    assert torch.equal(logits[..., 0], floor.expand(5, 2))
    torch.testing.assert_close(logits[..., 1].float(), torch.full((5, 2), math.log(1 + 3e-5)),
                               rtol=0, atol=1e-4)                  # all mass on class 1
