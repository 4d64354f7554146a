"""README.md and every page of docs/ (and the demo host's history they link) show what the
committed receipts say, run as shown, and link only to what exists.

Every number these documents report comes out of a runner: some tables are a report file quoted
verbatim, some are printed by `oretrofit demo-host compare` from receipts named in the command
shown just above them, some are `demo-host eval`'s table of one receipt, some are a benchmark's
table kept in its receipt. Each is regenerated here from what is committed, so a receipt rerun
without its document block (or a number edited by hand) fails the suite. The pages are found by
glob, so a page added to docs/ is covered by the link, path and comparison checks without being
listed here.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from oretrofit.demo_host.card import compare_runs
from oretrofit.demo_host.documents import Comparison, comparisons, labelled_receipts
from oretrofit.demo_host.evaluate import markdown_table

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "results/demo-host/history"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HISTORY_PAGES = sorted(HISTORY.glob("*.md"))
README = (ROOT / "README.md").read_text()
DEMO_HOST = (ROOT / "docs/demo-host.md").read_text()
DOCUMENTS = "\n".join(page.read_text() for page in [*PAGES, *HISTORY_PAGES])

# pages the README links that other branches write (issue 34's split): each must either exist or
# be listed here, and a page that exists must leave this list (the last test below fails on it)
PENDING_PAGES: set[str] = set()

QUOTED_REPORTS = {"results/studies/otransformer.md": "docs/studies.md",
                  "results/studies/adapters.md": "docs/studies.md",
                  "results/studies/insertion.md": "docs/studies.md",
                  "results/studies/zero_columns.md": "docs/studies.md",
                  "results/studies/ostandardize.md": "docs/studies.md",
                  "results/bench_attention.md": "docs/benchmarks.md",
                  "results/bench_hosts.md": "docs/benchmarks.md",
                  "results/bench_hosts_short.md": "docs/benchmarks.md",
                  "results/bench_hosts_compile.md": "docs/benchmarks.md",
                  "results/bench_tabular.md": "docs/benchmarks.md",
                  "results/regress/demo-host/tables/tables.md": "docs/demo-host.md",
                  "results/demo-host/calibrated/README.md": "docs/calibration.md"}

EVALUATION_RECEIPTS = ["oretrofit/data/tabpfn-v3-demo-eval.json",
                       "results/demo-host/history/validation/baselines-validation.json",
                       "results/demo-host/history/learning-curve/concrete-200.json",
                       "results/demo-host/history/learning-curve/concrete-400.json",
                       "results/demo-host/history/probe-linear/v9b.json"]

# benchmark scripts that print a table and keep it in their receipt's "markdown" field
BENCHMARK_RECEIPTS = ["results/bench_pretrain_sizes.json", "results/bench_pretrain_threads.json",
                      "results/bench_pretrain_batch-128.json", "results/bench_pretrain_batch-512.json",
                      "results/bench_retrofit.json", "results/bench_batched.json",
                      "results/bench_tabular.json"]

COMPARISONS = [(page.relative_to(ROOT).as_posix(), block) for page in [*PAGES, *HISTORY_PAGES]
               for block in comparisons(page.read_text())]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 350
    for page in PAGES[1:]:  # every docs page is reachable from the README
        assert f"]({_rel(page)})" in README, _rel(page)


def test_the_documents_show_their_comparisons() -> None:
    # the demo host page compares the shipped hosts on the evaluation datasets; the run history
    # compares every run there, the learning-rate probe and snapshots; the choices document
    # compares presets and runs on the validation suite. Losing one would silently drop it
    count = {name: sum(1 for page, _ in COMPARISONS if page == name) for name in
             ("docs/demo-host.md", "results/demo-host/history/attempts.md",
              "results/demo-host/history/choices.md")}
    assert count["docs/demo-host.md"] >= 1
    assert count["results/demo-host/history/attempts.md"] >= 3
    assert count["results/demo-host/history/choices.md"] >= 3


@pytest.mark.parametrize("page,block", COMPARISONS, ids=[f"{p}-{n}" for n, (p, _) in enumerate(COMPARISONS)])
def test_each_comparison_is_what_demo_host_compare_prints_from_its_receipts(page: str, block: Comparison) -> None:
    # a failure here is mended by `make docs` (scripts/refresh_docs.py), never by hand
    receipts = labelled_receipts(block.receipt_items(), ROOT)
    assert receipts, block.command
    assert block.table == compare_runs(receipts).strip()


def test_no_document_holds_a_comparison_under_the_old_verb() -> None:
    # the parser finds `oretrofit demo-host compare` blocks only; one under the old name would go unchecked
    assert not re.search(r"^\s*oretrofit pretrain-compare", DOCUMENTS, re.M)


@pytest.mark.parametrize("path,page", QUOTED_REPORTS.items())
def test_each_generated_report_is_quoted_verbatim(path: str, page: str) -> None:
    assert (ROOT / path).read_text().strip() in (ROOT / page).read_text()


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
    assert "\n".join(stages) in DEMO_HOST
    assert "\n".join(targets) in DEMO_HOST


@pytest.mark.parametrize("path", BENCHMARK_RECEIPTS)
def test_each_benchmark_table_is_its_receipts(path: str) -> None:
    # the tables may sit indented inside a list item, so lines are compared stripped
    dedented = "\n".join(line.strip() for line in DOCUMENTS.splitlines())
    assert json.loads((ROOT / path).read_text())["markdown"].strip() in dedented


def test_the_readme_benchmark_headline_is_lines_of_the_reports() -> None:
    section = README.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    reports = "\n".join([(ROOT / "results/bench_attention.md").read_text(),
                         json.loads((ROOT / "results/bench_retrofit.json").read_text())["markdown"],
                         json.loads((ROOT / "results/bench_batched.json").read_text())["markdown"],
                         (ROOT / "results/bench_hosts.md").read_text(),
                         (ROOT / "results/bench_hosts_short.md").read_text(),
                         (ROOT / "results/bench_hosts_compile.md").read_text()]).splitlines()
    quoted = [line for line in section.splitlines() if line.startswith(("|", "Fused at"))]
    assert len(quoted) >= 10 and all(line in reports for line in quoted)


def test_the_readme_calibration_reading_is_lines_of_the_generated_reading() -> None:
    section = README.split("\n## Calibrated τ\n", 1)[1].split("\n## ", 1)[0]
    reading = (ROOT / "results/demo-host/calibrated/README.md").read_text().splitlines()
    quoted = [line for line in section.splitlines() if line.startswith("* ")]
    assert len(quoted) >= 4 and all(line in reading for line in quoted)


def test_the_demo_host_page_names_the_shipped_checkpoint_and_its_size() -> None:
    # the shipped host's sentence is prose, so its hash and parameter count are checked here
    from oretrofit._files.provenance import sha256_file

    card = (ROOT / "oretrofit/data/tabpfn-v3-demo.md").read_text()
    parameters = next(line for line in card.splitlines() if line.startswith("- parameters: ")).split(": ")[1]
    shipped = next(line for line in DEMO_HOST.splitlines() if line.startswith("The shipped checkpoint (sha256 "))
    assert sha256_file(ROOT / "oretrofit/data/tabpfn-v3-demo.ckpt") in shipped
    assert f"{parameters} parameters" in shipped


def test_the_receivers_table_is_the_patch_receipts() -> None:
    receipt = json.loads((ROOT / "results/demo-host/receivers-full-o-tau1.json").read_text())
    assert receipt["command"] == "patch" and receipt["dry_run"] and receipt["tau"] == 1.0
    rows = ["| site | kind | τ | learned receivers: presence |", "|---|---|---|---|"]
    rows += [f"| {s['site']} | {s['kind']} | {s['tau']:g} | "
             + ", ".join(f"{k}={v:.4g}" for k, v in s["receivers"].items()) + " |"
             for s in receipt["sites"] if s["receivers"]]
    assert len(rows) > 2 and "\n".join(rows) in DEMO_HOST


def test_the_history_index_is_generated_from_the_receipts() -> None:
    # a failure here is mended by `make docs` (scripts/history_index.py)
    spec = importlib.util.spec_from_file_location("history_index", ROOT / "scripts/history_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    index = (HISTORY / "index.md").read_text()
    assert index == module.render(ROOT)
    attempts = sorted(p.name for p in HISTORY.glob("attempt-*"))
    assert len(attempts) >= 40 and all(f"]({name}/" in index for name in attempts)
    assert index.count("| shipped now |") == 1 and index.count("| shipped before |") == 4


def _run_example(section: str, capsys) -> tuple[dict, int, str]:
    """Run the README section's Python example; its scope and the two words it prints."""
    code = README.split(f"\n## {section}\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 10
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    sites, first = capsys.readouterr().out.split()
    return scope, int(sites), first


def test_the_readme_tabpfn_example_runs(capsys) -> None:
    scope, sites, first = _run_example("Retrofit a TabPFN v3 regressor", capsys)
    assert sites == len(scope["retrofit"].report()) > 0 and first == "te.col"
    assert scope["y_hat"].shape == (50,) and scope["retrofit"].reverted


def test_the_readme_transformers_example_runs(capsys) -> None:
    scope, sites, first = _run_example("Retrofit a transformers model", capsys)
    assert sites > 0 and first == "embeddings.position_embeddings" and scope["r"].reverted
    assert scope["hidden"].shape[:2] == scope["batch"]["input_ids"].shape


def _links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # a command's text is not a link
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", [*PAGES, *HISTORY_PAGES], ids=_rel)
def test_every_relative_link_resolves(page: Path) -> None:
    for target in _links(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if file.relative_to(ROOT).as_posix() in PENDING_PAGES:
            continue
        assert file.exists(), f"{_rel(page)} links {target}, which does not exist"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), f"{_rel(page)} links {target}: no such heading"


def test_pending_pages_leave_the_list_once_they_exist() -> None:
    assert not [page for page in PENDING_PAGES if (ROOT / page).exists()]


def test_results_hold_one_folder_per_runner_and_the_demo_hosts_history() -> None:
    # regress/ and studies/ are their runners' default --out; demo-host/ the demo host's receipts
    # with history/ (its training runs, indexed) and calibrated/ (scripts/calibrated_demo.py);
    # cuda/ the GPU runs of the runners
    folders = {p.name for p in (ROOT / "results").iterdir() if p.is_dir()}
    assert folders <= {"regress", "studies", "demo-host", "cuda"}, folders
    demo_host = {p.name for p in (ROOT / "results/demo-host").iterdir() if p.is_dir()}
    assert demo_host == {"history", "calibrated"} and (HISTORY / "index.md").is_file()


def _shown_commands(text: str) -> list[str]:
    """Every `oretrofit ...` command line in the fenced blocks of a page (continuations joined,
    comments, prompts and leading environment settings dropped)."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip().removeprefix("$ ")
            command = re.search(r"(?:^|\s)(oretrofit [a-z].*)$", line)
            if command and not line.startswith(("import ", "from ")):
                found.append(command.group(1))
    return found


SHOWN = [(_rel(page), command) for page in PAGES for command in _shown_commands(page.read_text())]


@pytest.mark.parametrize("page,command", SHOWN, ids=[f"{p}-{n}" for n, (p, _) in enumerate(SHOWN)])
def test_every_command_shown_parses_against_the_cli(page: str, command: str) -> None:
    # each verb path exists and its options, arguments and types are accepted (nothing is run;
    # what the commands do is tested with the verbs themselves)
    import shlex

    from typer.main import get_command

    from oretrofit.cli.app import app

    argv, command_obj, path = shlex.split(command)[1:], get_command(app), ["oretrofit"]
    while argv and argv[0] in getattr(command_obj, "commands", {}):
        command_obj = command_obj.commands[argv[0]]
        path.append(argv.pop(0))
    assert not hasattr(command_obj, "commands"), f"{command}: names a group, not a verb"
    command_obj.make_context(" ".join(path), argv)


def test_the_pages_show_commands() -> None:
    # the parser above would pass vacuously on a page whose blocks it no longer reads
    shown = {page for page, _ in SHOWN}
    assert {"docs/demo-host.md", "docs/reproducing.md", "docs/studies.md"} <= shown
    assert len(SHOWN) >= 30
