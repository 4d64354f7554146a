"""The census table (``results/transformers-census.md``), rendered from
``results/transformers-census.json`` (written by ``scripts/transformers_census.py``): counts,
shares, why the rest do not pass, and one row per type.

Why a text or vision type does not pass is read from its record: a type without softmax
attention, else the first :data:`FAMILIES` pattern its verbatim reason matches. A family is
*by design* when no gate can keep a null token inert there under the contracts the census
checks, whatever a host does: the O form is an attention operator, and a mixer that reads its
neighbours by position (a convolution, a state-space scan, a window of a 2-D grid) reads an
inserted null where it read a live neighbour. The other families are mechanisms this host lacks
(or inputs the census cannot build), so the share of types not refused by design bounds what
any work on the host could reach.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

__all__ = ["TARGET", "STATUSES", "FAMILIES", "Family", "family_of", "census_markdown"]

TARGET = ("text encoder", "text decoder", "encoder-decoder", "vision")
STATUSES = ("passes", "refused", "silent wrong", "error", "unchecked", "timeout", "crash")


@dataclass(frozen=True)
class Family:
    """A reason types do not pass: ``pattern`` searched in the record's verbatim reason."""

    name: str
    by_design: bool
    pattern: str


NO_ATTENTION = Family("no softmax attention at all (convolutional, state-space, recurrent, "
                      "hashed or Fourier mixers)", True, "")
FAMILIES: tuple[Family, ...] = (
    Family("a token mixer in the layers that reads neighbours by position (convolution, "
           "state-space scan, linear attention)", True,
           r"mixes tokens (outside the attention interface|some other way)"),
    Family("a 2-D token grid (window attention, patch merging)", True, r"2-D token grid"),
    Family("convolutions over positions next to the layers (beyond one stride-1 convolution)",
           True, r"mixes tokens next to the layers"),
    Family("top-k sparse attention (an indexer picks the keys)", False, r"top-k sparse"),
    Family("banded or chunked attention scores (local windows)", False,
           r"whose last two axes are not"),
    Family("attention that is not one softmax over the keys (several per call, another axis, "
           "another normalisation, weights read by other code)", False,
           r"calls softmax more than once|takes its softmax over axis|calls (a log-softmax|a "
           r"softmin|a normalisation|a fused attention kernel)|passes its attention weights to"),
    Family("weights no site gates (an output projection, table, projection or pooling head)",
           False, r"only partly covered"),
    Family("a layer layout the host does not describe or cannot gate", False,
           r"no layout describes|\(layout '|inline from parallel module lists"),
    Family("a cross-attention without a carrier", False, r"cross-attention the layout"),
    Family("attention called on part of the stream (packed sequences, chunks)", False,
           r"without a batch axis|without its carrier presences"),
    Family("a learned state added to every token", False, r"is non-zero: it is"),
    Family("null insertion not defined for the input (positions from a grid by index)", False,
           r"null insertion is not defined|null insertion could not be set up"),
    Family("inputs the census cannot build yet", False, r"example inputs do not run it"),
)
OTHER = Family("other", False, "")


def family_of(record: dict[str, Any]) -> Family:
    """Why ``record`` (a text or vision type that does not pass) does not pass."""
    if record.get("softmax_attention") is False:
        return NO_ATTENTION
    return next((f for f in FAMILIES if re.search(f.pattern, record.get("reason", ""))), OTHER)


def _share(records: list[dict[str, Any]]) -> str:
    passing = sum(r["status"] == "passes" for r in records)
    share = f"{100 * passing / len(records):.0f} %" if records else "–"
    return f"{passing} of {len(records)} ({share})"


def _why_not(target: list[dict[str, Any]]) -> list[str]:
    """Bullets: the target types that do not pass, by family (by design first), and the share
    left once the by-design families are counted out."""
    by_family: dict[Family, list[str]] = {}
    for r in target:
        if r["status"] != "passes":
            by_family.setdefault(family_of(r), []).append(r["model_type"])
    order = [NO_ATTENTION, *FAMILIES, OTHER]
    design = sum(len(v) for f, v in by_family.items() if f.by_design)
    reachable = len(target) - design
    lines = [f"- why the other {sum(map(len, by_family.values()))} text and vision types do not "
             f"pass (the reason each record names):"]
    for f in sorted(by_family, key=lambda f: (not f.by_design, order.index(f))):
        names = ", ".join(f"`{t}`" for t in by_family[f])
        lines.append(f"  - {'by design' if f.by_design else 'host'}: {f.name}: "
                     f"**{len(by_family[f])}** ({names})")
    lines.append(f"- refused by design: **{design}**, so no host reaches more than **{reachable} "
                 f"of {len(target)} ({100 * reachable / len(target):.0f} %)** of the text and "
                 "vision types under these contracts")
    return lines


def _rows(receipt: dict[str, Any]) -> Iterator[list[str]]:
    for model_type, r in receipt["architectures"].items():
        if r["status"] == "not buildable":
            continue
        reason = r.get("reason", "").replace("|", "\\|").replace("\n", " ")
        reason = reason if len(reason) <= 240 else reason[:240] + " …"
        status = "**SILENT WRONG**" if r["status"] == "silent wrong" else r["status"]
        attention = {True: "yes", False: "no"}.get(r.get("softmax_attention"), "–")
        yield [f"`{model_type}`", r.get("category", ""), f"`{r.get('class', '')}`", attention,
               status, reason]


def census_markdown(receipt: dict[str, Any]) -> str:
    """The census table: counts, shares, why the rest do not pass,
    and one row per type."""
    from oretrofit._files.markdown import pipe_table
    records = receipt["architectures"]
    built = [r for r in records.values() if r["status"] != "not buildable"]
    target = [r for r in built if r.get("category") in TARGET]
    attending = [r for r in target if r.get("softmax_attention")]
    silent = [t for t, r in records.items() if r["status"] == "silent wrong"]
    categories = sorted({r.get("category", "other") for r in built})
    per_status = ", ".join(f"{s} {n}" for s in STATUSES
                           if (n := sum(r["status"] == s for r in built)))
    lines = [
        f"transformers {receipt['transformers']}, torch {receipt['torch']}, seed "
        f"{receipt['seed']}, measured {receipt['date']}: {len(records)} model types, "
        f"**{len(built)} buildable** from a default config shrunk to tiny sizes. τ→0 agreement at "
        f"τ = {receipt['tau_agreement']:g}, ε = {receipt['eps_agreement']:g}; null insertion "
        f"under `full-o` at τ = {receipt['tau_null_insertion']:g}; tolerance "
        f"{receipt['tolerance']:g}.", "",
        f"- pass every contract, both arms: **{_share(built)}** of the buildable ({per_status})",
        f"- text and vision encoders and decoders ({', '.join(TARGET)}): **{_share(target)}**",
        f"  - of those with softmax attention: **{_share(attending)}**",
        *_why_not(target),
        *(f"- {c}: {_share([r for r in built if r.get('category') == c])}" for c in categories),
        f"- silent wrong (a retrofit accepted, a contract failed): **{len(silent)}**"
        + (f" ({', '.join(silent)})" if silent else ""), "",
        pipe_table(["model type", "category", "class", "softmax attention", "status",
                    "reason (verbatim in the receipt)"], list(_rows(receipt))), "",
        "Not buildable from a default config (excluded from the shares): " + ", ".join(
            f"`{t}`" for t, r in records.items() if r["status"] == "not buildable") + ".", "",
        "Generated by `scripts/transformers_census.py` from "
        "`results/transformers-census.json` (reasons for not buildable types are there; the "
        "families are `scripts/transformers_census_report.py`'s); "
        "`tests/test_docs_transformers.py` checks this block is current.", ""]
    return "\n".join(lines)
