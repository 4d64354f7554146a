"""docs/tabdpt.md: its Python example runs as shown, and its site table is the host's."""

from __future__ import annotations

import re
from pathlib import Path

from oretrofit.hosts.tabdpt.host import TabDPTHost

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "tabdpt.md").read_text()


def test_python_example_runs_and_prints_what_the_page_says(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)
    exec(compile(code, "docs/tabdpt.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    said = re.search(r"prints `(.*)`, `(.*)` and `(.*)`\.", DOC).groups()
    assert printed == list(said)


def test_the_site_table_is_the_hosts(model):
    rows = re.findall(r"^\| `icl\.k\.(\w+)` \| (\w+) \|", DOC, flags=re.M)
    layer_0 = [(s.name.removeprefix("icl.0."), s.kind) for s in TabDPTHost().sites(model)
               if s.name.startswith("icl.0.")]
    assert rows == layer_0
