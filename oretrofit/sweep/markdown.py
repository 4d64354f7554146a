"""Markdown for the operator-sweep receipt, laid out like the paper's Tables 1 and 6."""

from __future__ import annotations

from typing import Any

from .._files.markdown import pipe_table

__all__ = ["operators_markdown"]


def _property_table(rows: list[dict[str, str]], paper_device: str) -> str:
    return pipe_table(["Property", f"Paper ({paper_device})", "Measured (this run)"],
                      [[r["property"], r["paper"], r["measured"]] for r in rows])


def operators_markdown(receipt: dict[str, Any]) -> str:
    """The three tables of an operator-sweep receipt, with its provenance line."""
    env, cfg = receipt["environment"], receipt["config"]
    seeds = ", ".join(str(s) for s in cfg["seeds"])
    where = (f"{env['device']} ({env['device_name']}), torch {env['packages'].get('torch')}, "
             f"oretrofit {env['packages'].get('oretrofit')} at {env['git_revision']}")
    lines = [
        f"Operator sweep{' (quick)' if cfg['quick'] else ''} on {where}; τ = {cfg['tau']:g}, "
        f"ε = {cfg['eps']:g}, seeds {seeds}. Maxima over seeds × shapes; outputs from both the "
        "fused and the reference path, weights from the reference path.",
        "",
        f"**Table 1 — hidden-carrier OAttention** (shapes: {'; '.join(cfg['hidden_shapes'])})",
        "",
        _property_table(receipt["table1"]["rows"], "NVIDIA GB10 GPU"),
        "",
        f"**Table 6 — Q/K/V-boundary variation** (shapes: {'; '.join(cfg['qkv_shapes'])})",
        "",
        _property_table(receipt["table6"]["rows"], "15 seed–shape cases"),
        "",
        f"**B.5 — OStandardize** (τ = {cfg['tau']:g}, ε_var = {cfg['eps_var']:g}, token axis 1; "
        "one zero token inserted at both boundaries and the interior; the paper reports these "
        "as invariant/exact/finite without numbers)",
        "",
        pipe_table(["Case", "Old S, μ, v L∞", "Old-output L∞", "Permutation L∞",
                    "Inserted, all-null, zero-length, singleton max abs",
                    "Finite (outputs, gradients)"],
                   [[r["case"], f"{r['old_moments']:.3g}", f"{r['old_output']:.3g}",
                     f"{r['permutation']:.3g}", f"{r['exact_zeros']:g}",
                     "yes" if r["finite"] else "NO"] for r in receipt["b5"]["rows"]]),
    ]
    return "\n".join(lines) + "\n"
