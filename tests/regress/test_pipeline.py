"""End to end on a small random-init v3 checkpoint and the openml cache fixture.

A random host's RMSE means nothing: these tests check the pipeline (cells, receipts, resume,
shards, Dask), not the numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distributed import LocalCluster

from oretrofit.regress import Matrix, ModelSettings, RunMismatch, SplitProtocol, render, run_matrix
from oretrofit.regress.runner import parse_shard, shard_cells
from oretrofit.tabpfn import checkpoint_sha256, write_random_checkpoint

from .conftest import write_openml_cache

PROTOCOL = SplitProtocol(max_train=48, max_test=24)
MATRIX = Matrix(("openml:42",), (11, 23), ("base", "oa", "full-o"), (1e-8, 1.0))
RENDERED = ("tables.md", "tables.tex", "summary.csv", "cells.csv")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two routes to the same 10 cells: a run interrupted after 4 cells and resumed, and two
    shards, one on a Dask LocalCluster and one through joblib."""
    root = tmp_path_factory.mktemp("regress")
    checkpoint = write_random_checkpoint(root / "tabpfn-v3-random-test.ckpt", "small", seed=3)
    cache = write_openml_cache(root / "openml", (42,))
    env = {"root": root, "checkpoint": checkpoint, "cache": str(cache),
           "model": ModelSettings(str(checkpoint)), "resumed": root / "resumed"}

    def stop_after_four(event, cell, done, total):
        if event == "done" and done == 4:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _run(env, env["resumed"], progress=stop_after_four)
    env["finished"] = {p.name: p.stat().st_mtime_ns
                       for p in (env["resumed"] / "cells").glob("*.json")}
    env["resume"] = _run(env, env["resumed"])
    env["shards"] = [root / "shard1-dask", root / "shard2-joblib"]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        env["dask"] = _run(env, env["shards"][0], shard=(1, 2), backend="dask",
                           scheduler=cluster.scheduler_address)
    _run(env, env["shards"][1], shard=(2, 2))
    return env


def _run(env: dict, out: Path, **kwargs):
    return run_matrix(MATRIX, env["model"], out, protocol=PROTOCOL, openml_cache=env["cache"],
                      **kwargs)


def _rendered(folders: list[Path], out: Path) -> dict[str, str]:
    files = render(folders, out, plots=False).files
    return {name: files[name].read_text() for name in RENDERED}


def _metrics(folder: Path) -> dict[str, tuple]:
    return {p.name: (c["rmse"], c["r2"], c["n_train"], c["n_test"], c["split_sha256"])
            for p in sorted((folder / "cells").glob("*.json"))
            for c in [json.loads(p.read_text())]}


def test_every_cell_is_stored_with_its_receipts(env):
    out = env["resumed"]
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    assert len(cells) == 10                                          # 2 seeds × (1 + 2 × 2)
    assert {(c["arm"], c["tau"]) for c in cells} == {("base", None), ("oa", 1e-8), ("oa", 1.0),
                                                     ("full-o", 1e-8), ("full-o", 1.0)}
    for c in cells:
        assert (c["n_train"], c["n_test"], c["n_features"]) == (48, 24, 10)
        assert c["rmse"] > 0 and c["predict_s"] > 0 and c["inference_precision"]
        assert (c["sites_patched"] > 0) == (c["arm"] != "base")
        # Every presence the O sites compute is profiled; base computes none.
        assert (c["presence"]["count"] > 0) == (c["arm"] != "base")
        # ... and attributed to the modules that computed them, every one of them.
        assert sum(p["count"] for p in c["presence_by_module"].values()) == c["presence"]["count"]
        if c["tau"] == 1e-8:
            assert c["presence"]["quantiles"]["0.5"] >= 0.999
    mean_p = {(c["seed"], c["arm"], c["tau"]): c["presence"]["mean"] for c in cells if c["tau"]}
    for (seed, arm, tau), value in mean_p.items():
        if tau == 1.0:
            assert value < mean_p[(seed, arm, 1e-8)]
    assert len({c["split_sha256"] for c in cells}) == 2                # one split per seed
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["checkpoint_sha256"] == checkpoint_sha256(env["checkpoint"])
    assert settings["protocol"]["max_train"] == 48 and "random weights" in settings["weights"]
    dataset = json.loads(next((out / "datasets").glob("*.json")).read_text())
    assert dataset["spec"] == "openml:42" and len(dataset["sha256"]) == 64
    invocations = [json.loads(p.read_text()) for p in (out / "invocations").glob("*.json")]
    assert len(invocations) == 2                                     # interrupted + resumed
    assert all(i["environment"]["packages"]["torch"] and i["argv"] for i in invocations)
    assert invocations[0]["torch_default_dtype"] == "torch.float32"


def test_interrupted_run_resumes_without_redoing_or_duplicating_cells(env):
    finished, resume = env["finished"], env["resume"]
    assert len(finished) == 4
    assert (resume.cells_total, resume.cells_skipped, len(resume.cells_run)) == (10, 4, 6)
    assert {p.name: p.stat().st_mtime_ns for p in (env["resumed"] / "cells").glob("*.json")
            if p.name in finished} == finished                      # finished cells untouched
    again = _run(env, env["resumed"])
    assert (again.cells_skipped, again.cells_run) == (10, [])


def test_shards_partition_the_cells(env):
    cells = MATRIX.cells()
    shards = [shard_cells(cells, *parse_shard(f"{i}/3")) for i in (1, 2, 3)]
    assert sorted(c for s in shards for c in s) == sorted(cells)
    assert [len(s) for s in shards] == [4, 3, 3]
    with pytest.raises(ValueError, match="i/n with 1 <= i <= n"):
        parse_shard("4/3")


def test_dask_backend_gives_the_same_cells(env):
    dask_cells = _metrics(env["shards"][0])
    assert len(env["dask"].cells_run) == len(dask_cells) == 5
    resumed = _metrics(env["resumed"])
    assert dask_cells == {name: resumed[name] for name in dask_cells}


def test_resumed_run_and_shard_union_render_identical_tables(env, tmp_path):
    assert _rendered([env["resumed"]], tmp_path / "a") == _rendered(env["shards"], tmp_path / "b")


def test_tables_render_beside_the_paper_with_plots(env, tmp_path):
    rendered = render([env["resumed"]], tmp_path)
    md = rendered.markdown
    assert md.count("(Table 2 layout)") == 2 and md.count("(Table 7 layout)") == 2
    assert "| diabetes_fixture | 2 |" in md and "mean over 2 cells" in md
    assert "\\begin{tabular}" in (tmp_path / "tables.tex").read_text()
    header = (tmp_path / "summary.csv").read_text().splitlines()[0]
    assert header.startswith("tau,dataset,name,arm,n_seeds,rmse,r2,d_rmse_pct")
    assert len((tmp_path / "cells.csv").read_text().splitlines()) == 11
    for png in ("delta_rmse.png", "delta_rmse_vs_tau.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_refuses_results_from_another_checkpoint(env, tmp_path):
    other = write_random_checkpoint(tmp_path / "tabpfn-v3-other.ckpt", "small", seed=4)
    with pytest.raises(RunMismatch, match="use a new --out folder"):
        run_matrix(MATRIX, ModelSettings(str(other)), env["resumed"],
                   protocol=PROTOCOL, openml_cache=env["cache"])
    with pytest.raises(RunMismatch, match="other settings"):
        render([env["resumed"], _other_folder(env, other, tmp_path)], tmp_path / "t")


def _other_folder(env: dict, checkpoint: Path, tmp_path: Path) -> Path:
    out = tmp_path / "other"
    run_matrix(Matrix(("openml:42",), (11,), ("base",)), ModelSettings(str(checkpoint)), out,
               protocol=PROTOCOL, openml_cache=env["cache"])
    return out



def test_a_cells_presence_profile_is_every_presence_its_fit_and_predict_computed(env, monkeypatch):
    import contextlib

    import numpy as np

    from oretrofit import PresenceProfile, observe_presence
    from oretrofit.regress import runner
    from oretrofit.regress.store import Cell

    independent = PresenceProfile()
    by_module = runner.presence_by_module

    @contextlib.contextmanager
    def also_observed(model):                            # an independent observer, same block
        with by_module(model) as profiles, observe_presence(independent):
            yield profiles

    monkeypatch.setattr(runner, "presence_by_module", also_observed)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 4)), rng.normal(size=40)
    _, result = runner.run_cell(Cell("sklearn:diabetes", 11, "full-o", 1.0),
                                (X[:30], y[:30], X[30:], y[30:]), str(env["checkpoint"]), env["model"])
    want, got = independent.summary(), result["presence"]
    assert independent.count > 0
    # Histogram-derived fields are exact; the mean sums in another order (per module first).
    assert {k: v for k, v in got.items() if k != "mean"} == {k: v for k, v in want.items() if k != "mean"}
    assert got["mean"] == pytest.approx(want["mean"], rel=1e-12)
