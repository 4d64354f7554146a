"""The autogluon.tabular releases the Mitra host admits: exactly the tested ones, the rest
refused by name."""

from __future__ import annotations

import pytest

from oretrofit import RetrofitError
from oretrofit.hosts.mitra import releases


_TESTED = r"1\.6\.0, 1\.6\.1, 1\.6\.2, 1\.6\.3"
_FIX = r"pip install 'autogluon.tabular\[mitra\]==1\.6\.3'"


def test_this_environment_has_a_tested_release():
    assert releases.TESTED_RELEASES == ("1.6.0", "1.6.1", "1.6.2", "1.6.3")
    assert releases.installed_version() in releases.TESTED_RELEASES
    for version in releases.TESTED_RELEASES:
        releases.check_release(version)


@pytest.mark.parametrize("version", ["1.5.0", "1.4.0", "1.6.4", "1.7.0"])
def test_other_releases_are_refused_with_the_fix(version):
    with pytest.raises(RetrofitError, match=rf"autogluon.tabular {version} is not supported by "
                                            r"the Mitra host: it is tested on autogluon.tabular "
                                            rf"{_TESTED} only: {_FIX}"):
        releases.check_release(version)


def test_no_autogluon_is_refused_with_the_fix():
    with pytest.raises(RetrofitError, match=rf"the Mitra host needs autogluon.tabular {_TESTED}, "
                                            rf"and autogluon.tabular is not installed: {_FIX}"):
        releases.check_release(None)


def test_the_gate_is_the_compat_receipts_passing_rows():
    """results/autogluon-compat.md (scripts/autogluon_compat.py): the gate admits exactly its
    passing rows, and every other release in it is refused by name."""
    from pathlib import Path
    receipt = Path(__file__).resolve().parents[3] / "results" / "autogluon-compat.md"
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in receipt.read_text().splitlines() if line.startswith("| 1.")]
    assert {row[0] for row in rows if row[1] == "pass"} == set(releases.TESTED_RELEASES)
    assert all(row[1] == "refused" for row in rows if row[0] not in releases.TESTED_RELEASES)
