"""docs/mitra.md: its Python example runs as shown, and its site table is the host's."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from oretrofit.hosts.mitra import random_model
from oretrofit.hosts.mitra.host import MitraHost

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "mitra.md").read_text()


def test_python_example_runs_and_prints_what_the_page_says(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "docs/mitra.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    said = re.search(r"prints `(.*)`, `(.*)` and `(.*)`\.", DOC).groups()
    assert printed == list(said)


def test_the_site_table_is_the_hosts():
    rows = re.findall(r"^\| `(\w+)\.k\.(\w+)` \| (\w+) \|", DOC, flags=re.M)
    layer_0 = [(*s.name.split(".0."), s.kind) for s in MitraHost().sites(random_model())
               if ".0." in s.name]
    assert rows == layer_0
    assert "and `out_norm` (norm)" in DOC and MitraHost().sites(random_model())[-1].name == "out_norm"
