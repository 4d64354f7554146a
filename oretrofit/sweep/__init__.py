"""Runners that measure the operators' contracts and write receipts (``oretrofit sweep …``);
``hosts`` (imported on its own) measures the transformers hosts on real pretrained weights."""

from .markdown import operators_markdown
from .operators import SCHEMA_VERSION, SweepConfig, run_operator_sweep

__all__ = ["SweepConfig", "run_operator_sweep", "operators_markdown", "SCHEMA_VERSION"]
