"""`oretrofit calibrate`: per-site τ, τ_site = δ/(1−δ)·Q_q(‖h‖²) of each site's carriers on data,
written as a patch spec. Two forms, never mixed:

    TabPFN        --model-path CKPT --dataset SPEC [--seed N]   the splits' train rows
    transformers  --model minilm|smollm2|DIR [--text-file FILE]  lines of text, the model's
                  [--max-tokens N] [--token-budget N]           tokenizer (built-in set without),
                                                                 read up to the token budget
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import typer

from . import choices
from .errors import fail, warn

DEFAULT_SEEDS = [11]


def _form(given_tabpfn: list[str], given_text: list[str], model: str | None,
          datasets: list[str] | None) -> str:
    """``"tabpfn"`` or ``"transformers"``, or exit 2 naming the flags that do not belong."""
    if model is not None and given_tabpfn:
        raise fail(f"--model calibrates a transformers model from text; "
                   f"{', '.join(given_tabpfn)} belong to the TabPFN form (--model-path "
                   "--dataset): use one form")
    if model is not None:
        return "transformers"
    if given_text:
        raise fail(f"{', '.join(given_text)} belong to the transformers form; add --model "
                   "minilm|smollm2|DIR (or drop them to calibrate TabPFN with --dataset)")
    if not datasets:
        raise fail("give --dataset SPEC (a TabPFN host, with --model-path) or --model "
                   "minilm|smollm2|DIR (a transformers model, with --text-file)")
    return "tabpfn"


def _check_out(out: Path) -> None:
    """Refuse, before calibrating, an ``--out`` the spec cannot be written to (a folder, a path
    under a file) or must not replace (an existing file that is not a patch spec)."""
    from oretrofit._files.reading import read_text
    from oretrofit._surgery.serialize import parse_spec_json
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the spec's file path, e.g. "
                         f"{out / 'spec.json'}")
    if out.exists():
        try:
            found = parse_spec_json(read_text(out, "--out", "json", ""))
        except ValueError:      # not JSON, no regular file (never waited on), RetrofitError
            found = None
        if not (isinstance(found, dict) and "schema_version" in found and "arm" in found):
            raise ValueError(f"--out {out} exists and is not a patch spec, so calibrate would "
                             "replace it; choose another path (or move that file first)")
    above = next(p for p in out.absolute().parents if p.exists())
    if not above.is_dir():
        raise ValueError(f"--out {out}: {above} is a file, not a folder; choose another path")


def _calibrate_tabpfn(model_path: str | None, datasets: list[str], seeds: list[int],
                      openml_cache: Path | None, offline_standins: bool, **settings: Any
                      ) -> dict[str, Any]:
    from oretrofit.regress.calibrate import calibrate_tabpfn
    from oretrofit.regress.data import OFFLINE_STANDINS, load_datasets
    if len(set(seeds)) != len(seeds) or len(set(datasets)) != len(datasets):
        raise ValueError("--seed and --dataset values must not repeat")
    loaded = load_datasets(datasets, openml_cache=openml_cache,
                           standins=OFFLINE_STANDINS if offline_standins else None)
    return calibrate_tabpfn(model_path, list(loaded.values()), seeds, **settings)


def _calibrate_transformers(model: str, text_file: Path | None, max_tokens: int | None,
                            token_budget: int | None, **settings: Any) -> dict[str, Any]:
    """The spec calibrated on ``text_file`` read lazily (or the built-in lines); a note on
    stderr when the token budget cut the text."""
    from oretrofit._files.reading import regular_file, text_lines
    from oretrofit.hosts.transformers.calibrate import (BUILTIN_TEXTS, DEFAULT_TOKEN_BUDGET,
                                                        TextBudgetWarning, budget_note,
                                                        builtin_texts, calibrate_text, line_chars,
                                                        token_cap)
    from oretrofit.hosts.transformers.contracts import require_finite_weights
    from oretrofit.hosts.transformers.models import load_model_and_tokenizer
    fix = "give a UTF-8 text file, one calibration sample per line"
    if text_file is not None:
        regular_file(text_file, "--text-file", None, fix)       # refused before the model loads
    host, tokenizer = load_model_and_tokenizer(model)
    require_finite_weights(host, model)
    if text_file is None:
        lines, source = builtin_texts(), BUILTIN_TEXTS
    else:
        chars = line_chars(token_cap(host, tokenizer, max_tokens))
        lines, source = text_lines(text_file, "--text-file", "text", fix, chars), str(text_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TextBudgetWarning)          # a note here instead
        spec = calibrate_text(host, tokenizer, lines, source=source, max_tokens=max_tokens,
                              token_budget=DEFAULT_TOKEN_BUDGET if token_budget is None
                              else token_budget, **settings)
    if spec["calibration"]["data"]["budget_reached"]:
        warn(budget_note(spec["calibration"]["data"]))
    spec["calibration"]["data"]["model"] = model
    return spec


def register(app: typer.Typer) -> None:
    """Add the ``calibrate`` verb to ``app``."""

    @app.command("calibrate")
    def calibrate(
        out: Path = typer.Option(..., "--out", help="where to write the calibrated patch spec (JSON)"),
        model_path: str = typer.Option(None, "--model-path", help="TabPFN form: checkpoint, "
                                       "'demo' or 'random'; default: tabpfn's download cache"),
        datasets: list[str] = typer.Option(None, "--dataset", help="TabPFN form: calibration "
                                           "dataset spec, e.g. sklearn:diabetes (repeatable)"),
        seeds: list[int] = typer.Option(None, "--seed", help="TabPFN form: split seeds whose "
                                        "train rows are the calibration data (repeatable; "
                                        "default 11)"),
        openml_cache: Path = typer.Option(None, "--openml-cache", help="TabPFN form: OpenML "
                                          "cache folder"),
        offline_standins: bool = typer.Option(False, "--offline-standins", help="TabPFN form: "
                                              "load the offline stand-ins for OpenML datasets "
                                              "(as regress does)"),
        model: str = typer.Option(None, "--model", help="transformers form: minilm, smollm2 or a "
                                  "local transformers folder holding its tokenizer"),
        text_file: Path = typer.Option(None, "--text-file", help="transformers form: calibration "
                                       "text, one sample per line (default: a built-in set)"),
        max_tokens: int = typer.Option(None, "--max-tokens", help="transformers form: tokens kept "
                                       "per line (default 128, or the model's positions when "
                                       "fewer)"),
        token_budget: int = typer.Option(None, "--token-budget", help="transformers form: tokens "
                                         "calibrated on at most; the text is read up to them "
                                         "(default 100000)"),
        arm: str = typer.Option("full-o", "--arm", help="oa or full-o", callback=choices.O_ARMS),
        delta: float = typer.Option(1e-3, "--delta", help="largest gate δ a carrier at the quantile "
                                    "may get (presence ≥ 1−δ)"),
        quantile: float = typer.Option(0.01, "--quantile", help="low quantile q of each site's "
                                       "carriers ‖h‖² that keeps presence ≥ 1−δ"),
        exclude: list[str] = typer.Option(None, "--exclude", help="leave sites matching this "
                                          "pattern unpatched (glob or 're:' regex; repeatable)"),
    ) -> None:
        """Choose τ per site: τ_site = δ/(1−δ)·Q_q(‖h‖²) of its carriers on the calibration data
        (a TabPFN host's train rows, or a transformers model's text)."""
        from oretrofit._files.provenance import write_json_atomic
        from oretrofit._surgery.registry import RetrofitError

        given_tabpfn = [flag for flag, value in (
            ("--model-path", model_path), ("--dataset", datasets), ("--seed", seeds),
            ("--openml-cache", openml_cache), ("--offline-standins", offline_standins or None))
            if value not in (None, [], ())]
        given_text = [flag for flag, value in (("--text-file", text_file),
                                               ("--max-tokens", max_tokens),
                                               ("--token-budget", token_budget))
                      if value is not None]
        settings = dict(arm=arm, delta=delta, quantile=quantile, exclude=exclude or None)
        try:
            form = _form(given_tabpfn, given_text, model, datasets)
            _check_out(out)
            if form == "tabpfn":
                spec = _calibrate_tabpfn(model_path, datasets, seeds or DEFAULT_SEEDS,
                                         openml_cache, offline_standins, **settings)
            else:
                spec = _calibrate_transformers(model, text_file, max_tokens, token_budget,
                                               **settings)
            write_json_atomic(out, spec)
        except (RetrofitError, ValueError, OSError) as err:
            raise fail(err) from None
        taus = spec["site_tau"].values()
        typer.echo(f"{len(spec['site_tau'])} site(s), τ from {min(taus):.3g} to {max(taus):.3g}; "
                   f"spec written to {out}")
