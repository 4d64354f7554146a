"""The verbs' JSON output (:mod:`oretrofit.cli.output`): strict JSON, non-finite numbers named;
the logger's progress on stderr."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from oretrofit.cli.output import json_text, show_progress


def _strict_loads(text: str) -> object:
    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in {text}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_their_names_and_the_rest_unchanged():
    """A NaN R² (a constant target) or measurement was written as a bare NaN."""
    value = {"r2": math.nan, "rows": [{"d": math.inf}, (-math.inf, np.float64("nan"))],
             "rmse": 0.25, "n": 3, "ok": True, "none": None, "path": Path("a/b")}
    assert _strict_loads(json_text(value)) == {
        "r2": "NaN", "rows": [{"d": "Infinity"}, ["-Infinity", "NaN"]], "rmse": 0.25, "n": 3,
        "ok": True, "none": None, "path": "a/b"}


def test_a_non_finite_key_is_an_error_not_invalid_json():
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        json_text({math.nan: 1})


def test_progress_goes_to_stderr_as_plain_lines_and_results_stay_on_stdout(capsys):
    logger = logging.getLogger("oretrofit")
    handlers, level = logger.handlers[:], logger.level
    logger.handlers.clear()
    try:
        show_progress()
        show_progress()                                  # once: one handler, one line each
        logging.getLogger("oretrofit.demo_host.train").info("step 10")
        logging.getLogger("oretrofit.demo_host.train").debug("not shown")
        logging.getLogger("elsewhere").warning("not ours")
        out, err = capsys.readouterr()
        assert out == "" and err.splitlines()[0] == "step 10" and "not shown" not in err
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
