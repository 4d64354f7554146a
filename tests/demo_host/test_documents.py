"""A document's `demo-host compare` tables are found after their commands and rewritten from the receipts."""

import json

import pytest
from typer.testing import CliRunner

from oretrofit.demo_host.card import compare_runs
from oretrofit.demo_host.documents import comparisons, labelled_receipts, refresh_comparisons

from .test_card import _run_receipt

DOC = """# Runs

Intro text.

* A list item whose comparison is indented:

  ```
  oretrofit demo-host compare --receipt "run a=a.json" \\
      --receipt "run b=b.json"
  ```

  | run | stale |
  |---|---|
  | run a | 0.000 |

  Text after the table.

```bash
oretrofit demo-host eval --checkpoint x.ckpt
```

| not | a comparison |
|---|---|

```
oretrofit demo-host compare --receipt "only b=b.json"
```
"""


@pytest.fixture
def receipts(tmp_path):
    for name, r2 in (("a", 0.5), ("b", 0.4)):
        (tmp_path / f"{name}.json").write_text(
            json.dumps(_run_receipt({"sklearn:diabetes": r2, "sklearn:friedman1": 0.7}, sha=name * 2)))
    return tmp_path


def test_only_compare_commands_are_comparisons_with_or_without_a_table():
    stale, new = comparisons(DOC)
    assert stale.receipt_items() == ["run a=a.json", "run b=b.json"] and stale.indent == "  "
    assert stale.table.splitlines()[0] == "| run | stale |"
    assert new.receipt_items() == ["only b=b.json"] and new.table == "" and new.start == new.end


def _table(items, root, indent=""):
    return "\n".join(indent + row for row in compare_runs(labelled_receipts(items, root)).strip().splitlines())


def test_a_stale_table_is_rewritten_in_place_a_missing_one_added_and_nothing_else_moves(receipts):
    text, changed = refresh_comparisons(DOC, receipts)
    assert changed == 2
    stale = _table(["run a=a.json", "run b=b.json"], receipts, indent="  ")  # the list item's indent kept
    assert "| run a | 0.000 |" not in text and stale in text
    before, middle = DOC.split("  | run | stale |")[0], DOC.split("| run a | 0.000 |\n")[1]
    assert text.startswith(before) and middle in text
    assert text.endswith("only b=b.json\"\n```\n\n" + _table(["only b=b.json"], receipts) + "\n")
    assert refresh_comparisons(text, receipts) == (text, 0)  # a fresh document is left alone


def test_a_table_added_before_text_is_set_off_by_blank_lines(receipts):
    doc = '```\noretrofit demo-host compare --receipt "a=a.json"\n```\nText right after.\n'
    text, changed = refresh_comparisons(doc, receipts)
    assert changed == 1
    assert text == doc.replace("```\nText", "```\n\n" + _table(["a=a.json"], receipts) + "\n\nText")


def test_a_missing_receipt_or_an_unclosed_fence_is_named(tmp_path):
    with pytest.raises(ValueError, match="b.json does not exist"):
        refresh_comparisons(DOC, tmp_path)
    with pytest.raises(ValueError, match="line 1 is never closed"):
        comparisons("```\noretrofit demo-host compare --receipt x=y.json\n")


def _refresh_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "refresh_docs.py"
    spec = importlib.util.spec_from_file_location("refresh_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_docs_script_checks_then_rewrites_the_document(receipts, monkeypatch, capsys):
    script = _refresh_script()
    monkeypatch.setattr(script, "ROOT", receipts)  # receipt paths are relative to the repository root
    doc = receipts / "doc.md"
    doc.write_text(DOC)
    assert script.main(["--check", str(doc)]) == 1
    assert "2 table(s) stale" in capsys.readouterr().out and doc.read_text() == DOC
    assert script.main([str(doc)]) == 0 and doc.read_text() == refresh_comparisons(DOC, receipts)[0]
    assert script.main(["--check", str(doc)]) == 0 and "0 table(s) stale" in capsys.readouterr().out
    assert script.main([str(receipts / "none.md")]) == 2 and "none.md" in capsys.readouterr().err


def test_make_docs_covers_every_document():
    script = _refresh_script()
    names = {path.relative_to(script.ROOT).as_posix() for path in script.documents()}
    assert {"README.md", "docs/demo-host.md", "results/demo-host/history/attempts.md"} <= names


def test_the_old_refresh_verb_is_a_hidden_alias_that_names_make_docs(receipts, monkeypatch):
    from oretrofit.cli.app import app

    doc = receipts / "doc.md"
    doc.write_text(DOC)
    monkeypatch.chdir(receipts)  # receipt paths are relative to where the command runs
    check = CliRunner().invoke(app, ["pretrain-refresh-docs", "--check", str(doc)])
    assert check.exit_code == 1 and "2 table(s) stale" in check.output and doc.read_text() == DOC
    assert "is now `make docs`" in check.output
    gone = CliRunner().invoke(app, ["pretrain-refresh-docs", str(receipts / "none.md")])
    assert gone.exit_code == 2 and "none.md" in gone.output
