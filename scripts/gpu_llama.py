#!/usr/bin/env python3
"""A retrofitted Llama of SmolLM2-135M's shape on a GPU: prefill and KV-cache decode per arm.

    python scripts/gpu_llama.py [--device cuda] [--rounds 5] [--out results/cuda]

Model: ``LlamaForCausalLM`` with SmolLM2-135M's configuration (576 wide, 30 layers, 9 query and
3 key/value heads of 64, vocabulary 49152; random weights, seed 0: no weights travel), bf16, SDPA
attention, eval mode (``--device cpu``: a 2-layer, 64-wide model in fp32 and tiny shapes, a smoke
run of this script's logic). Arms: ``base`` (unpatched), ``oa`` and ``full-o``
(``oretrofit.retrofit(model, arm, τ = 1e-8)``, reverted after the arm).

* prefill: one forward without cache at B × N = 8 × 2048 and 1 × 8192 (no mask): median of
  ``--rounds`` (CUDA events), peak memory beyond the inputs, ratio to base;
* decode: a 1 × 512 prompt, then 64 greedy tokens one at a time with transformers' KV cache:
  median total ms of the 64 steps over ``--rounds``, ratio to base, and whether the arm decoded
  base's tokens.

An arm that fails (e.g. a refusal) is recorded with its error, not dropped. Writes
``OUT/llama.json`` (rows + provenance) and ``OUT/llama.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

import oretrofit
from gpu_attention_shapes import peak_bytes, timed          # this folder (run as a script)
from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, write_json_atomic

ARMS = ("base", "oa", "full-o")
TAU = 1e-8
SETTINGS = {  # device type -> (model size, dtype, prefill shapes, prompt length, decoded tokens)
    "cuda": ("smollm2-135m", torch.bfloat16, [(8, 2048), (1, 8192)], 512, 64),
    "cpu": ("tiny", torch.float32, [(2, 32), (1, 64)], 16, 4),
}


def build(size: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    if size == "tiny":
        config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=512)
    else:
        config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                             num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                             max_position_embeddings=8192, rms_norm_eps=1e-5,
                             tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


@torch.no_grad()
def decode(model: torch.nn.Module, prompt: torch.Tensor, tokens: int) -> list[int]:
    """Greedy decoding of ``tokens`` tokens after ``prompt`` with the model's KV cache."""
    out = model(input_ids=prompt, use_cache=True)
    past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    produced = [int(token)]
    for _ in range(tokens - 1):
        out = model(input_ids=token, past_key_values=past, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        produced.append(int(token))
    return produced


def measure_arm(model: torch.nn.Module, arm: str, device: torch.device, rounds: int,
                shapes: list[tuple[int, int]], prompt: torch.Tensor, tokens: int
                ) -> list[dict[str, object]]:
    """Prefill rows and the decode row of one arm (the model patched for ``arm`` meanwhile)."""
    retrofit = None if arm == "base" else oretrofit.retrofit(model, arm, TAU)
    rows: list[dict[str, object]] = []
    try:
        for b, n in shapes:
            ids = torch.randint(100, model.config.vocab_size, (b, n), device=device,
                                generator=torch.Generator(device=device).manual_seed(n))

            def forward() -> None:
                with torch.no_grad():
                    model(input_ids=ids, use_cache=False)
            forward()                                                     # warm-up
            ms = statistics.median(timed(forward, device) for _ in range(rounds))
            rows.append({"arm": arm, "pass": "prefill", "B": b, "N": n, "ms": ms,
                         "peak_bytes": peak_bytes(forward, device)})
        decoded: list[int] = []

        def run_decode() -> None:
            decoded[:] = decode(model, prompt, tokens)
        run_decode()                                                      # warm-up
        ms = statistics.median(timed(run_decode, device) for _ in range(rounds))
        rows.append({"arm": arm, "pass": f"decode {tokens}", "B": 1, "N": prompt.shape[1],
                     "ms": ms, "peak_bytes": None, "tokens": list(decoded)})
    except Exception as error:                                            # recorded, not hidden
        rows.append({"arm": arm, "pass": "error", "error": f"{type(error).__name__}: {error}"[:500]})
    finally:
        if retrofit is not None:
            retrofit.revert()
    return rows


def with_ratios(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    base = {(r["pass"], r["B"], r["N"]): r for r in rows if r["arm"] == "base" and "ms" in r}
    for r in rows:
        ref = base.get((r["pass"], r.get("B"), r.get("N")))
        if ref is None or "ms" not in r:
            continue
        r["time_ratio"] = r["ms"] / ref["ms"]
        if r["peak_bytes"] and ref["peak_bytes"]:
            r["memory_ratio"] = r["peak_bytes"] / ref["peak_bytes"]
        if "tokens" in r and r["arm"] != "base":
            r["same_tokens_as_base"] = r["tokens"] == ref["tokens"]
    return rows


def markdown(title: str, rows: list[dict[str, object]], rounds: int) -> str:
    header = ["arm", "pass", "B", "N", "ms (median)", "ratio to base", "memory ratio",
              "base's tokens"]
    body = [[r["arm"], r["pass"], r.get("B", "–"), r.get("N", "–"),
             f"{r['ms']:.2f}" if "ms" in r else r.get("error", "–"),
             f"{r['time_ratio']:.2f}×" if "time_ratio" in r else "–",
             f"{r['memory_ratio']:.2f}×" if "memory_ratio" in r else "–",
             {True: "yes", False: "no"}.get(r.get("same_tokens_as_base"), "–")] for r in rows]
    return f"{title}; median of {rounds} rounds.\n\n{pipe_table(header, body)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs a tiny model (smoke)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/cuda"))
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch has no CUDA device here; use --device cpu for a smoke run")
    size, dtype, shapes, prompt_n, tokens = SETTINGS[device.type]
    model = build(size, dtype, device)
    prompt = torch.randint(100, model.config.vocab_size, (1, prompt_n), device=device,
                           generator=torch.Generator(device=device).manual_seed(1))
    rows = with_ratios([row for arm in ARMS for row in
                        measure_arm(model, arm, device, args.rounds, shapes, prompt, tokens)])
    title = (f"Llama with {size}'s shape (random weights), {str(dtype).split('.')[-1]}, "
             f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, τ = {TAU:g}")
    text = markdown(title, rows, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "llama.json",
                      {"schema_version": 1, "model": size, "dtype": str(dtype), "tau": TAU,
                       "rounds": args.rounds, "rows": rows, "environment": environment(device.type)})
    (args.out / "llama.md").write_text(text)
    print(text)
    print(json.dumps({"receipt": str(args.out / "llama.json")}))


if __name__ == "__main__":
    main()
