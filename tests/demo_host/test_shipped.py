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
