"""The transformers hosts on real pretrained weights, offline: τ→0 equivalence (MiniLM's
sentence embeddings, SmolLM2's greedy continuations and logits, at the defaults and at the
paper's ε), null insertion and mask-free padding, unpatched and under ``full-o``, written to
``results/hosts.json`` with provenance and ``results/hosts.md``. Run:
``python -m oretrofit.sweep.hosts [--out results]`` (``oretrofit reproduce hosts``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from .._files.atomic import write_text_atomic
from .._files.markdown import pipe_table
from .._files.provenance import environment, portable, sha256_file, write_json_atomic
from .._surgery.registry import retrofitted
from ..hosts.transformers.measures import (CHAT_PROMPTS, EPS, PAPER_EPS, PROMPTS, SENTENCES,
                                           SMOLLM2_GGUF, TAU, chat_text, embedding_cosines,
                                           greedy_and_logits, hidden_readout, load_minilm,
                                           load_smollm2, logits_readout, minilm_path,
                                           null_insertion, padding_deltas, smollm2_dir)

__all__ = ["markdown", "run", "main"]


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
                 f"oretrofit.sweep.hosts` in {report['seconds']:.0f} s.")
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
