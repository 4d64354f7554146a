"""Old module paths still load: a pickle written before a move names them.

``pickled-before-the-rooms.pkl`` was written at 7eeb47e, before the core moved into its four
packages, by pickling (protocol 2) a dict of: ``x`` (2, 4, 8); ``encoder``, a one-layer
``nn.TransformerEncoder`` (d=8, 2 heads, FFN 16, seed 0) retrofitted ``full-o`` at τ=1, with
``base`` and ``patched`` its outputs on ``x`` before and after; ``block``, an
``OTransformerBlock(8, 2, 16)``, and ``ffn``, an ``OFFN`` around Linear-GELU-Linear, with their
outputs ``block_out`` and ``ffn_out``. It names oretrofit._patching, _registry, _components,
_attention_modules and _transformer.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path

import torch

import oretrofit
from oretrofit import OFFN, OTransformerBlock, Retrofit
from oretrofit._surgery import moved
from oretrofit._surgery.moved import MOVED, moved_attribute

FIXTURE = Path(__file__).with_name("pickled-before-the-rooms.pkl")
PACKAGE = Path(oretrofit.__file__).parent


def test_a_pickle_written_before_the_core_moved_loads_and_runs():
    data = FIXTURE.read_bytes()
    assert b"oretrofit._patching" in data and b"oretrofit._components" in data
    old = pickle.loads(data)
    with torch.no_grad():
        assert torch.equal(old["encoder"](old["x"]), old["patched"])
        assert torch.equal(old["block"](old["x"]), old["block_out"])
        assert torch.equal(old["ffn"](old["x"]), old["ffn_out"])
    assert isinstance(old["block"], OTransformerBlock) and isinstance(old["ffn"], OFFN)
    assert type(old["encoder"].layers[0]).__module__ == "oretrofit._surgery.patching"
    Retrofit.of(old["encoder"]).revert()
    # ``base`` was computed with autograd on (torch's fused encoder path runs under no_grad only)
    assert torch.equal(old["encoder"](old["x"]), old["base"])
    # written again, it names the new homes only
    assert b"oretrofit._patching" not in pickle.dumps(old)


def _file_of(module: str) -> Path:
    parts = module.split(".")[1:]
    return PACKAGE.joinpath(*parts)


def test_every_old_path_is_gone_and_reads_from_its_new_home():
    for old, new in MOVED.items():
        module, _, name = old.partition(":")
        assert importlib.util.find_spec(new) is not None, new
        if name:                                        # a name that left a module that stays
            assert getattr(importlib.import_module(module), name) is \
                getattr(importlib.import_module(new), name)
            continue
        assert not _file_of(module).with_suffix(".py").exists(), module
        assert not _file_of(module).is_dir(), module
        alias, home = importlib.import_module(module), importlib.import_module(new)
        assert isinstance(alias.__spec__.loader, moved._AliasFinder), module
        public = [n for n in vars(home) if not n.startswith("__")]
        assert public and all(getattr(alias, n) is getattr(home, n) for n in public), old


def test_an_old_package_loads_empty_and_a_name_that_never_moved_is_refused():
    assert importlib.import_module("oretrofit.patches").__path__ == []
    try:
        moved_attribute("oretrofit.hosts.transformers.releases", "NotAName")
    except AttributeError as error:
        assert "NotAName" in str(error)
    else:
        raise AssertionError("a name that never moved was found")
    assert sum(isinstance(f, moved._AliasFinder) for f in sys.meta_path) == 1
    moved.install()
    assert sum(isinstance(f, moved._AliasFinder) for f in sys.meta_path) == 1
