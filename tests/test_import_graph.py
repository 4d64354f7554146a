"""The import graph of the package has no circle, runs from higher layers to lower ones only,
and the hosts come in their documented order.

Every ``import`` statement of every module under ``oretrofit/`` counts, function-level (lazy)
ones included; an import of a module's attribute (``from . import __version__``) is an edge to
that module. The built-in hosts are found through a table of module names
(``oretrofit._surgery.host.BUILTIN_HOSTS``), so the registry never imports a host.

The layers, lowest first (:data:`LAYERS`): the core (``oretrofit._*``, in rooms of its own:
:data:`ROOMS`); the hosts
(``oretrofit.hosts``, one folder per host, which import the core and ``hosts.torch_nn`` only);
the public facades (``oretrofit`` itself, ``oretrofit.tabpfn``, ``oretrofit.tabdpt``,
``oretrofit.tabicl``, ``oretrofit.transformers``); the
runners (``regress``, ``sweep``, ``studies``); the demo host's training code (``demo_host``,
which uses ``regress``); the CLI.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import oretrofit
from oretrofit._surgery.moved import MOVED

PACKAGE = Path(oretrofit.__file__).parent
ROOT = PACKAGE.parent

# lowest first: a module imports modules of its own layer and of the layers below it only
LAYERS = [("core", ("oretrofit._",)),
          ("hosts", ("oretrofit.hosts",)),
          ("facades", ("oretrofit", "oretrofit.tabpfn", "oretrofit.tabdpt", "oretrofit.tabicl",
                       "oretrofit.transformers")),
          ("runners", ("oretrofit.regress", "oretrofit.sweep", "oretrofit.studies")),
          ("demo host", ("oretrofit.demo_host",)),
          ("cli", ("oretrofit.cli",))]


# the core's rooms, and the other rooms each may import (besides itself): the kernels and the
# files import nothing else of oretrofit, the operators the kernels, the surgery the rest
ROOMS = {"oretrofit._kernels": set(), "oretrofit._files": set(),
         "oretrofit._operators": {"oretrofit._kernels"},
         "oretrofit._surgery": {"oretrofit._operators", "oretrofit._kernels", "oretrofit._files"}}


def room(module: str) -> str | None:
    """The room of :data:`ROOMS` that holds ``module``, or None outside the core."""
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (the longest matching prefix)."""
    matches = [(len(prefix), n) for n, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix if prefix.endswith("_")
                                                        else prefix + ".")]
    assert matches, f"{module} is in no layer of LAYERS"
    return max(matches)[1]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _prefix(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from … import`` statement imports from."""
    base = module.split(".")[:len(module.split(".")) + is_package - node.level]
    return ".".join(base + [node.module] if node.module else base) if node.level else node.module


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             modules: dict[str, Path]) -> set[str]:
    """The oretrofit modules one import statement loads (their parents' ``__init__`` aside)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    prefix = _prefix(module, is_package, node)
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
    assert "oretrofit._surgery.host" in graph["oretrofit.hosts.torch_nn"]
    assert "oretrofit._files.provenance" in graph["oretrofit._surgery.registry"]
    assert {"oretrofit._surgery.host", "oretrofit._surgery.compose"} <= graph["oretrofit._surgery.registry"]
    assert "oretrofit._surgery.registry" in graph["oretrofit.hosts.transformers.contracts"]   # from ...
    assert "oretrofit.hosts.torch_nn" in graph["oretrofit.hosts.tabpfn.v3"]          # from ..


def test_no_import_cycle_among_oretrofit_modules() -> None:
    assert find_cycle(import_graph()) is None
    host_modules = {m for m in _modules() if m.startswith("oretrofit.hosts.")}
    assert host_modules and not import_graph()["oretrofit._surgery.host"] & (host_modules
                                                                     | {"oretrofit._surgery.registry"})


def _documented_order() -> list[tuple[str, int]]:
    """The table in ``oretrofit._surgery.host``'s docstring: ``name  specificity  description``."""
    from oretrofit._surgery import host as _host
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"^ {4}(\S+) +(\d+) {3}", _host.__doc__, re.MULTILINE)]


def test_fresh_interpreter_lists_the_hosts_in_documented_order() -> None:
    code = ("import json, sys, oretrofit\n"
            "hosts = oretrofit.registered_hosts()\n"
            "loaded = sorted(m for m, module in sys.modules.items()\n"
            "                if m.split('.')[0] == 'oretrofit' and module.__name__ == m)\n"
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


def test_the_layer_finder_sees_an_upward_import() -> None:
    assert [layer(m) for m in ("oretrofit._surgery.registry", "oretrofit.hosts.tabpfn.v3", "oretrofit",
                               "oretrofit.tabpfn", "oretrofit.transformers",
                               "oretrofit.regress.runner", "oretrofit.demo_host.train",
                               "oretrofit.cli.app")] == [0, 1, 2, 2, 2, 3, 4, 5]
    assert layer("oretrofit.hosts.torch_nn") > layer("oretrofit._surgery.host")


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that go up a layer, or from a room of the core to a room it may
    not import (:data:`ROOMS`), as ``a -> b``."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if layer(b) > layer(a)
                  or room(a) is not None and room(b) not in (room(a), *ROOMS[room(a)]))


def test_the_layer_check_sees_a_planted_wrong_way_import() -> None:
    graph = import_graph()
    assert not wrong_way(graph)
    planted = {"oretrofit._kernels.lse -> oretrofit._operators.presence",        # up a room
               "oretrofit._files.atomic -> oretrofit._kernels.dtypes",          # across
               "oretrofit._operators.presence -> oretrofit._files.reading",     # not allowed
               "oretrofit._surgery.registry -> oretrofit.hosts.torch_nn",       # up a layer
               "oretrofit._files.provenance -> oretrofit._surgery.moved",       # from a leaf
               "oretrofit.hosts.torch_nn -> oretrofit.cli.app"}
    for edge in planted:
        a, b = edge.split(" -> ")
        assert wrong_way({**graph, a: graph[a] | {b}}) == [edge]
    # and allowed ones pass: a room importing itself and what lies below it
    assert not wrong_way({"oretrofit._surgery.registry": {"oretrofit._kernels.dtypes",
                                                          "oretrofit._files.reading",
                                                          "oretrofit._surgery.host"},
                          "oretrofit._operators.presence": {"oretrofit._kernels.dtypes"}})


def test_every_core_module_is_in_a_room() -> None:
    core = [m for m in import_graph() if m.startswith("oretrofit._")]
    assert core and [m for m in core if room(m) is None] == []


def test_the_package_root_lists_at_most_17_entries() -> None:
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 17, entries


def test_imports_run_from_higher_layers_to_lower_ones_only() -> None:
    upward = wrong_way(import_graph())
    assert not upward, upward


def test_hosts_import_the_core_and_the_torch_nn_host_only() -> None:
    graph = import_graph()
    hosts = {m: e for m, e in graph.items() if m.startswith("oretrofit.hosts")}
    assert {"oretrofit.hosts.torch_nn", "oretrofit.hosts.transformers.host",
            "oretrofit.hosts.tabpfn.v3", "oretrofit.hosts.tabpfn.checkpoints"} <= set(hosts)
    for module, targets in hosts.items():
        for target in targets:
            assert not target.startswith(("oretrofit.tabpfn", "oretrofit.tabdpt",
                                          "oretrofit.tabicl", "oretrofit.transformers",
                                          "oretrofit.cli", "oretrofit.regress",
                                          "oretrofit.studies", "oretrofit.sweep",
                                          "oretrofit.demo_host")), f"{module} -> {target}"
            assert target != "oretrofit", f"{module} imports the package facade"
            # one host never imports another; hosts.torch_nn is the shared fallback
            own = ".".join(module.split(".")[:3])
            assert (target.startswith("oretrofit._") or target == "oretrofit.hosts.torch_nn"
                    or target.startswith(own + ".") or target == own), f"{module} -> {target}"
    core = {m: e for m, e in graph.items() if m.startswith("oretrofit._")}
    assert core and not [f"{m} -> {t}" for m, e in core.items() for t in e
                         if not t.startswith("oretrofit._")]


def _python_files() -> list[Path]:
    return [path for folder in ("oretrofit", "tests", "scripts", "benchmarks")
            for path in (ROOT / folder).rglob("*.py")]


def test_every_oretrofit_import_names_a_module_that_exists() -> None:
    # a stale name (a module that moved) would otherwise go unseen where an installed copy of
    # the package still has it
    modules = _modules()
    stale = []
    for path in _python_files():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (not node.level
                                                       or path.is_relative_to(PACKAGE)):
                prefix = _prefix(name, path.name == "__init__.py", node)
                # an old module path still imports (for pickles: MOVED), so name it stale here
                names = [prefix] + [f"{prefix}.{a.name}" for a in node.names
                                    if f"{prefix}.{a.name}" in MOVED]
            else:
                continue
            stale += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] == "oretrofit" and (n not in modules or n in MOVED)]
    assert not stale, stale


def test_nothing_in_the_package_imports_test_data() -> None:
    # the architectures the tests cover are test data (tests/hosts/transformers/zoo.py): the
    # wheel has no tests/
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or "", *(a.name for a in node.names)]
                     if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if "zoo" in n.split(".") or n.split(".")[0] in ("tests", "hosts")]
    assert not found, found
