"""scripts/api_docs.py builds the API reference: a page per public module, each documenting
the names users call."""

from __future__ import annotations

import importlib.util
from pathlib import Path


import pdoc  # noqa: F401  (the API reference needs it: pip install -e '.[test]')

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "api_docs.py"
_spec = importlib.util.spec_from_file_location("api_docs", _SCRIPT)
api_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_docs)


def test_the_reference_has_a_page_per_public_module_with_its_functions(tmp_path) -> None:
    pages = api_docs.build(tmp_path)
    names = {page.relative_to(tmp_path).as_posix() for page in pages}
    assert names == {"index.html", "oretrofit.html", "oretrofit/transformers.html",
                     "oretrofit/tabpfn.html", "oretrofit/tabicl.html", "oretrofit/tabdpt.html"}
    package = (tmp_path / "oretrofit.html").read_text()
    for name in ("retrofit", "retrofitted", "plan_retrofit", "apply_spec"):
        assert f'id="{name}"' in package, name
    assert 'id="zero_padded_inputs"' in (tmp_path / "oretrofit" / "transformers.html").read_text()
    assert (tmp_path / "search.js").is_file()
