"""The cases the transformers census (scripts/transformers_census.py) found wrong or crashing,
each on a tiny config at its mechanism: PaliGemma's bidirectional Gemma under SDPA (silently
wrong before), Dory's layers attending to their cache twice per forward, Idefics3's /
SmolVLM's SigLIP-style vision embeddings (no word lookup), GIT's embeddings adding into the
``inputs_embeds`` they are given, HRM's learned initial state added to every token,
VideoLLaMA3's vision tower running packed sequences without a batch axis, and YOLOS's position
tables added between layers (silently wrong before)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from oretrofit import RetrofitError, retrofit, retrofitted  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from oretrofit.hosts.transformers.contracts import agreement, null_insertion  # noqa: E402

_TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, intermediate_size=64, vocab_size=99)
_VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
               image_size=8, patch_size=4)
PALIGEMMA = zoo.Architecture("PaliGemma", "paligemma", "decoder-only",
                             dict(text_config=dict(_TEXT, model_type="gemma"),
                                  vision_config=dict(_VISION, vision_use_head=False),
                                  projection_dim=32, image_token_id=98))
BIDIRECTIONAL_GEMMA = zoo.Architecture("Gemma (use_bidirectional_attention)", "gemma",
                                       "decoder-only", dict(_TEXT, use_bidirectional_attention=True))


def _agrees(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    for arm in ("oa", "full-o"):
        result = agreement(model, inputs, arm, tau=1e-12, eps=1e-12)
        assert result["relative_max_diff"] <= 1e-4, (arm, result)
        assert result["revert_bit_identical"] and result["state_dict_keys_unchanged"]


def _null_insertion_holds(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    with retrofitted(model, "full-o", 1e-6):
        result = null_insertion(model, inputs)
    assert result["inserted_max_abs"] == 0 and result["old_max_delta"] <= 1e-4


@pytest.mark.parametrize("arch", [PALIGEMMA, BIDIRECTIONAL_GEMMA], ids=lambda a: a.name)
def test_sdpa_without_a_mask_attends_as_the_module_says(arch: zoo.Architecture) -> None:
    """Gemma with ``use_bidirectional_attention`` (PaliGemma's default) builds a causal mask that
    SDPA skips, then attends bidirectionally (the module's ``is_causal`` is False): the retrofit
    does the same (it was causal, 0.25 off); with padding the mask is built and both are causal."""
    model = zoo.build(arch)
    attention = model.get_decoder().layers[0].self_attn if arch is PALIGEMMA else \
        model.layers[0].self_attn
    assert model.config._attn_implementation == "sdpa" and attention.is_causal is False
    inputs = zoo.example_inputs(model)
    padded = dict(inputs, attention_mask=torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]]))
    _agrees(model, inputs)
    _agrees(model, dict(padded, input_ids=padded["input_ids"].masked_fill(
        padded["attention_mask"] == 0, 0)) if arch is PALIGEMMA else padded)
    _null_insertion_holds(model, inputs)


def test_paligemma_image_and_prefix_attend_bidirectionally() -> None:
    """An image (4 patches of 4 px) in front of a 3-token prefix and a 2-token suffix
    (``token_type_ids``): the prefix-LM mask the model builds reaches the O attention."""
    model = zoo.build(PALIGEMMA)
    ids = torch.tensor([[98] * 4 + [5, 6, 7, 8, 9]] * 2)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "token_type_ids": torch.tensor([[0] * 7 + [1, 1]] * 2),
              "pixel_values": torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))}
    _agrees(model, inputs)


_DORY = dict(_TEXT, num_hidden_layers=4, n_input_layers=1, n_recurrent_layers=2,
             n_output_layers=1, sliding_window=4)


def test_dory_layers_run_twice_on_one_cache_are_refused_by_name() -> None:
    """More input and output layers than layers (the census' tiny config): each layer runs
    twice per forward and attends to the keys it cached the first time, which the mask built
    once per forward does not describe (eager fails; SDPA drops the newest keys)."""
    model = zoo.build(zoo.Architecture("Dory", "dory", "decoder-only",
                                       dict(_DORY, num_hidden_layers=2, n_input_layers=8,
                                            n_output_layers=8, n_recurrent_layers=-14,
                                            sliding_window=1024)))
    inputs = zoo.example_inputs(model)
    with retrofitted(model, "oa", 1e-12, eps=1e-12):
        with pytest.raises(RetrofitError, match=r"DoryAttention attends 7 queries to 14 keys "
                                                 r"with no mask.*use_cache=False"):
            model(**dict(inputs, use_cache=True))    # the example inputs turn the cache off
        without_cache = model(**inputs)
    assert torch.isfinite(without_cache.last_hidden_state).all()


def test_dory_recurrent_loops_with_a_cache_are_refused_by_name() -> None:
    """Recurrent loops write each loop's keys to cache slots other than the layer's own, which
    the presences cannot follow: refused, naming use_cache=False."""
    model = zoo.build(zoo.Architecture("Dory", "dory", "decoder-only", _DORY))
    with retrofitted(model, "oa", 1e-12, eps=1e-12):
        with pytest.raises(RetrofitError, match="DoryAttention.*use_cache=False"):
            model(**dict(zoo.example_inputs(model), use_cache=True))


@pytest.mark.parametrize("model_type", ["idefics3_vision", "smolvlm_vision"])
def test_siglip_style_vision_embeddings_gate_their_position_table(model_type: str) -> None:
    """``get_input_embeddings()`` returns the whole vision embeddings module (a patch
    convolution and a position table indexed by patch position ids), not a word lookup: the
    position table is gated by the patch embedding's presence, and every contract holds."""
    model = zoo.build(zoo.Architecture(model_type, model_type, "vision", _VISION))
    inputs = zoo.example_inputs(model)
    _agrees(model, inputs)
    embeddings = model.embeddings
    patches = torch.ones(2, 2, 2, dtype=torch.bool)                # every patch of the 8 px image

    def null_first_patch(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(out.shape[-2:], dtype=out.dtype)
        keep[0, 0] = 0                                            # patch (0, 0) of every image
        return out * keep

    handle = embeddings.patch_embedding.register_forward_hook(null_first_patch)
    try:
        with torch.no_grad():
            unpatched = embeddings(inputs["pixel_values"], patches)
            with retrofitted(model, "full-o", 1e-6) as r:
                assert "embeddings.position_embedding" in r.spec()["sites"]
                gated = embeddings(inputs["pixel_values"], patches)
    finally:
        handle.remove()
    assert unpatched[:, 0].abs().max() > 1e-2                # the table's row, ungated
    assert gated[:, 0].abs().max() == 0                      # a null patch stays null
    assert torch.allclose(gated[:, 1:], unpatched[:, 1:], atol=1e-5)


GIT = zoo.Architecture("GIT", "git", "decoder-only", dict(vision_config=_VISION))


def test_git_adding_positions_into_its_inputs_embeds_keeps_null_insertion() -> None:
    """GIT's embeddings add the position table into the ``inputs_embeds`` they are given, in
    place: the null insertion contract measured its inserted run from that moved carrier (old
    tokens 0.4 off, a silent wrong in the census); measured from a copy, the contract holds."""
    model = zoo.build(GIT)
    inputs = zoo.example_inputs(model)
    embeds = model.get_input_embeddings()(inputs["input_ids"])
    given = embeds.clone()
    with torch.no_grad():
        model(inputs_embeds=given, use_cache=False)
    assert (given - embeds).abs().max() > 1e-2               # the model wrote into its input
    _agrees(model, inputs)
    _null_insertion_holds(model, inputs)


HRM = zoo.Architecture("HRM-Text", "hrm_text", "decoder-only",
                       dict(_TEXT, H_cycles=2, L_cycles=2, L_bp_cycles=[1]))


def test_hrm_with_a_non_zero_initial_state_is_refused_at_retrofit() -> None:
    """HRM's low cycle starts every token from ``z_L_init`` (added inside the forward, no site
    can gate it): non-zero, a null token's states are not zero (4.0 in the census): refused
    when retrofitted, naming the parameter and the fix."""
    model = zoo.build(HRM)
    assert model.z_L_init.abs().max() > 1e-2                  # jittered, as the census builds
    with pytest.raises(RetrofitError, match=r"z_L_init \(HrmTextModel\) is non-zero.*zero it"):
        with retrofitted(model, "full-o", 1e-6):
            pass


def test_hrm_with_a_zero_initial_state_holds_and_its_cycles_refuse_the_cache() -> None:
    """``z_L_init`` zero (as HRM initialises it and never trains it): every contract holds
    without a cache; with one, each H/L cycle writes slot layer_idx + cycle_offset, which the
    presences cannot follow: refused on the first call, saying so."""
    model = zoo.build(HRM)
    with torch.no_grad():
        model.z_L_init.zero_()
    inputs = zoo.example_inputs(model)
    assert inputs["use_cache"] is False
    _agrees(model, inputs)
    _null_insertion_holds(model, inputs)
    with retrofitted(model, "oa", 1e-12, eps=1e-12):
        with pytest.raises(RetrofitError, match=r"HrmTextAttention attends to 7 keys where its KV "
                                                 r"cache at layer_idx 0 holds no presences for "
                                                 r"its keys.*"
                                                 r"cycle_offset.*use_cache=False"):
            model(**dict(inputs, use_cache=True))


def test_a_packed_residual_stream_without_a_batch_axis_is_refused_by_name() -> None:
    """VideoLLaMA3's vision tower runs its patches packed as (tokens, hidden) with cu_seqlens:
    the presences have no batch axis to sit on, so the first call is refused (it crashed with
    an IndexError before)."""
    from transformers import AutoConfig, AutoModel
    from oretrofit.hosts.transformers.inputs import example_inputs
    config = AutoConfig.for_model("video_llama_3_vision", **dict(_VISION, image_size=16))
    torch.manual_seed(0)
    model = AutoModel.from_config(config).eval()
    inputs = example_inputs(model)
    grid = next(v for k, v in inputs.items() if k.endswith("grid_thw"))
    assert inputs["pixel_values"].shape[0] == grid.prod(-1).sum()   # packed patches, no batch
    with retrofitted(model, "oa", 1e-12), pytest.raises(
            RetrofitError, match=r"VideoLlama3VisionAttention runs on a residual stream without "
                                 r"a batch axis \(1-D presences"):
        model(**inputs)


def _yolos(mid_positions: bool) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModel
    config = AutoConfig.for_model("yolos", **dict(_VISION, image_size=[8, 8], num_hidden_layers=2),
                                  num_detection_tokens=3,
                                  use_mid_position_embeddings=mid_positions)
    torch.manual_seed(0)
    return zoo.jitter(AutoModel.from_config(config).eval())


def test_a_table_added_between_layers_is_refused_and_without_it_a_null_stays_zero() -> None:
    """YOLOS with ``use_mid_position_embeddings`` adds one position table per layer to the
    stream between layers, inside its encoder's forward: no site gates it, so a zeroed token was
    0.24 after layer 1 under full-o, accepted. Refused naming the parameter; without it the
    retrofit holds a zeroed token at exactly 0 through every layer."""
    with pytest.raises(RetrofitError, match=r"encoder\.interpolation\.mid_position_embeddings "
                                            r"\(parameter of InterpolateMidPositionEmbeddings next to the layers"):
        retrofit(_yolos(True), "full-o", 1e-6)
    model = _yolos(False)
    inputs = zoo.example_inputs(model)
    _agrees(model, inputs)

    def zero_token(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.index_fill(1, torch.tensor([3]), 0.0)        # (B, N, d): token 3 zeroed

    handle = model.embeddings.register_forward_hook(zero_token)
    try:
        with retrofitted(model, "full-o", 1e-6):
            states = model(**inputs, output_hidden_states=True).hidden_states
    finally:
        handle.remove()
    assert len(states) == 3 and all(s[:, 3].abs().max() == 0 for s in states)
    assert all(s[:, 2].abs().max() > 0 for s in states)
