"""The import graph of the package has no circle, and the hosts come in their documented order.

Every ``import`` statement of every module under ``oretrofit/`` counts, function-level (lazy)
ones included; an import of a module's attribute (``from . import __version__``) is an edge to
that module. The built-in hosts are found through a table of module names
(``oretrofit._host.BUILTIN_HOSTS``), so the registry never imports a host.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import oretrofit

PACKAGE = Path(oretrofit.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             modules: dict[str, Path]) -> set[str]:
    """The oretrofit modules one import statement loads (their parents' ``__init__`` aside)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    base = module.split(".")[:len(module.split(".")) + is_package - node.level]
    prefix = ".".join(base + [node.module] if node.module else base) if node.level else node.module
    found = set()
    for alias in node.names:
        sub = f"{prefix}.{alias.name}"
        found.add(sub if sub in modules else prefix)
    return found & set(modules)


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(name, path.name == "__init__.py", node, modules)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}                       # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_sees_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_resolves_relative_imports() -> None:
    graph = import_graph()
    assert "oretrofit._host" in graph["oretrofit.hosts.torch_nn"]
    assert "oretrofit._version" in graph["oretrofit._registry"]
    assert {"oretrofit._host", "oretrofit._compose"} <= graph["oretrofit._registry"]


def test_no_import_cycle_among_oretrofit_modules() -> None:
    assert find_cycle(import_graph()) is None
    host_modules = {m for m in _modules() if m.startswith("oretrofit.hosts.")}
    assert not import_graph()["oretrofit._host"] & (host_modules | {"oretrofit._registry"})


def _documented_order() -> list[tuple[str, int]]:
    """The table in ``oretrofit._host``'s docstring: ``name  specificity  description``."""
    from oretrofit import _host
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"^ {4}(\S+) +(\d+) {3}", _host.__doc__, re.MULTILINE)]


def test_fresh_interpreter_lists_the_hosts_in_documented_order() -> None:
    code = ("import json, sys, oretrofit\n"
            "hosts = oretrofit.registered_hosts()\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'oretrofit')\n"
            "print(json.dumps([[[h.name, h.specificity] for h in hosts], loaded]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent)
    pairs, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    hosts = [tuple(pair) for pair in pairs]
    graph = import_graph()
    assert "oretrofit.hosts.torch_nn" in loaded and set(loaded) <= set(graph)
    assert find_cycle({m: graph[m] & set(loaded) for m in loaded}) is None
    assert hosts == _documented_order()
    assert [s for _, s in hosts] == sorted((s for _, s in hosts), reverse=True)
    assert hosts[-1] == ("torch.nn", 0)
