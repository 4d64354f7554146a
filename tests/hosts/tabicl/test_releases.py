"""The tabicl release gate: releases not tested are refused by name with the fix."""

from __future__ import annotations

import pytest

import oretrofit
from oretrofit import RetrofitError
from oretrofit.hosts.tabicl import releases

FIX = r"pip install 'tabicl>=2\.1\.0,<=2\.2\.0' \(or pip install 'oretrofit\[tabicl\]'\)$"


@pytest.mark.parametrize("release", ["0.1.4", "2.0.3", "9.0.0"])
def test_an_untested_release_is_refused_with_the_fix(release):
    with pytest.raises(RetrofitError, match=rf"^tabicl {release} is not supported by the TabICL "
                                            r"host: it is tested on tabicl 2\.1\.0, 2\.1\.1, "
                                            rf"2\.2\.0 only: {FIX}"):
        releases.check_release(release)


def test_no_tabicl_is_refused_with_the_fix():
    with pytest.raises(RetrofitError, match=rf"tabicl is not installed: {FIX}"):
        releases.check_release(None)


def test_the_installed_release_is_admitted_and_an_other_one_refused_at_retrofit(tiny,
                                                                                monkeypatch):
    assert releases.installed_version() in releases.TESTED_RELEASES
    monkeypatch.setattr(releases, "installed_version", lambda: "2.0.3")
    with pytest.raises(RetrofitError, match="tabicl 2.0.3 is not supported"):
        oretrofit.retrofit(tiny(), "full-o")
