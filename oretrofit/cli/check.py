"""`oretrofit check MODEL`: retrofit a transformers model at the settings you run and measure
the paper's contracts and the model's answers.

MODEL is a local transformers folder (``save_pretrained`` output, loaded with ``AutoModel``
offline, with its tokenizer where the folder holds one) or one of the shipped pretrained
weights: ``minilm`` (all-MiniLM-L6-v2) or ``smollm2`` (SmolLM2-135M-Instruct); see
:mod:`oretrofit.hosts.transformers.models`. The contracts, the answers and their limits are
:mod:`oretrofit.hosts.transformers.check`'s, which measures them (``oretrofit.transformers.check``
in Python).

``--arm``, ``--tau`` and ``--eps`` not given are the library's defaults (what
``oretrofit.retrofit(model)`` runs; both arms when ``--arm`` is not given). With ``--spec FILE``
(a saved or calibrated patch spec, e.g. ``oretrofit calibrate --out``) everything runs under that
spec, each site at its own τ. With a tokenizer, the answers are measured on built-in chat prompts
or on ``--text-file`` (one prompt per line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from . import choices
from .errors import fail
from .output import print_json
from .specs import read_spec_option

SCHEMA_VERSION = 2


def run_check(name: str, arm: str | None = None, tau: float | None = None,
              eps: float | None = None, spec_file: Path | None = None,
              text_file: Path | None = None, new_tokens: int | None = None) -> dict[str, Any]:
    """Measure every contract and the answers (:func:`oretrofit.hosts.transformers.check.check`);
    ``holds`` is True when all are within their limits."""
    from oretrofit._files.reading import read_text
    from oretrofit._files.provenance import environment, portable
    from oretrofit.hosts.transformers.answers import NEW_TOKENS
    from oretrofit.hosts.transformers.check import check
    from oretrofit.hosts.transformers.contracts import require_finite_weights
    from oretrofit.hosts.transformers.models import load_model_and_tokenizer
    spec = read_spec_option(spec_file) if spec_file is not None else None
    prompts = None
    if text_file is not None:
        prompts = [line for line in read_text(text_file, "--text-file", "text", "give a UTF-8 "
                                              "text file, one prompt per line").splitlines()
                   if line.strip()]
        if not prompts:
            raise ValueError(f"--text-file {text_file} holds no prompt: write one per line")
    model, tokenizer = load_model_and_tokenizer(name, required=text_file is not None)
    require_finite_weights(model, name)
    summary = check(model, tokenizer, arm, tau, eps, spec, prompts,
                    NEW_TOKENS if new_tokens is None else new_tokens)
    return {"schema_version": SCHEMA_VERSION, "command": "check", "model": name,
            "class": type(model).__name__,
            "spec": None if spec is None else {"file": portable(spec_file),
                                               "site_tau": spec.get("site_tau") or {}},
            "prompts": "built-in" if text_file is None else portable(text_file),
            **summary, "environment": environment()}


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _eps(eps: float) -> str:
    return "0 (ε → 0⁺)" if eps == 0 else f"{eps:g}"


def _answer_rows(summary: dict[str, Any], limits: dict[str, float]) -> list[list[str]]:
    """The table rows of the answers: per arm the logit deviation and the continuations kept,
    or the embeddings' cosine; the sites that moved them most where they moved."""
    answers, rows = summary["answers"], []
    for a in answers["arms"] if answers else ():
        if answers["kind"] == "embed":
            rows.append([f"answers, {a['arm']}: sentence embeddings' min cosine over "
                         f"{answers['prompts']} prompts", f"{a['min_cosine']:.7f}",
                         f"≥ {limits['cosine']:g}", _mark(a["min_cosine"] >= limits["cosine"])])
        else:
            kept = answers["prompts"] - len(a["changed"])
            rows.append([f"answers, {a['arm']}: max |Δ logit| over {answers['prompts']} prompts "
                         f"(logits up to {a['logits_max_abs']:.3g})",
                         f"{a['logits_max_delta']:.3g}", f"≤ {limits['logits']:g}",
                         _mark(a["logits_max_delta"] <= limits["logits"])])
            rows.append([f"answers, {a['arm']}: greedy continuations ({answers['new_tokens']} "
                         "tokens) unchanged", f"{kept} of {answers['prompts']}", "all",
                         _mark(not a["changed"])])
        for site in a["sites"]:
            rows.append([f"  moved by {site['site']} (its own relative deviation)",
                         f"{site['deviation']:.3g}", "", ""])
    return rows


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    limits = summary["limits"]
    setting = (f"spec {Path(summary['spec']['file']).name}" if summary["spec"] else
               f"τ = {summary['tau']:g}, ε = {_eps(summary['eps'])}")
    table = Table(title=f"{summary['class']} ({summary['model']}) · host {summary['host']} · "
                        f"{setting}")
    for column in ("contract", "measured", "limit", "holds"):
        table.add_column(column)
    for a in summary["agreement"]:
        table.add_row(f"agreement, {a['arm']} ({a['sites']} sites)",
                      f"{a['relative_max_diff']:.3g}", f"≤ {limits['agreement']:g}",
                      _mark(a["relative_max_diff"] <= limits["agreement"]))
        table.add_row(f"revert() bit-identical, {a['arm']}", str(a["revert_bit_identical"]),
                      "True", _mark(a["revert_bit_identical"]))
    n, u, arm = summary["null_insertion"], summary["null_insertion_unpatched"], \
        summary["insertion_arm"]
    if "not_defined" in n:
        table.add_row(f"null insertion, {arm}", n["not_defined"], "", "–")
    else:
        table.add_row(f"null insertion ({n['where']}), old-state drift, {arm}",
                      f"{n['old_max_delta']:.3g} (unpatched {u['old_max_delta']:.3g})",
                      f"≤ {limits['drift']:g}", _mark(n["old_max_delta"] <= limits["drift"]))
        table.add_row(f"null insertion, inserted max |h| over {n['layers']} states, {arm}",
                      f"{n['inserted_max_abs']:.3g} (unpatched {u['inserted_max_abs']:.3g})",
                      "0", _mark(n["inserted_max_abs"] == 0))
    padding = summary["padding_max_delta"]
    if padding is not None:
        table.add_row(f"mask-free padding, {arm}", f"{padding:.3g}", f"≤ {limits['padding']:g}",
                      _mark(padding <= limits["padding"]))
    for row in _answer_rows(summary, limits):
        table.add_row(*row)
    console = Console()
    console.print(table)
    if summary["answers"] is None:
        console.print("answers not measured: the model has no tokenizer")
    console.print("all contracts hold" if summary["holds"] else
                  "some contracts do not hold:\n  " + "\n  ".join(summary["failed"]))


def register(app: typer.Typer) -> None:
    """Add the ``check`` verb to ``app``."""

    @app.command("check")
    def check(
        model: str = typer.Argument(..., help="a local transformers folder, or minilm / smollm2"),
        arm: str = typer.Option(None, "--arm", help="oa or full-o (default: both)",
                                callback=choices.O_ARMS),
        tau: float = typer.Option(None, "--tau", help="τ of every site (default: the "
                                  "library's, what oretrofit.retrofit runs)"),
        eps: float = typer.Option(None, "--eps", help="ε of every attention denominator "
                                  "(default: the library's)"),
        spec: Path = typer.Option(None, "--spec", help="run everything under a saved or "
                                  "calibrated patch spec (JSON: arm, ε, per-site τ) instead of "
                                  "--arm/--tau/--eps"),
        text_file: Path = typer.Option(None, "--text-file", help="prompts to measure the "
                                       "answers on, one per line (default: built-in chat "
                                       "prompts); the model needs a tokenizer"),
        new_tokens: int = typer.Option(None, "--new-tokens", min=1, help="greedy tokens "
                                       "generated per prompt (default 12)"),
        json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Retrofit a transformers model at your settings and print the paper's contracts and
        how its answers move (exit 1 when one does not hold, 2 when the model cannot be
        retrofitted)."""
        from oretrofit._surgery.registry import RetrofitError
        given = [flag for flag, value in (("--arm", arm), ("--tau", tau), ("--eps", eps))
                 if value is not None]
        if spec is not None and given:
            raise fail(f"--spec sets the arm, ε and every site's τ itself; drop "
                       f"{', '.join(given)} (or drop --spec)")
        try:
            summary = run_check(model, arm, tau, eps, spec, text_file, new_tokens)
        except (RetrofitError, ValueError, OSError) as err:
            raise fail(err) from None
        if json_out:
            print_json(summary)
        else:
            _print_table(summary)
        if not summary["holds"]:
            raise typer.Exit(1)
