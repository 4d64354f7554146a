"""The paper's small learned-model studies (Tables 3, 8, 9, 10 and the B.5 sweep), rerun on CPU.

Each study module defines ``NAME``, ``TASKS`` (run order), ``plan(options)`` and
``report(runs, plan_ids)``; :func:`run_study` runs or resumes one into a JSON receipt and a
Markdown table laid out like the paper's, with the published values beside.
"""

from __future__ import annotations

from . import adapters, insertion, ostandardize, otransformer, zero_columns
from .common import StudyOptions, StudyResult, run_study

__all__ = ["STUDIES", "StudyOptions", "StudyResult", "run_study"]

STUDIES = {m.NAME: m for m in (adapters, insertion, zero_columns, otransformer, ostandardize)}
