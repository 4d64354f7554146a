"""Fixtures of the transformers host's tests."""

from __future__ import annotations

import pytest


@pytest.fixture()
def fresh(monkeypatch, tmp_path):
    """An empty self-check record folder and no record or notice kept in this process."""
    from oretrofit.hosts.transformers import selfcheck
    monkeypatch.setenv("ORETROFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(selfcheck, "_RESULTS", {})
    monkeypatch.setattr(selfcheck, "_NOTIFIED", set())
    return tmp_path
