"""The autogluon.tabular releases the Mitra host admits: exactly the tested ones, the rest
refused by name."""

from __future__ import annotations

import pytest

from oretrofit import RetrofitError
from oretrofit.hosts.mitra import releases


def test_this_environment_has_the_tested_release():
    assert releases.installed_version() == "1.6.3" == releases.TESTED_RELEASES[-1]
    releases.check_release("1.6.3")


@pytest.mark.parametrize("version", ["1.6.2", "1.4.0", "1.7.0"])
def test_other_releases_are_refused_with_the_fix(version):
    with pytest.raises(RetrofitError, match=rf"autogluon.tabular {version} is not supported by "
                                            r"the Mitra host: it is tested on autogluon.tabular "
                                            r"1\.6\.3 only: pip install "
                                            r"'autogluon.tabular\[mitra\]==1\.6\.3'"):
        releases.check_release(version)


def test_no_autogluon_is_refused_with_the_fix():
    with pytest.raises(RetrofitError, match=r"the Mitra host needs autogluon.tabular 1\.6\.3, and "
                                            r"autogluon.tabular is not installed: pip install "
                                            r"'autogluon.tabular\[mitra\]==1\.6\.3'"):
        releases.check_release(None)
