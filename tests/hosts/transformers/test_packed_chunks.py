"""A vision tower that packs its images into one sequence and calls the attention function once
per image (``cu_seqlens`` splits: HunYuan-VL's and HY-V4-VL's towers) is refused at the call,
naming the chunking: no call says which tokens it holds, so no presences can be placed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oretrofit import RetrofitError
from oretrofit._surgery.patching import SiteConfig
from oretrofit.hosts.transformers.interface_route import _STATE, o_attention_function
from oretrofit.hosts.transformers.capture import CarrierPresence


class _ChunkedAttention(nn.Module):
    """Attends each image of its packed sequence by itself (the source is what the host reads)."""

    def forward(self, hidden_states, cu_seqlens):
        return hidden_states.split((cu_seqlens[1:] - cu_seqlens[:-1]).tolist(), dim=1)


class _Alone(nn.Module):
    def forward(self, hidden_states):
        return hidden_states


def _call_on_a_chunk(module: nn.Module) -> None:
    state = CarrierPresence(SiteConfig(1e-6))
    state.capture(torch.randn(1, 8, 4))                    # the packed sequence: 2 images of 4
    module.__dict__[_STATE] = state
    q = torch.randn(1, 2, 4, 4)                            # one image's queries
    o_attention_function(module, q, q, q, None)


def test_a_call_on_one_chunk_of_a_packed_sequence_is_refused_naming_it() -> None:
    with pytest.raises(RetrofitError, match=r"one chunk per call \(cu_seqlens splits the 8 "
                                            r"tokens .* this call holds 4 queries\)"):
        _call_on_a_chunk(_ChunkedAttention())


def test_a_short_call_without_chunks_is_refused_as_called_alone() -> None:
    with pytest.raises(RetrofitError, match="called without its carrier presences"):
        _call_on_a_chunk(_Alone())
