"""Options with a fixed set of values (:mod:`oretrofit.cli.choices`): a value outside the set is
a usage error naming the option, the value and the choices, before any work starts."""

from __future__ import annotations

import sys

import pytest

from oretrofit.cli.app import main


@pytest.mark.parametrize("args, message", [
    (["demo-host", "eval", "--inference", "bogus"], "Invalid value for '--inference': unknown "
                                                    "inference preset 'bogus'; choose from v2.5,"),
    (["demo-host", "export", "--run", "RUN", "--inference", "v2.5-x0"], "Invalid value for "
                                                                         "'--inference'"),
    (["regress", "--datasets", "sklearn:diabetes", "--inference-precision", "int8"],
     "Invalid value for '--inference-precision': 'int8' is not one of float32, float16, "
     "bfloat16, auto, autocast"),
    (["regress", "--datasets", "sklearn:diabetes", "--backend", "threads"],
     "Invalid value for '--backend': 'threads' is not one of joblib, dask"),
    (["check", "minilm", "--arm", "base"], "Invalid value for '--arm': 'base' is not one of oa, "
                                           "full-o"),
    (["calibrate", "--dataset", "sklearn:diabetes", "--arm", "full"], "'full' is not one of oa, "
                                                                      "full-o"),
    (["patch", "--arm", "all"], "'all' is not one of base, oa, full-o"),
    (["sweep", "operators", "--device", "gpu"], "'gpu' is not one of cpu, cuda"),
    (["experiment", "adapter"], "Invalid value for 'name': 'adapter' is not one of adapters, "
                                "insertion, zero_columns, otransformer, ostandardize")])
def test_a_value_outside_an_options_set_is_refused_naming_the_choices(
        capsys, monkeypatch, tmp_path, args, message):
    """``demo-host eval --inference bogus`` ran the baselines and wrote a receipt; int8 passed
    --inference-precision's check (a torch dtype)."""
    monkeypatch.chdir(tmp_path)
    out = [] if args[0] in ("check", "patch") else ["--out", "out.json"]
    monkeypatch.setattr(sys, "argv", ["oretrofit", *args, *out])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert exit_.value.code == 2 and message in err, err
    assert list(tmp_path.iterdir()) == []                # nothing written
