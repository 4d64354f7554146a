"""The transformers host's public entry point (``oretrofit.transformers``): every name resolves
to its home module's object, and importing it imports neither torch nor transformers. (Not under
tests/transformers/: the tests folder is on sys.path, where that name would hide the package.)"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import oretrofit
import oretrofit.transformers as public

ROOT = Path(__file__).resolve().parents[1]
HOMES = {"zero_padded_inputs": "oretrofit.hosts.transformers.inputs:zero_padded_inputs",
         "check": "oretrofit.hosts.transformers.check:check",
         "failed": "oretrofit.hosts.transformers.check:failed",
         "calibrate": "oretrofit.hosts.transformers.calibrate:calibrate_text",
         "from_pretrained": "oretrofit.hosts.transformers.pretrained:from_pretrained",
         "check_transformers": "oretrofit.hosts.transformers.releases:check_transformers",
         "supported_range": "oretrofit.hosts.transformers.releases:supported_range",
         "supported_text": "oretrofit.hosts.transformers.releases:supported_text",
         "requirement": "oretrofit.hosts.transformers.releases:requirement",
         "TESTED_RELEASES": "oretrofit.hosts.transformers.releases:TESTED_RELEASES",
         "UntestedReleaseWarning":
             "oretrofit.hosts.transformers.selfcheck:UntestedReleaseWarning",
         "SubclassCheckedWarning":
             "oretrofit.hosts.transformers.selfcheck:SubclassCheckedWarning"}


def test_every_public_name_is_its_home_modules_object():
    assert sorted(public.__all__) == sorted(HOMES)
    for name, home in HOMES.items():
        module, _, attribute = home.partition(":")
        assert getattr(public, name) is getattr(importlib.import_module(module), attribute), name
        assert name in dir(public)
    scope: dict = {}
    exec("from oretrofit.transformers import *", scope)
    assert set(scope) - {"__builtins__"} == set(HOMES)
    assert oretrofit.from_pretrained is public.from_pretrained


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="'oretrofit.transformers' has no attribute 'nothing'"):
        public.nothing


def test_importing_it_imports_neither_torch_nor_transformers():
    code = ("import sys, oretrofit.transformers as t; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules), "
            "'supported_text' in dir(t))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.stdout.split() == ["[]", "True"], done.stderr


def test_calibrate_takes_the_built_in_lines_unless_given_some():
    from oretrofit.hosts.transformers.calibrate import builtin_texts
    from oretrofit.hosts.transformers.models import load_model_and_tokenizer
    model, tokenizer = load_model_and_tokenizer("minilm")
    built_in = public.calibrate(model, tokenizer, max_tokens=16)["calibration"]["data"]
    assert (built_in["texts"], built_in["rows"]) == ("built-in", len(builtin_texts()))
    given = public.calibrate(model, tokenizer, ["One line.", " ", "Another."], max_tokens=16)
    assert (given["calibration"]["data"]["texts"], given["calibration"]["data"]["rows"]) == (
        "given", 2)
    named = public.calibrate(model, tokenizer, ["One line."], source="mine.txt", max_tokens=16)
    assert named["calibration"]["data"]["texts"] == "mine.txt"
