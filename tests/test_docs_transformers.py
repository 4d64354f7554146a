"""The transformers host's docs: their generated block and tables are current and the Python
examples of docs/transformers.md and docs/transformers-layouts.md run."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "transformers_docs.py"
_spec = importlib.util.spec_from_file_location("transformers_docs", _SCRIPT)
transformers_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(transformers_docs)
DOC, render_into = transformers_docs.DOC, transformers_docs.render_into
OVERVIEW = DOC.parent / "transformers.md"


def test_generated_blocks_are_current() -> None:
    text = DOC.read_text()
    assert render_into(text) == text, "stale: run make docs (scripts/transformers_docs.py)"


def test_generated_tables_are_current() -> None:
    for path, render in transformers_docs.TABLES.items():
        assert path.read_text() == render(), f"{path.name} stale: run make docs"


def _examples(page: Path) -> list[str]:
    # fences indented inside a list item are fragments of the text around them
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_python_examples_run_in_order() -> None:
    code = _examples(OVERVIEW)
    assert len(code) == 3
    namespace: dict[str, object] = {}
    for block in code:
        exec(compile(block, str(OVERVIEW), "exec"), namespace)            # noqa: S102
    assert [row["site"] for row in namespace["r"].report()[:4]] == [
        "embeddings.position_embeddings", "embeddings.token_type_embeddings",
        "embeddings.LayerNorm", "encoder.layer.0.attention.self"]   # as the first example prints
    assert namespace["summary"]["holds"] and namespace["summary"]["failed"] == []   # as printed
    assert namespace["hidden"][1].abs().sum() > 0
    assert namespace["embeddings"].shape == (2, 384)


def test_the_layouts_example_runs() -> None:
    code, = _examples(DOC)
    namespace: dict[str, object] = {}
    exec(compile(code, str(DOC), "exec"), namespace)                        # noqa: S102
    assert namespace["row"].name == "my family"       # registered, matched (asserted inside), gone
