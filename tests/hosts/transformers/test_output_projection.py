"""Which projection the host gates as an attention module's output projection
(:func:`oretrofit.hosts.transformers.layouts.output_projection`): by name, else the one
projection the forward calls after the attention interface, else none (its bias reported
uncovered)."""

from __future__ import annotations

from torch import nn

from oretrofit.hosts.transformers.layouts import output_projection

ALL_ATTENTION_FUNCTIONS: dict = {}       # the marker the sources below are read for


class _Projected(nn.Module):
    """Its output goes through ``projection_layer``; ``gate`` runs before the attention."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.gate = nn.Linear(4, 12), nn.Linear(4, 4)
        self.projection_layer = nn.Linear(4, 4)

    def forward(self, hidden_states):
        q, k, v = self.qkv(self.gate(hidden_states)).chunk(3, dim=-1)
        attention_interface = ALL_ATTENTION_FUNCTIONS["eager"]
        out, _ = attention_interface(self, q, k, v, None)
        return self.projection_layer(out)


class _TwoAfter(_Projected):
    """Two projections called after the attention: the source does not say which one the
    output goes through."""

    def forward(self, hidden_states):
        q, k, v = self.qkv(hidden_states).chunk(3, dim=-1)
        attention_interface = ALL_ATTENTION_FUNCTIONS["eager"]
        out, _ = attention_interface(self, q, k, v, None)
        return self.projection_layer(out) + self.gate(hidden_states)


class _Routed(_Projected):
    """The output goes through a non-projection module (JetMoE's mixture ``experts.reduce``)."""

    def forward(self, hidden_states):
        q, k, v = self.qkv(hidden_states).chunk(3, dim=-1)
        attention_interface = ALL_ATTENTION_FUNCTIONS["eager"]
        out, _ = attention_interface(self, q, k, v, None)
        return self.experts.reduce(out)


def test_the_projection_called_after_the_attention_is_the_output_projection() -> None:
    attention = _Projected()
    assert output_projection(attention, None) is attention.projection_layer


def test_a_named_projection_wins() -> None:
    attention = _Projected()
    attention.o_proj = nn.Linear(4, 4)
    assert output_projection(attention, None) is attention.o_proj


def test_two_projections_after_the_attention_find_none() -> None:
    assert output_projection(_TwoAfter(), None) is None


def test_a_module_the_output_goes_through_that_is_no_projection_finds_none() -> None:
    assert output_projection(_Routed(), None) is None
