"""What a host needs to describe itself: the vendor class under an O-subclass, and the refusal
of a model holding a module type the host's sites do not account for."""

from __future__ import annotations

import pytest
from torch import nn

from oretrofit import RetrofitError
from oretrofit._surgery.host import check_known_modules, vendor_class

HERE = __name__


class Block(nn.Module):                   # stands for a vendor's class (defined in HERE)
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)


class OBlock(Block):                      # an O-subclass, defined elsewhere
    __module__ = "oretrofit.somewhere"


KNOWN = {HERE: {"Block"}, "torch.nn": {"Linear", "Sequential"}}


def test_the_vendor_class_is_found_under_an_o_subclass_and_torch_counts_as_vendor() -> None:
    assert vendor_class(OBlock(), (HERE,)) is Block
    assert vendor_class(OBlock(), ()) is nn.Module            # torch's, further up the MRO
    assert vendor_class(nn.GELU(), (HERE,)) is nn.GELU
    assert vendor_class(object(), (HERE,)) is object                   # none: its own class


def test_a_model_of_known_types_passes_and_another_type_is_refused_by_path() -> None:
    model = nn.Sequential(OBlock(), Block())
    check_known_modules(model, "Demo", KNOWN, "demo", "pip install demo==1")
    model[1].extra = nn.GELU()
    with pytest.raises(RetrofitError, match=r"^Demo: module 1\.extra of type "
                                            r"torch\.nn\.modules\.activation\.GELU is not one the "
                                            r"host can gate \(an addition of another demo "
                                            r"release\?\); it would be left ungated, so the model "
                                            r"is refused: pip install demo==1$"):
        check_known_modules(model, "Demo", KNOWN, "demo", "pip install demo==1")
    with pytest.raises(RetrofitError, match=r"module \(model\) of type .*Sequential"):
        check_known_modules(model, "Demo", {HERE: {"Block"}}, "demo", "fix")
