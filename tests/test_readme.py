"""The result tables of the README (and of the demo host's run history and choices it links) are
the committed receipts' own output.

Every number these documents report comes out of a runner: some tables are a report file quoted
verbatim, some are printed by `oretrofit pretrain-compare` from receipts named in the command
shown just above them, some are `pretrain-eval`'s table of one receipt, some are a benchmark's
table kept in its receipt. Each is regenerated here from what is committed, so a receipt rerun
without its document block (or a number edited by hand) fails the suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oretrofit.pretrain.card import compare_runs
from oretrofit.pretrain.documents import Comparison, comparisons, labelled_receipts
from oretrofit.pretrain.evaluate import markdown_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ATTEMPTS = (ROOT / "results/demo-host/history/attempts.md").read_text()
CHOICES = (ROOT / "results/demo-host/history/choices.md").read_text()
DOCUMENTS = README + "\n" + ATTEMPTS + "\n" + CHOICES

QUOTED_REPORTS = ["results/studies/otransformer.md", "results/studies/adapters.md",
                  "results/studies/insertion.md", "results/studies/zero_columns.md",
                  "results/studies/ostandardize.md", "results/hosts.md",
                  "results/bench_attention.md", "results/bench_hosts.md"]

EVALUATION_RECEIPTS = ["oretrofit/data/tabpfn-v3-demo-eval.json",
                       "results/demo-host/history/validation/baselines-validation.json",
                       "results/demo-host/history/learning-curve/concrete-200.json",
                       "results/demo-host/history/learning-curve/concrete-400.json",
                       "results/demo-host/history/probe-linear/v9b.json"]

# benchmark scripts that print a table and keep it in their receipt's "markdown" field
BENCHMARK_RECEIPTS = ["results/bench_pretrain_sizes.json", "results/bench_pretrain_threads.json",
                      "results/bench_pretrain_batch-128.json", "results/bench_pretrain_batch-512.json"]


README_COMPARISONS = comparisons(README)
ATTEMPTS_COMPARISONS = comparisons(ATTEMPTS)
CHOICES_COMPARISONS = comparisons(CHOICES)
ALL_COMPARISONS = README_COMPARISONS + ATTEMPTS_COMPARISONS + CHOICES_COMPARISONS


def test_the_documents_show_their_comparisons() -> None:
    # the README compares the shipped hosts on the evaluation datasets; the run history compares
    # every run there, the learning-rate probe and snapshots; the choices document compares
    # presets and runs on the validation suite. Losing one would silently drop it from the checks
    assert len(README_COMPARISONS) >= 1
    assert len(ATTEMPTS_COMPARISONS) >= 3
    assert len(CHOICES_COMPARISONS) >= 3


@pytest.mark.parametrize("block", ALL_COMPARISONS, ids=[f"comparison{n}" for n in range(len(ALL_COMPARISONS))])
def test_each_comparison_is_what_pretrain_compare_prints_from_its_receipts(block: Comparison) -> None:
    # a failure here is mended by `make docs` (oretrofit pretrain-refresh-docs), never by hand
    receipts = labelled_receipts(block.receipt_items(), ROOT)
    assert receipts, block.command
    assert block.table == compare_runs(receipts).strip()


@pytest.mark.parametrize("path", QUOTED_REPORTS)
def test_the_readme_quotes_each_generated_report_verbatim(path: str) -> None:
    assert (ROOT / path).read_text().strip() in README


def test_the_demo_host_matrices_are_the_runners_tables() -> None:
    # quoted one heading level deeper, under the README's own section heading
    tables = (ROOT / "results/regress/demo-host/tables/tables.md").read_text()
    assert tables.replace("### ", "#### ").strip() in README


@pytest.mark.parametrize("path", EVALUATION_RECEIPTS)
def test_each_evaluation_table_is_its_receipts(path: str) -> None:
    assert markdown_table(json.loads((ROOT / path).read_text())).strip() in DOCUMENTS


def test_the_shipped_hosts_stages_and_targets_are_the_cards() -> None:
    card = (ROOT / "oretrofit/data/tabpfn-v3-demo.md").read_text().splitlines()
    start = next(n for n, line in enumerate(card) if line.startswith("| stage |"))
    end = next(n for n in range(start, len(card)) if not card[n].startswith("|"))
    stages = card[start:end]
    targets = [line for line in card if line.startswith("- ") and line.endswith(("— met", "— MISSED"))]
    assert targets
    assert "\n".join(stages) in README
    assert "\n".join(targets) in README


@pytest.mark.parametrize("path", BENCHMARK_RECEIPTS)
def test_each_benchmark_table_is_its_receipts(path: str) -> None:
    # the tables may sit indented inside a list item, so lines are compared stripped
    dedented = "\n".join(line.strip() for line in DOCUMENTS.splitlines())
    assert json.loads((ROOT / path).read_text())["markdown"].strip() in dedented


def test_the_readme_names_the_shipped_checkpoint_and_its_size() -> None:
    # the shipped host's sentence is prose, so its hash and parameter count are checked here
    from oretrofit._provenance import sha256_file

    card = (ROOT / "oretrofit/data/tabpfn-v3-demo.md").read_text()
    parameters = next(line for line in card.splitlines() if line.startswith("- parameters: ")).split(": ")[1]
    shipped = next(line for line in README.splitlines() if line.startswith("The shipped checkpoint (sha256 "))
    assert sha256_file(ROOT / "oretrofit/data/tabpfn-v3-demo.ckpt") in shipped
    assert f"{parameters} parameters" in shipped
