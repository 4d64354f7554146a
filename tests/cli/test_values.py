"""Numbers and lists a user can get wrong in `demo-host` and `experiment`: each is refused naming
the option and what it takes, before any work starts (they were StopIteration, a TypeError from
a format string, "need at least one array to stack", "expected non-negative integer")."""

from __future__ import annotations

import sys

import pytest

from oretrofit.cli.app import main


@pytest.mark.parametrize("args, message", [
    (["demo-host", "eval", "--seeds", "0", "--out", "r.json"],
     "Invalid value for '--seeds': Input should be greater than or equal to 1"),
    (["demo-host", "eval", "--datasets", ",", "--out", "r.json"],
     "error: no dataset to evaluate: give --datasets a suite (evaluation, validation) or "
     "comma-separated dataset specs"),
    (["demo-host", "eval", "--datasets", "sklearn:diabetes", "--inference", "v2", "--out",
      "r.json"], "error: inference preset 'v2' is for the hosts, and none is given"),
    (["demo-host", "train", "--budget", "0s", "--out", "run"],
     "Invalid value for --budget: budget '0s' is no time at all; give a positive duration"),
    (["demo-host", "train", "--max-steps", "-1", "--out", "run"],
     "Invalid value for '--max-steps': Input should be greater than or equal to 1"),
    (["demo-host", "train", "--batch-size", "0", "--out", "run"],
     "Invalid value for '--batch-size': Input should be greater than or equal to 1"),
    (["demo-host", "train", "--lr", "-1", "--out", "run"],
     "Invalid value for '--lr': Input should be greater than or equal to 0"),
    (["demo-host", "train", "--seed", "-1", "--out", "run"],
     "Invalid value for '--seed': Input should be greater than or equal to 0"),
    (["experiment", "adapters", "--seeds", "11,x", "--out", "studies"],
     "Invalid value for --seeds: seeds are integers, comma-separated or repeated (e.g. 11,23), "
     "got '11,x'")])
def test_a_value_out_of_range_is_named_before_any_work(capsys, monkeypatch, tmp_path, args,
                                                       message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["oretrofit", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = " ".join(capsys.readouterr().err.split())
    assert exit_.value.code == 2 and message in err, err
    assert list(tmp_path.iterdir()) == []                # nothing written
