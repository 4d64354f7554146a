"""The wheel stands alone: built from a copy of the project, installed into an environment of
its own, it runs the README's examples from a folder outside the checkout, its metadata
declares what that environment satisfies, and the README and docs pages it installs link only
to what it installs.

The environment is layered as the release sweeps' (``scripts/release_envs.py``): a ``venv``
whose ``.pth`` puts the main environment's site-packages on the path as a plain folder, so the
main environment's dependencies are found but not its editable install of this checkout (that
hook lives in a ``.pth`` file a plain folder entry does not run); the wheel goes in with
``--no-deps``, and its declared requirements are then checked against what is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# top-level folders of the checkout the build does not read (environments, tests, outputs)
_NOT_BUILT_FROM = {".git", ".venv", ".venv-releases", "tests", "benchmarks", "build",
                   ".pytest_cache", "oretrofit.egg-info"}
_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
_ENV.pop("PYTHONPATH", None)


def _ignored(folder: str, names: list[str]) -> set[str]:
    """What :func:`shutil.copytree` leaves out of the build's copy of the checkout."""
    top = _NOT_BUILT_FROM if Path(folder) == ROOT else set()
    return {name for name in names if name in top or name == "__pycache__"}


def _run(command: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=_ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the environment's python, a working folder outside the checkout) with the wheel built
    from this checkout installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=_ignored)
    # built as pip builds it for a user: in an isolated environment with the build requirements
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
          str(tmp / "dist"), str(source)], tmp)
    wheel, = (tmp / "dist").glob("oretrofit-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   tmp).stdout.strip()
    (Path(purelib) / "_main_site_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
          str(wheel)], tmp)
    work = tmp / "work"
    work.mkdir()
    return python, work


def _doc_root(python: Path, work: Path) -> Path:
    return Path(_run([str(python), "-c", "import sys; print(sys.prefix)"], work).stdout.strip()) \
        / "share" / "doc" / "oretrofit"


def test_the_installed_package_is_the_wheels(installed) -> None:
    python, work = installed
    probe = ("import oretrofit, oretrofit.studies, oretrofit.regress, oretrofit.tabpfn; "
             "print(oretrofit.__file__)")
    where = Path(_run([str(python), "-c", probe], work).stdout.strip())
    assert where.is_relative_to(python.parent.parent) and not where.is_relative_to(ROOT)
    assert (where.parent / "py.typed").is_file()              # typed, for type checkers
    version = _run([str(python), "-c", "import oretrofit; print(oretrofit.__version__)"], work)
    assert _run([str(python.parent / "oretrofit"), "--version"], work).stdout == \
        f"oretrofit {version.stdout}"


def test_the_declared_requirements_are_met_by_the_tested_environment(installed) -> None:
    """Every requirement of the wheel, with every extra ``all`` names, holds in the environment
    the tests run in (torch's range among them)."""
    python, work = installed
    probe = ("import importlib.metadata as m, json; d = m.distribution('oretrofit'); "
             "print(json.dumps({'requires': d.requires, 'versions': {p.metadata['Name'].lower()"
             ".replace('_', '-'): p.version for p in m.distributions()}}))")
    found = json.loads(_run([str(python), "-c", probe], work).stdout)
    extras = {"all", "tabpfn", "regress", "dask", "hf", "studies", "datasets", "models"}
    checked = 0
    for line in found["requires"]:
        requirement = Requirement(line)
        if requirement.name == "oretrofit" or not any(
                requirement.marker is None or requirement.marker.evaluate({"extra": extra})
                for extra in extras):
            continue
        version = found["versions"].get(requirement.name.lower().replace("_", "-"))
        assert version is not None and requirement.specifier.contains(version, prereleases=True), \
            f"{requirement} is declared; the tested environment has {requirement.name} {version}"
        checked += 1
    assert checked >= 15


def _python_examples(readme: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme, flags=re.S)


def test_the_readme_examples_run_outside_the_checkout(installed) -> None:
    python, work = installed
    readme = (_doc_root(python, work) / "README.md").read_text()
    examples = _python_examples(readme)
    assert len(examples) == 3
    for example in examples:
        printed = _run([str(python), "-c", example], work).stdout.split()
        assert printed, example
    demo = _run([str(python.parent / "oretrofit"), "patch", "--arm", "full-o", "--tau", "1e-8",
                 "--model-path", "demo", "--json"], work)
    assert json.loads(demo.stdout)


def test_the_installed_pages_link_only_to_installed_files(installed) -> None:
    """The README and every docs page the wheel installs resolve their relative links inside
    the installed documentation (no link to a repository file the wheel lacks)."""
    python, work = installed
    root = _doc_root(python, work)
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    assert len(pages) == 1 + len(list((ROOT / "docs").glob("*.md")))
    missing = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            target = link.split("#", 1)[0]
            if target and not re.match(r"[a-z]+:", target) and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(root)} -> {link}")
    assert not missing, missing
