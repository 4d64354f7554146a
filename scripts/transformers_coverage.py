#!/usr/bin/env python3
"""Probe, in the running environment, what the transformers host does with every architecture of
``tests/hosts/transformers/zoo.py`` (supported and refused lists), the version gate and the
release table (``COVERED_FROM``) set aside: ``covered`` (sites derived, nothing refused),
``refused`` (the host's structural reason), ``absent`` (this release has no such model type) or
``error`` (the tiny model does not build). Prints one JSON object: ``release`` and ``archs``
(name -> ``[model_type, expected, status, detail]``; *expected* is what the tests expect with the
table: ``covered``, ``refused`` or ``absent`` (covered from a later release), ``never`` for the
zoo's refused list). ``scripts/transformers_compat.py`` runs it in each
release's environment; the first release from which an architecture stays covered fills
``COVERED_FROM`` in ``oretrofit/hosts/transformers/releases.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def probe() -> dict:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers import AutoConfig
    from transformers.utils import logging
    logging.set_verbosity_error()
    spec = importlib.util.spec_from_file_location(
        "transformers_zoo", ROOT / "tests" / "hosts" / "transformers" / "zoo.py")
    zoo = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    from oretrofit._surgery.host import RetrofitError
    from oretrofit._surgery.registry import plan_retrofit
    from oretrofit.hosts.transformers import host, releases
    expected = {arch.name: zoo.expectation(arch) for arch in zoo.ARCHITECTURES}
    expected.update({arch.name: "never" for arch in zoo.REFUSED})
    host.check_transformers = lambda: None          # the raw host, whatever the gate says
    releases.COVERED_FROM.clear()                   # and whatever the table says
    archs = {}
    for arch in zoo.ARCHITECTURES + zoo.REFUSED:
        archs[arch.name] = [arch.model_type, expected[arch.name]]
        try:
            AutoConfig.for_model(arch.model_type)
        except (KeyError, ValueError):
            archs[arch.name] += ["absent", ""]
            continue
        try:
            model = zoo.build(arch)
        except Exception as error:                  # noqa: BLE001 - reported, not raised
            archs[arch.name] += ["error", repr(error)[:300]]
            continue
        try:
            plan_retrofit(model, "full-o")
            archs[arch.name] += ["covered", ""]
        except RetrofitError as error:
            archs[arch.name] += ["refused", str(error)[:300]]
    return {"release": transformers.__version__, "archs": archs}


if __name__ == "__main__":
    print(json.dumps(probe()))
