"""Resumable receipts: finished runs are skipped, an interrupted plan resumes, configs must match."""

import json
import os

import pytest

from oretrofit.studies.receipts import PlannedRun, Receipt, run_plan


def _plan(calls, fail_at=None):
    def work(i):
        calls.append(i)
        if i == fail_at:
            raise KeyboardInterrupt
        return {"value": i * i}
    return [PlannedRun(f"run{i}", {"i": i}, lambda i=i: work(i)) for i in range(3)]


def test_interrupted_plan_resumes_without_redoing_runs(tmp_path):
    path, calls = tmp_path / "s.json", []
    with pytest.raises(KeyboardInterrupt):
        run_plan(Receipt(path, "s", {}), _plan(calls, fail_at=1), quiet=True)
    stored = json.loads(path.read_text())
    assert list(stored["runs"]) == ["run0"] and stored["complete"] is False
    calls.clear()
    run_plan(Receipt(path, "s", {}), _plan(calls), quiet=True)
    assert calls == [1, 2]
    stored = json.loads(path.read_text())
    assert stored["complete"] is True and stored["runs"]["run2"]["outcome"] == {"value": 4}
    assert [s["runs_added"] for s in stored["sessions"]] == [1, 2]
    assert "packages" in stored["environment"]
    calls.clear()
    run_plan(Receipt(path, "s", {}), _plan(calls), quiet=True)
    assert calls == []


def test_changed_configuration_is_an_error_not_a_mix(tmp_path):
    path = tmp_path / "s.json"
    run_plan(Receipt(path, "s", {}), _plan([]), quiet=True)
    changed = [PlannedRun("run0", {"i": 99}, lambda: {})]
    with pytest.raises(ValueError, match="another configuration"):
        run_plan(Receipt(path, "s", {}), changed, quiet=True)
    with pytest.raises(ValueError, match="another --out"):
        Receipt(path, "other", {})


def test_absorb_checks_study_and_configuration(tmp_path):
    run_plan(Receipt(tmp_path / "a.json", "s", {}), _plan([]), quiet=True)
    run_plan(Receipt(tmp_path / "b.json", "t", {}), _plan([]), quiet=True)
    changed = Receipt(tmp_path / "c.json", "s", {})
    run_plan(changed, [PlannedRun("run0", {"i": 99}, lambda: {})], quiet=True)
    receipt = Receipt(tmp_path / "a.json", "s", {}, new_session=False)
    with pytest.raises(ValueError, match="not 's'"):
        receipt.absorb(tmp_path / "b.json")
    with pytest.raises(ValueError, match="differs in configuration"):
        receipt.absorb(tmp_path / "c.json")


@pytest.mark.parametrize("make, message", [
    (lambda path: os.mkfifo(path), "is a named pipe (FIFO), not a regular file"),
    (lambda path: path.write_text('{"runs": {}, "runs": {}}'), "gives the key 'runs' twice"),
    (lambda path: path.write_text("[1]"), "is not a receipt oretrofit wrote (a JSON object with "
                                          "runs and sessions)")])
def test_a_receipt_that_is_not_one_is_refused_by_name(tmp_path, make, message):
    """A FIFO as a receipt hung, a key given twice was kept silently, a list was an
    AttributeError: receipts are read by the bounded, strict reader."""
    path = tmp_path / "s.json"
    make(path)
    with pytest.raises(ValueError, match=f"the study receipt {path} .*another --out") as refused:
        Receipt(path, "s", {})
    assert message in str(refused.value)
    with pytest.raises(ValueError, match="merge only receipts this study wrote") as refused:
        Receipt(tmp_path / "a.json", "s", {}).absorb(path)
    assert message in str(refused.value)
