"""Write the saved-retrofit fixture of the running transformers release, which
tests/hosts/transformers/test_pretrained.py loads under every release its environment has.

A tiny random ``LlamaForCausalLM`` (weights jittered so that its norms are not all ones),
retrofitted with ``full-o`` at the defaults and saved with ``save_pretrained``, to
``tests/hosts/transformers/saved/transformers-<release>/``, with ``logits.json``: the input ids
and the logits the retrofitted model gives on them under this release. Run it with the python of
each environment the CI runs the transformers tests in (the main one, and the oldest admitted
release's: ``make test-transformers-oldest`` builds it)::

    .venv/bin/python scripts/saved_retrofits.py
    .venv/transformers-4.53.3/bin/python scripts/saved_retrofits.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import oretrofit  # noqa: E402

SAVED = ROOT / "tests" / "hosts" / "transformers" / "saved"
INPUT_IDS = [[3, 17, 8, 29, 11, 5]]


def tiny_llama() -> torch.nn.Module:
    """The fixture's model: 2 layers, width 16, grouped-query attention (4 heads, 2 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=2, pad_token_id=0))
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.05)
    return model.eval()


def main() -> None:
    import transformers
    folder = SAVED / f"transformers-{transformers.__version__}"
    model = tiny_llama()
    oretrofit.retrofit(model, "full-o")
    model.save_pretrained(folder)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(INPUT_IDS)).logits
    (folder / "logits.json").write_text(json.dumps(
        {"input_ids": INPUT_IDS, "logits": logits.tolist()}) + "\n")
    print(f"wrote {folder.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
