"""Per-site τ variants of a regression matrix on the demo host: a calibrated spec (`--tau-spec`)
and the site-family ablation (`--ablate-sites`), their binding in run.json, their rows, the
ablation ranking, the τ curve and plot, and folders from before variants rendering unchanged."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import pytest
from typer.testing import CliRunner

from oretrofit.cli.app import app
from oretrofit.regress import Matrix, ModelSettings, RunMismatch, SplitProtocol, render, run_matrix
from oretrofit.regress.calibrate import calibrate_tabpfn
from oretrofit.regress.data import load_datasets
from oretrofit.regress.variants import (ablation_variants, arm_sites, checkpoint_arm_sites,
                                        site_families, spec_variant)
from oretrofit.tabpfn import build_model, load_checkpoint, resolve_model_path
from oretrofit.hosts.tabpfn.estimators import estimator_from_checkpoint, spec_patch

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = SplitProtocol(max_train=48, max_test=24)
CAPS = ("--max-train", "48", "--max-test", "24")
DATASET, SEEDS, TAUS = "sklearn:diabetes", (11, 23), (1e-8, 1e-2, 1.0)


def _spec(tmp: Path, arm: str) -> Path:
    dataset = load_datasets([DATASET])[DATASET]
    spec = calibrate_tabpfn("demo", [dataset], [11], arm=arm, protocol=PROTOCOL)
    path = tmp / f"spec-{arm}.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One folder: base, OA and Full-O over three τ, both calibrated specs and two Full-O
    ablations (fde.*, norm) at stress τ 1, on diabetes × seeds 11, 23."""
    root = tmp_path_factory.mktemp("variants")
    specs = {arm: _spec(root, arm) for arm in ("oa", "full-o")}
    arms = ("base", "oa", "full-o")
    ablations = ablation_variants(checkpoint_arm_sites("demo"), ("full-o",), ("fde.*", "norm"),
                                  TAUS[0], 1.0)
    matrix = Matrix((DATASET,), SEEDS, arms, TAUS,
                    (*(spec_variant(p, arms) for p in specs.values()), *ablations))
    out = root / "run"
    run_matrix(matrix, ModelSettings("demo"), out, protocol=PROTOCOL)
    return {"root": root, "specs": specs, "matrix": matrix, "out": out}


def _cells(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]


def test_each_variant_adds_one_cell_per_dataset_and_seed(env):
    cells = _cells(env["out"])
    # 2 seeds × (base + 2 O arms × 3 τ + 2 calibrated + 2 ablations)
    assert len(cells) == 2 * (1 + 2 * 3 + 2 + 2)
    variants = {(c["arm"], c["variant"]) for c in cells if "variant" in c}
    assert variants == {("oa", "calibrated-d0.001-q0.01"), ("full-o", "calibrated-d0.001-q0.01"),
                        ("full-o", "ablate-fde"), ("full-o", "ablate-norm")}
    assert all("variant" not in c for c in cells if c["arm"] == "base")


def test_run_json_binds_each_variants_full_site_tau_and_spec_hash(env):
    bound = json.loads((env["out"] / "run.json").read_text())["variants"]
    for arm, path in env["specs"].items():
        spec = json.loads(path.read_text())
        record = bound[f"{arm}/calibrated-d0.001-q0.01"]
        assert record["site_tau"] == spec["site_tau"] and len(record["site_tau"]) > 1
        assert (record["tau"], record["eps"]) == (spec["tau"], spec["eps"])
        assert record["spec_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    norm = bound["full-o/ablate-norm"]
    assert norm["tau"] == TAUS[0] and set(norm["site_tau"].values()) == {1.0}
    assert sorted(norm["site_tau"]) == sorted(
        s for s, kind in checkpoint_arm_sites("demo")["full-o"] if kind == "norm")


def test_the_calibrated_cell_equals_the_spec_applied_directly(env):
    """The variant cell's prediction is the spec's patch re-applied (apply_spec), not a τ."""
    spec = json.loads(env["specs"]["full-o"].read_text())
    dataset = load_datasets([DATASET])[DATASET]
    split = PROTOCOL.split(len(dataset.y), 23)
    regressor, _ = estimator_from_checkpoint(resolve_model_path("demo"), spec_patch(spec),
                                             random_state=23, n_estimators=1, device="cpu",
                                             inference_precision=torch.float32)
    prediction = regressor.fit(dataset.X[split.train], dataset.y[split.train]).predict(
        dataset.X[split.test])
    rmse = float(np.sqrt(np.mean((prediction - dataset.y[split.test]) ** 2)))
    cell = next(c for c in _cells(env["out"]) if c["seed"] == 23 and c["arm"] == "full-o"
                and c.get("variant") == "calibrated-d0.001-q0.01")
    assert cell["rmse"] == pytest.approx(rmse, rel=1e-12)
    assert cell["sites_patched"] == len(spec["sites"])


def test_resuming_with_another_spec_under_the_same_name_is_refused(env, tmp_path):
    spec = json.loads(env["specs"]["oa"].read_text())
    first = next(iter(spec["site_tau"]))
    spec["site_tau"][first] *= 10
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(spec))
    arms = ("base", "oa")
    matrix = Matrix((DATASET,), SEEDS, arms, TAUS[:1], (spec_variant(changed, arms),))
    with pytest.raises(RunMismatch, match="already ran variant oa/calibrated-d0.001-q0.01 with "
                                          "another definition"):
        run_matrix(matrix, ModelSettings("demo"), env["out"], protocol=PROTOCOL)


def test_bad_tau_specs_are_refused_by_name(env, tmp_path):
    arms = ("base", "oa")
    with pytest.raises(ValueError, match="spec of arm full-o, which --arms .* does not run"):
        spec_variant(env["specs"]["full-o"], arms)
    spec = json.loads(env["specs"]["oa"].read_text())
    for change, message in (({"arm": "base"}, "arm is .base., which patches nothing"),
                            ({"targets": ["fde.*"]}, "restricts its sites")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**spec, **change}))
        with pytest.raises(ValueError, match=message):
            spec_variant(path, arms)
    other = dict(spec, calibration={**spec["calibration"], "data": {
        **spec["calibration"]["data"], "checkpoint_sha256": "0" * 64}})
    path = tmp_path / "other-host.json"
    path.write_text(json.dumps(other))
    matrix = Matrix((DATASET,), SEEDS, arms, TAUS[:1], (spec_variant(path, arms),))
    with pytest.raises(ValueError, match="calibrated on checkpoint 000000000000"):
        run_matrix(matrix, ModelSettings("demo"), tmp_path / "never", protocol=PROTOCOL)
    assert not (tmp_path / "never" / "run.json").exists()


def test_site_families_are_kinds_and_name_prefixes():
    model = build_model(load_checkpoint(resolve_model_path("demo")))[0]
    sites = arm_sites(model)
    families = site_families(sites["full-o"])
    assert {"fde.*", "col.*", "icl.*", "te.*", "norm", "ffn", "attention", "inject"} <= set(families)
    assert families["te.*"] == ["te.col", "te.icl"]
    assert all(s.startswith("icl.") for s in families["icl.*"])
    assert set(site_families(sites["oa"])) == {"fde.*", "col.*", "icl.*", "attention"}
    with pytest.raises(ValueError, match="unknown site family xyz.*; families are"):
        ablation_variants(sites, ("oa", "full-o"), ("xyz.*",), 1e-8, 1.0)
    with pytest.raises(ValueError, match="site family norm matches no site of arm oa"):
        ablation_variants(sites, ("base", "oa", "full-o"), ("norm",), 1e-8, 1.0)
    (only,) = ablation_variants(sites, ("base", "full-o"), ("te.*",), 1e-8, 2.0)
    assert (only.arm, only.name, only.site_tau) == ("full-o", "ablate-te",
                                                    {"te.col": 2.0, "te.icl": 2.0})


def _invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_refuses_bad_ablations_before_writing_anything(tmp_path):
    out = tmp_path / "run"
    common = ("regress", "--datasets", DATASET, "--seeds", "11", "--model-path", "demo",
              "--out", out, "--no-plots", *CAPS)
    for extra, message in ((("--ablate-sites", "fde.*,bogus"), "unknown site family bogus"),
                           (("--arms", "base,oa", "--ablate-sites", "te.*"),
                            "te.* matches no site of arm oa"),
                           (("--stress-tau", "1"), "name the families with --ablate-sites")):
        result = _invoke(*common, *extra)
        assert result.exit_code == 2 and message in result.stderr, result.stderr
        assert not out.exists()


def test_cli_runs_a_tau_spec_and_an_ablation(env, tmp_path):
    out = tmp_path / "run"
    result = _invoke("regress", "--datasets", DATASET, "--seeds", "11", "--arms", "base,full-o",
                     "--model-path", "demo", "--tau", "1e-8", "--tau-spec", env["specs"]["full-o"],
                     "--ablate-sites", "icl.*", "--stress-tau", "0.5", "--out", out, "--json",
                     "--no-plots", *CAPS)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert {r["variant"] for r in rows} == {None, "calibrated-d0.001-q0.01", "ablate-icl"}
    bound = json.loads((out / "run.json").read_text())["variants"]
    assert set(bound["full-o/ablate-icl"]["site_tau"].values()) == {0.5}


def test_variants_are_rows_and_the_ablation_is_ranked(env, tmp_path):
    rendered = render([env["out"]], tmp_path / "tables")
    summary = rendered.summary
    for key in ("oa/calibrated-d0.001-q0.01", "full-o/ablate-norm"):
        row = summary.variant_row("sklearn:diabetes", key)
        assert row.n_seeds == 2 and row.d_rmse_pct is not None and row.d_r2 is not None
    markdown = rendered.markdown
    assert "### Per-site τ variants: change against base" in markdown
    assert "### ΔRMSE % against τ (means over seeds; the curve)" in markdown
    ranking = markdown.split("### Full-O: site families ranked by the RMSE they cost")[1]
    costs = [summary.variant_row("mean over cells", f"full-o/ablate-{f}").d_rmse_pct
             for f in ("fde", "norm")]
    first = "fde.*" if costs[0] >= costs[1] else "norm"
    assert f"| 1 | {first} |" in ranking
    assert (tmp_path / "tables" / "delta_rmse_vs_tau.png").stat().st_size > 10_000
    assert "variant" in (tmp_path / "tables" / "cells.csv").read_text().splitlines()[0]


def test_a_missing_variant_cell_flags_its_group(env, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(env["out"], folder)
    next((folder / "cells").glob("*__s23__full-o__*__ablate-norm.json")).unlink()
    summary = render([folder], plots=False).summary
    assert any("diabetes seed 23 lacks full-o [ablate-norm]" in n for n in summary.notes)
    assert all(r.n_seeds == 1 for r in summary.rows if r.dataset == "sklearn:diabetes")


def test_the_committed_demo_host_folder_renders_as_committed(tmp_path):
    """A folder from before variants reads identically (the committed tables are the check)."""
    folder = ROOT / "results" / "regress" / "demo-host"
    render([folder], tmp_path, plots=False)
    for name in ("tables.md", "tables.tex", "cells.csv", "timings.csv", "timings.md"):
        assert (tmp_path / name).read_text() == (folder / "tables" / name).read_text(), name


def test_the_calibrated_reading_restates_the_rows(env):
    from oretrofit.regress.calibrated_reading import TOLERANCE_PCT, calibrated_reading
    from oretrofit.regress.store import read_cells, read_variants
    from oretrofit.regress.summary import summarize
    _, datasets, cells = read_cells([env["out"]])
    summary = summarize(cells, datasets, read_variants([env["out"]]))
    specs = {arm: json.loads(p.read_text()) for arm, p in env["specs"].items()}
    text = calibrated_reading(specs, summary, summary, ["made by the test"])
    for arm, label in (("oa", "OA"), ("full-o", "Full-O")):
        taus = sorted(specs[arm]["site_tau"].values())
        assert f"* {label}: {len(taus)} sites, τ min {taus[0]:.3g}" in text
        value = summary.variant_row(DATASET, f"{arm}/calibrated-d0.001-q0.01").d_rmse_pct
        verdict = "met" if abs(value) <= TOLERANCE_PCT else "NOT met"
        assert f"* {label}: {verdict} — the calibrated spec's largest |ΔRMSE %|" in text
        assert f"{abs(value):.3f}%" in text
    assert "| `icl.out_norm` | — |" in text                     # a Full-O-only site
    assert "**Full-O: site families ranked by the RMSE they cost" in text
    assert "* Every site of Full-O at τ = 1 at once: ΔRMSE %" in text
    assert text.rstrip().endswith("made by the test")
