"""Issue 33's run-folder cases: settings validated before anything is written, the folder lock,
the temp-file sweep, files named in errors, incomplete groups and constant targets in the
tables, the worker watchdog, and a real `regress` run killed at random moments."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import joblib
import numpy as np
import pandas as pd
import pytest
import torch

from oretrofit._files.atomic import TEMP_SUFFIX
from oretrofit._files.written import RECORD
from oretrofit.cli.app import main
from oretrofit.regress import Matrix, ModelSettings, RunFolder, render, run_matrix
from oretrofit.regress.data import DatasetUnavailable
from oretrofit.regress.protocol import SplitProtocol
from oretrofit.regress.store import FolderBusy, RunMismatch
from oretrofit.tabpfn import load_checkpoint, resolve_model_path
from oretrofit.hosts.tabpfn.checkpoints import save_atomic

SMALL = SplitProtocol(max_train=16, max_test=8)
ROOT = Path(__file__).resolve().parents[2]


def _csv(path: Path, rows: int = 40, y=None) -> Path:
    frame = pd.DataFrame({"a": np.arange(rows, dtype=float), "b": np.arange(rows) % 7})
    frame["y"] = 0.5 * frame["a"] if y is None else y
    frame.to_csv(path, index=False)
    return path


def _run(out: Path, specs, *, seeds=(11,), arms=("base", "oa"), model=None, **kwargs):
    return run_matrix(Matrix(tuple(specs), seeds, arms, (1.0,)), model or ModelSettings("demo"),
                      out, protocol=SMALL, **kwargs)


def _spawn(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


# --- validated before anything is written ----------------------------------------------------

@pytest.mark.parametrize("settings, message", [
    (dict(device="foo"), "unknown --device 'foo'; use cpu, cuda or cuda:N"),
    (dict(n_estimators=0), "--n-estimators must be an integer >= 1, got 0"),
    (dict(inference_precision="float8"), "unknown inference precision 'float8'"),
])
def test_bad_model_settings_are_refused_when_made(settings, message):
    with pytest.raises(ValueError, match=message):
        ModelSettings("demo", **settings)


def test_an_absent_accelerator_is_refused_by_name():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device cuda: no CUDA device .*use --device cpu"):
            ModelSettings("demo", device="cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="--device mps: Apple MPS is not available"):
            ModelSettings("demo", device="mps")


@pytest.mark.parametrize("field, values, shown", [
    ("seeds", (11, 11), "--seeds lists 11 more than once"),
    ("arms", ("base", "oa", "oa"), "--arms lists oa more than once"),
    ("taus", (1.0, 1.0), "--tau lists 1.0 more than once"),
    ("datasets", ("560", "openml:560"), "--datasets/--data lists openml:560 more than once"),
    ("taus", (True,), r"every τ must be a finite positive number, got \[True\]"),
])
def test_a_matrix_refuses_repeats_and_non_numbers(field, values, shown):
    grid = {"datasets": ("sklearn:diabetes",), "seeds": (11,), "arms": ("base",),
            "taus": (1.0,), field: values}
    with pytest.raises(ValueError, match=shown):
        Matrix(**grid)


def _wrong_shape(tmp_path: Path) -> Path:
    checkpoint = dict(load_checkpoint(resolve_model_path("demo")))
    state = dict(checkpoint["state_dict"])
    name = next(k for k, v in state.items() if v.ndim == 2)
    state[name] = state[name][:, :-1].clone()
    return save_atomic({**checkpoint, "state_dict": state}, tmp_path / "shape-v3.ckpt")


def test_a_failed_start_leaves_the_folder_usable(tmp_path):
    out = tmp_path / "run"
    good = _csv(tmp_path / "good.csv")
    cases = [(lambda: _run(out, [f"file:{_csv(tmp_path / 'two.csv', rows=2)}#y"]),
              "two.csv#y has 2 rows; the split leaves 1 train row"),
             (lambda: _run(out, [f"file:{good}#y"],
                           model=ModelSettings(str(_wrong_shape(tmp_path)))),
              "shape-v3.ckpt: its architecture config does not describe its weights"),
             (lambda: _run(out, [f"file:{good}#y"], n_jobs=0), "--n-jobs must be an integer")]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
        assert not out.exists() or not (out / "run.json").exists()
    assert len(_run(out, [f"file:{good}#y"]).cells_run) == 2       # the corrected rerun


def test_unusable_tables_are_named_with_the_fix(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "binary.csv").write_bytes(bytes(range(256)) * 4)
    huge = _csv(tmp_path / "huge.csv", y=np.full(40, 1e300))
    for name, message in (("empty.csv", "cannot be read as CSV"),
                          ("binary.csv", "cannot be read as CSV"),
                          ("huge.csv", "target column 'y' holds 1e\\+300; .*rescale")):
        with pytest.raises(DatasetUnavailable, match=f"{name}.*{message}"):
            _run(tmp_path / "run", [f"file:{tmp_path / name}#y"])
    assert huge.exists() and not (tmp_path / "run" / "run.json").exists()


# --- one writer, no leftovers, named files ---------------------------------------------------

def test_a_second_writer_is_refused_and_a_dead_holder_is_taken_over(tmp_path):
    holder = _spawn(f"""
        import time
        from oretrofit.regress import RunFolder
        with RunFolder({str(tmp_path)!r}).lock():
            print("locked", flush=True)
            time.sleep(120)
    """)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(FolderBusy, match=f"in use by another run .*pid {holder.pid}.*another "
                                         "--out folder"):
        with RunFolder(tmp_path).lock():
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with RunFolder(tmp_path).lock():                            # the dead holder's lock
        assert f"pid {os.getpid()}" in (tmp_path / ".lock").read_text()


def test_temp_files_of_killed_writes_are_swept_on_start(tmp_path):
    out = tmp_path / "run"
    data = f"file:{_csv(tmp_path / 't.csv')}#y"
    _run(out, [data], arms=("base",))
    dead = subprocess.Popen(["true"])
    dead.wait()                                                 # a writer that was killed
    tag = f"{socket.gethostname().replace('.', '-')}.{dead.pid}.ab12{TEMP_SUFFIX}"
    leftovers = [out / "cells" / f".x.json.{tag}", out / f".run.json.{tag}",
                 out / "invocations" / f".y.json.{tag}"]
    live = out / "cells" / f".z.json.{tag.replace(str(dead.pid), str(os.getpid()))}"
    for path in (*leftovers, live):
        path.write_text("{")
    _run(out, [data])
    assert not any(p.exists() for p in leftovers)
    assert live.exists()                                        # a live writer's is kept
    assert len(list((out / "cells").glob("*.json"))) == 2


def test_corrupt_files_are_named_with_the_fix(tmp_path):
    out = tmp_path / "run"
    data = f"file:{_csv(tmp_path / 't.csv')}#y"
    _run(out, [data])
    cell = next((out / "cells").glob("*.json"))
    cell.write_bytes(b"\x00\xff garbage")
    with pytest.raises(RunMismatch, match=f"{cell} is not UTF-8 text .*delete it and re-run"):
        _run(out, [data])
    cell.write_text('{"dataset": "x"}')
    with pytest.raises(RunMismatch, match="is not a complete cell record: it lacks seed, arm, tau, "
                                          "rmse, r2; delete it"):
        render([out], plots=False)
    cell.unlink()
    (out / "run.json").write_text("{not json")
    with pytest.raises(RunMismatch, match=f"{out / 'run.json'} is not valid JSON .*restore it"):
        render([out], plots=False)


# --- tables that do not mislead --------------------------------------------------------------

def test_a_constant_target_renders_with_delta_rmse_undefined(tmp_path):
    out = tmp_path / "run"
    _run(out, [f"file:{_csv(tmp_path / 'c.csv', y=np.full(40, 3.0))}#y",
               f"file:{_csv(tmp_path / 'v.csv')}#y"])
    rendered = render([out], plots=False)
    assert "undefined (base RMSE 0) / — | undefined / —" in rendered.markdown   # ΔRMSE %, ΔR²
    assert "ΔRMSE % is undefined where base RMSE is 0 (a constant target): c seed 11" \
        in rendered.markdown
    mean = next(r for r in rendered.summary.rows if r.dataset == "mean over cells")
    v = next(r for r in rendered.summary.rows if r.name == "v" and r.arm == "oa")
    assert mean.n_seeds == 1 and mean.d_rmse_pct == pytest.approx(v.d_rmse_pct, rel=1e-12)


def test_incomplete_groups_are_left_out_and_named(tmp_path):
    out = tmp_path / "run"
    data = f"file:{_csv(tmp_path / 't.csv')}#y"
    _run(out, [data], seeds=(11, 23))
    oa_23 = next(p for p in (out / "cells").glob("*.json") if "s23__oa" in p.name)
    oa_23.unlink()
    rendered = render([out], plots=False)
    rows = {(r.dataset, r.arm): r for r in rendered.summary.rows}
    assert {r.n_seeds for r in rows.values()} == {1}               # base over seed 11 only
    assert rows[(f"file:{tmp_path / 't.csv'}#y", "base")].rmse == pytest.approx(
        json.loads(next((out / "cells").glob("*s11__base.json")).read_text())["rmse"])
    assert "Incomplete: t seed 23 lacks oa τ=1; its other cells are left out" in rendered.markdown


# --- workers and kills -----------------------------------------------------------------------

def test_loky_workers_are_children_of_the_driver():
    """The watchdog's premise: a worker's parent is the driver until the driver dies."""
    with joblib.parallel_config(backend="loky", n_jobs=2):
        parents = joblib.Parallel()(joblib.delayed(os.getppid)() for _ in range(2))
    assert set(parents) == {os.getpid()}


def test_a_worker_exits_when_its_driver_is_killed(tmp_path):
    (tmp_path / "worker.py").write_text(
        "import os, time\n"
        "from oretrofit.regress.runner import _watch_driver\n"
        "_watch_driver(os.getppid())\n"
        "print('watching', flush=True)\n"
        "time.sleep(120)\n")
    driver = _spawn(f"""
        import subprocess, sys, time
        worker = subprocess.Popen([sys.executable, {str(tmp_path / "worker.py")!r}],
                                  stdout=subprocess.PIPE, text=True)
        assert worker.stdout.readline().strip() == "watching"
        print(worker.pid, flush=True)
        time.sleep(120)
    """)
    worker = int(driver.stdout.readline())
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# A process that has imported everything and forks one real `regress` run per request, so
# each run starts in well under a second: "pid N" when forked, "exit S" when it ended.
_ZYGOTE = """
import json, os, sys
import oretrofit.regress.runner, oretrofit.tabpfn, tabpfn, sklearn  # noqa: F401  (warm)
from oretrofit.cli.app import main
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1), os.dup2(null, 2)
        sys.argv = ["oretrofit", *json.loads(line)]
        try:
            main()
        except SystemExit as exc:
            os._exit(exc.code or 0)
        os._exit(0)
    print("pid", pid, flush=True)
    print("exit", os.waitpid(pid, 0)[1], flush=True)
"""


@pytest.fixture(scope="module")
def zygote():
    process = _spawn(_ZYGOTE)
    yield process
    process.kill()
    process.wait()


def _fork(zygote: subprocess.Popen, args: list[str]) -> int:
    zygote.stdin.write(json.dumps(args) + "\n")
    zygote.stdin.flush()
    return int(zygote.stdout.readline().split()[1])


def _ended(zygote: subprocess.Popen) -> int:
    """The wait status of the last forked run, once it ended."""
    return int(zygote.stdout.readline().split()[1])


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return found


def _wait_for(done: Callable[[], bool], what: str, seconds: float = 300.0) -> None:
    """Poll ``done`` until it holds; a run that failed before getting there fails the test by
    name instead of hanging it."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}; the run failed?"
        time.sleep(0.005)


def _cell_files(out: Path) -> list[Path]:
    return list((out / "cells").glob("*.json"))


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return ["regress", "--data", str(_csv(tmp_path / "t.csv", rows=60)), "--target-column", "y",
            "--datasets", "sklearn:diabetes", "--seeds", "1,2", "--arms", "base,oa,full-o",
            "--tau", "1,0.1,0.01", "--model-path", "demo", "--out", str(tmp_path / "run"),
            "--max-train", "16", "--max-test", "8", "--no-plots", "--json", *extra]


def test_a_regress_run_killed_at_random_moments_resumes_to_every_cell_once(
        tmp_path, capsys, monkeypatch, zygote):
    out, args = tmp_path / "run", _args(tmp_path)
    rng, counts = random.Random(33), []
    for attempt in range(5):                    # each kill lands while cells run or tables render
        pid = _fork(zygote, args)
        _wait_for(lambda: len(list(out.glob("invocations/*.json"))) > attempt,
                  f"run {attempt}'s invocation receipt")      # its cells start now
        # a random moment: after 0-3 more cells are written, plus 0-50 ms
        wanted = len(_cell_files(out)) + rng.randint(0, 3)
        _wait_for(lambda: len(_cell_files(out)) >= wanted, f"{wanted} cells in run {attempt}")
        time.sleep(rng.uniform(0.0, 0.05))
        with contextlib.suppress(ProcessLookupError):       # asserted just below
            os.kill(pid, signal.SIGKILL)
        assert _ended(zygote) == signal.SIGKILL, \
            f"run {attempt} ended before its kill; {counts} cells after the earlier kills"
        counts.append(len(_cell_files(out)))
    monkeypatch.setattr(sys, "argv", ["oretrofit", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 0
    summary = json.loads(capsys.readouterr().out)
    cells = [json.loads(p.read_text()) for p in (out / "cells").iterdir()]
    keys = [(c["dataset"], c["seed"], c["arm"], c["tau"]) for c in cells]
    assert len(keys) == len(set(keys)) == 28            # 2 datasets × 2 seeds × (1 + 2 × 3 τ)
    assert summary["cells_in_shard"] == 28 and counts == sorted(counts)
    assert summary["cells_skipped"] == counts[-1]               # nothing redone after the kills
    assert not [p for p in out.rglob(".*")                      # no temp files left
                if p.name not in (".lock", RECORD)]


def test_killing_a_two_worker_driver_leaves_no_worker_running(tmp_path, zygote):
    out = tmp_path / "run"
    driver = _fork(zygote, _args(tmp_path, "--n-jobs", "2"))
    _wait_for(lambda: bool(_cell_files(out)), "the first cell")  # the workers are computing
    workers = _children(driver)
    assert len(workers) >= 2
    os.kill(driver, signal.SIGKILL)
    assert _ended(zygote) == signal.SIGKILL
    deadline = time.monotonic() + 30
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)]


def test_non_finite_predictions_are_refused_naming_the_cell(monkeypatch):
    """A cell whose predictions held NaN was stored with a NaN RMSE, which `tables` refused with
    "delete it and re-run" (which computed the same NaN)."""
    import numpy as np

    import oretrofit.tabpfn
    from oretrofit._surgery.registry import RetrofitError
    from oretrofit.regress import ModelSettings
    from oretrofit.regress.runner import run_cell
    from oretrofit.regress.store import Cell

    class NaNRegressor:
        def fit(self, X, y):
            return self

        def predict(self, X):
            return np.where(np.arange(len(X)) % 2, np.nan, 1.0)

    monkeypatch.setattr(oretrofit.tabpfn, "make_regressor", lambda *a, **k: (NaNRegressor(), None))
    X, y = np.zeros((10, 2)), np.arange(10.0)
    with pytest.raises(RetrofitError, match=r"^t.csv seed 11 arm base: 3 of 6 predictions of demo "
                                            r"are NaN or infinite, so no RMSE can be scored.*"
                                            r"--inference-precision"):
        run_cell(Cell("t.csv", 11, "base", None), (X[:4], y[:4], X[4:], y[4:]), "demo",
                 ModelSettings("demo"))


@pytest.mark.parametrize("make, message", [
    (lambda path: path.write_text("[]"), "run.json has no settings object; restore it"),
    (os.mkfifo, "run.json is a named pipe (FIFO), not a regular file; restore it"),
    (os.mkdir, "run.json is a folder, not a regular file; restore it")])
def test_a_run_json_that_is_not_one_is_named_when_a_run_binds(tmp_path, make, message):
    """`regress` into a folder whose run.json was a list failed with an AttributeError; a FIFO
    or folder there was overwritten or an IsADirectoryError."""
    from oretrofit.regress.store import RunFolder, RunMismatch
    make(tmp_path / "run.json")
    with pytest.raises(RunMismatch) as refused:
        RunFolder(tmp_path).bind({"model_path": "demo"})
    assert message in str(refused.value)


def test_a_dataset_receipt_that_is_not_one_is_named(tmp_path):
    """A dataset receipt holding a list was a bare TypeError."""
    from oretrofit.regress.data import load_dataset
    from oretrofit.regress.store import RunFolder, RunMismatch, spec_slug
    dataset = load_dataset("sklearn:diabetes")
    path = tmp_path / "datasets" / f"{spec_slug(dataset.spec)}.json"
    path.parent.mkdir()
    path.write_text("[]")
    with pytest.raises(RunMismatch, match=r"is not a dataset receipt \(a JSON object with "
                                          r"sha256\); delete it"):
        RunFolder(tmp_path).record_dataset(dataset)


# --- a local table is known by its content ---------------------------------------------------

def test_a_data_file_that_moved_is_the_same_dataset_and_nothing_is_recomputed(tmp_path):
    """Resumed after its --data file moved (same bytes, new path), a run recomputed every
    cell and its tables listed two datasets both named after the file."""
    table = _csv(tmp_path / "d1.csv")
    out = tmp_path / "run"
    first = _run(out, [f"file:{table}#y"])
    moved = tmp_path / "elsewhere" / "d1.csv"
    moved.parent.mkdir()
    table.rename(moved)
    again = _run(out, [f"file:{moved}#y"])
    assert (again.cells_run, again.cells_skipped) == ([], first.cells_total == 2 and 2)
    assert len(list((out / "datasets").glob("*.json"))) == 1
    rendered = render([out], plots=False)
    assert rendered.summary.datasets == [f"file:{table}#y"]
    assert rendered.markdown.count("| d1 |") == 2              # one row per table layout
    table.write_text(moved.read_text().replace("\n0.0,0,0.0\n", "\n0.0,0,9.0\n"))
    with pytest.raises(RunMismatch, match=r"d1.csv#y changed since this run folder was made"):
        _run(out, [f"file:{table}#y"])                      # other bytes at the first path


def test_two_data_files_with_one_table_are_refused_before_the_folder_is_touched(tmp_path):
    table = _csv(tmp_path / "a.csv")
    twin = tmp_path / "b.csv"
    twin.write_bytes(table.read_bytes())
    with pytest.raises(DatasetUnavailable, match=r"a.csv#y and file:.*b.csv#y hold the same "
                                                 r"table \(SHA-256 [0-9a-f]{12}…\); list it "
                                                 "once"):
        _run(tmp_path / "run", [f"file:{table}#y", f"file:{twin}#y"])
    assert not (tmp_path / "run").exists()
