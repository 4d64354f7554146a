"""The tabdpt releases the host admits: exactly the tested ones, the rest refused by name."""

from __future__ import annotations

import pytest

from oretrofit import RetrofitError
from oretrofit.hosts.tabdpt import releases


def test_this_environment_has_the_tested_release():
    assert releases.installed_version() == "1.3.1" == releases.TESTED_RELEASES[-1]
    releases.check_release("1.3.1")


@pytest.mark.parametrize("version", ["1.3.0", "1.1.14", "0.1.0", "2.0.0"])
def test_other_releases_are_refused_with_the_fix(version):
    with pytest.raises(RetrofitError, match=rf"tabdpt {version} is not supported by the TabDPT "
                                            r"host: it is tested on tabdpt 1\.3\.1 only: "
                                            r"pip install 'tabdpt==1\.3\.1'"):
        releases.check_release(version)


def test_no_tabdpt_is_refused_with_the_fix():
    with pytest.raises(RetrofitError, match=r"tabdpt is not installed: pip install "
                                            r"'tabdpt==1\.3\.1'"):
        releases.check_release(None)
