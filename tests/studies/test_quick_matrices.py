"""The CI-size matrices (one data set, one seed, 2 epochs) through the runners' own code path."""

import json

import pytest
import typer
from typer.testing import CliRunner

from oretrofit.cli import experiment
from oretrofit.studies import STUDIES, StudyOptions, run_study

QUICK = StudyOptions(epochs=2, quick=True)


def _runs(tmp_path, name):
    result = run_study(STUDIES[name], QUICK, tmp_path, quiet=True)
    assert result.complete and result.table_path.read_text().startswith(result.markdown[:20])
    return json.loads(result.receipt_path.read_text())["runs"]


def test_otransformer_o_arms_exact_zero_and_oa_only_fails(tmp_path):
    runs = _runs(tmp_path, "otransformer")
    assert len(runs) == 12 and all(r["config"]["train"]["epochs"] == 2 for r in runs.values())
    for k in (1, 4):
        null = {arm: runs[f"iris/seed11/k{k}/{arm}"]["outcome"]["null"] for arm in
                ("standard", "oa_only", "otransformer", "structural_control")}
        for arm in ("otransformer", "structural_control"):
            assert null[arm]["max_inserted_state_linf"] == 0.0
            assert null[arm]["inserted_exact_zero_fraction"] == 1.0
            assert null[arm]["inserted_presence_quantiles"]["q1"] == 0.0
            assert null[arm]["prediction_rms_shift"] < 1e-5
        for arm in ("standard", "oa_only"):                     # the paper's negative result
            assert null[arm]["layers"][-1]["inserted_state_linf"] > 0.1
            assert null[arm]["prediction_rms_shift"] > 1e-3
        assert all(n["finite"] for n in null.values())
    init = {runs[f"iris/seed11/k1/{a}"]["outcome"]["initial_state_sha256"]
            for a in ("standard", "oa_only", "otransformer")}
    assert len(init) == 1


def test_insertion_and_zero_columns_keep_oattention_tokens_exact(tmp_path):
    runs = _runs(tmp_path, "insertion")
    for k in ("1", "4"):
        oa = runs["iris/seed11/oattention"]["outcome"]["insertion"][k]
        soft = runs["iris/seed11/softmax"]["outcome"]["insertion"][k]
        assert oa["inserted_state_linf"] == 0.0 and soft["inserted_state_linf"] > 0.1
        assert oa["prediction_rms_shift"] < 1e-5 < 1e-3 < soft["prediction_rms_shift"]
    runs = _runs(tmp_path, "zero_columns")
    for k in (1, 2, 4):
        assert runs[f"iris/seed11/k{k}/oattention"]["outcome"]["zero_column_state_linf"] == 0.0
        assert runs[f"iris/seed11/k{k}/softmax"]["outcome"]["zero_column_state_linf"] > 0.1
        assert (runs[f"iris/seed11/k{k}/oattention"]["outcome"]["initial_state_sha256"]
                == runs[f"iris/seed11/k{k}/softmax"]["outcome"]["initial_state_sha256"])
        # Inert zero columns and a k = 0-matched start: the OA arm learns the k = 0 model.
        assert (runs[f"iris/seed11/k{k}/oattention"]["outcome"]["test"]["cross_entropy"]
                == pytest.approx(runs["iris/seed11/k0/oattention"]["outcome"]["test"]
                                 ["cross_entropy"], abs=1e-4))


def test_adapters_and_ostandardize_reports(tmp_path):
    runs = _runs(tmp_path, "adapters")
    assert set(runs) == {"iris/seed11/softmax", "iris/seed11/oattention"}
    assert "| Iris | accuracy |" in (tmp_path / "adapters-quick.md").read_text()
    sweep = _runs(tmp_path, "ostandardize")["float32/2x5x4/seed11"]["outcome"]
    assert sweep["inserted_output"] == 0.0 and sweep["all_null"] == 0.0 and sweep["zero_length"] == 0.0
    assert sweep["singleton_centred"] == 0.0 and sweep["singleton_next_offn"] == 0.0
    assert sweep["old_output"] < 1e-5 and sweep["gradients_finite"]


@pytest.fixture()
def cli():
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app."""

    experiment.register(app)
    return app


def test_cli_json_and_resume(tmp_path, cli):
    args = ["experiment", "ostandardize", "--quick", "--out", str(tmp_path), "--json"]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    obj = json.loads(first.stdout)
    assert obj["schema_version"] == 1 and obj["complete"] and obj["runs_done"] == 1
    again = CliRunner().invoke(cli, args)
    sessions = json.loads((tmp_path / "ostandardize-quick.json").read_text())["sessions"]
    assert again.exit_code == 0 and [s["runs_added"] for s in sessions] == [1, 0]
    report = CliRunner().invoke(cli, [*args, "--report-only"])
    stored = json.loads((tmp_path / "ostandardize-quick.json").read_text())
    assert report.exit_code == 0 and len(stored["sessions"]) == 2
    assert stored["coverage"] == {"float32": [1, 1]} and "Coverage: 1 of 1 runs" in report.stdout


def test_report_only_needs_a_receipt(tmp_path, cli):
    missing = CliRunner().invoke(cli, ["experiment", "adapters", "--report-only", "--out",
                                       str(tmp_path)])
    assert missing.exit_code == 2 and "run the study first" in missing.output


def test_cli_names_bad_input(tmp_path, cli):
    bad = CliRunner().invoke(cli, ["experiment", "insertion", "--datasets", "friedman1",
                                   "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "choose from" in bad.output
    bad = CliRunner().invoke(cli, ["experiment", "nope", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "'nope' is not one of adapters" in bad.output


def test_merging_a_parallel_workers_receipt(tmp_path, cli):
    for seed in ("11", "23"):
        ran = CliRunner().invoke(cli, ["experiment", "ostandardize", "--quick", "--seeds", seed,
                                       "--out", str(tmp_path / seed)])
        assert ran.exit_code == 0, ran.output
    worker = tmp_path / "23" / "ostandardize-quick.json"
    merged = CliRunner().invoke(cli, ["experiment", "ostandardize", "--quick", "--report-only",
                                      "--out", str(tmp_path / "11"), "--merge-from", str(worker)])
    stored = json.loads((tmp_path / "11" / "ostandardize-quick.json").read_text())
    assert merged.exit_code == 0 and set(stored["runs"]) == {"float32/2x5x4/seed11",
                                                               "float32/2x5x4/seed23"}
    assert stored["merged"][0]["runs_added"] == 1
