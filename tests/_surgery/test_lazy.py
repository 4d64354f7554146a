"""``lazy_attributes``: a facade's names imported from their homes on first use and kept, its
submodules imported when asked for, an unknown name an AttributeError naming the module."""

from __future__ import annotations

import sys

import pytest

from oretrofit._surgery import lazy
from oretrofit._surgery.lazy import lazy_attributes


def test_a_name_is_imported_on_first_use_and_kept(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    namespace = {"__name__": "oretrofit._surgery"}
    getattr_, _ = lazy_attributes(namespace, {"rgb_to_hsv": ("colorsys", "rgb_to_hsv"),
                                              "helper": (".lazy", "lazy_attributes")})
    assert "colorsys" not in sys.modules
    value = getattr_("rgb_to_hsv")
    assert value is sys.modules["colorsys"].rgb_to_hsv and namespace["rgb_to_hsv"] is value
    # a home relative to the facade's own module
    assert getattr_("helper") is lazy.lazy_attributes is namespace["helper"]


def test_submodules_and_dir() -> None:
    import email.charset

    namespace = {"__name__": "email", "existing": 1}
    getattr_, dir_ = lazy_attributes(namespace, {"b": ("json", "dumps"), "a": ("json", "loads")},
                                     ("charset",))
    assert getattr_("charset") is email.charset and "charset" not in namespace
    assert dir_() == ["__name__", "a", "b", "charset", "existing"]


def test_an_unknown_name_is_an_attribute_error_naming_the_module() -> None:
    getattr_, _ = lazy_attributes({"__name__": "oretrofit.mitra"}, {}, ("tabpfn",))
    with pytest.raises(AttributeError, match="^module 'oretrofit.mitra' has no attribute 'nope'$"):
        getattr_("nope")
