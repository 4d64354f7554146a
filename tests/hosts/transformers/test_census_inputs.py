"""The census' example inputs (``oretrofit/hosts/transformers/inputs.py``) for the model types it
left unchecked, each at its mechanism on a tiny config: the vocabulary of a composite config
(its text sub-config), hashed ids (CANINE), a text and an image tower read side by side, a
main input the forward does not take (Gemma4's vision tower), patch rows with their sizes
(SigLIP2), positions (Gemma4) or packed strip (MiniCPM-V), patches a 2-D convolution embeds
(Kimi-K2.5); the null insertion in front of the patches where a rotary table rotates the last
patches by sequence index (DINOv3), and its refusal where a table sized by the token count
follows the carrier (YOLOS); the census' tiny configs that keep the default's relations."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoConfig, AutoModel  # noqa: E402

from oretrofit import RetrofitError, retrofitted  # noqa: E402
from oretrofit.hosts.transformers.contracts import agreement, null_insertion  # noqa: E402
from oretrofit.hosts.transformers.inputs import example_inputs  # noqa: E402

_WIDE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_VISION = dict(_WIDE, image_size=32, patch_size=8)


def _tiny(model_type: str, **config: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModel.from_config(AutoConfig.for_model(model_type, **config)).eval()


def _runs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    inputs = example_inputs(model)
    with torch.no_grad():
        model(**inputs)
    return inputs


def test_a_composite_config_takes_its_vocabulary_from_the_text_sub_config() -> None:
    """UltraVBert names no top-level ``vocab_size`` (its text config does): ids below it."""
    model = _tiny("ultravbert", text_config=dict(_WIDE, vocab_size=50),
                  vision_config=dict(_VISION, vision_use_head=False))
    assert not hasattr(model.config, "vocab_size")
    inputs = _runs(model)
    assert set(inputs) == {"input_ids", "attention_mask"} and inputs["input_ids"].max() < 50
    result = agreement(model, inputs, "full-o", tau=1e-12, eps=1e-30)
    assert result["relative_max_diff"] <= 1e-4 and result["revert_bit_identical"]


def test_hashed_ids_range_over_the_hash_buckets_and_the_hash_tables_are_refused() -> None:
    """CANINE hashes code points (no vocabulary, no word embedding): ids below its hash
    buckets run it, and the host refuses its hash embedders by name."""
    model = _tiny("canine", **_WIDE, num_hash_buckets=64)
    inputs = _runs(model)
    assert inputs["input_ids"].max() < 64
    with pytest.raises(RetrofitError, match=r"HashBucketCodepointEmbedder_0.*additive table"):
        with retrofitted(model, "full-o", 1e-6):
            pass


def test_a_dual_encoder_gets_ids_and_pixels_sized_by_its_vision_config() -> None:
    """A text and an image tower (no image placeholder token): both inputs, the pixels sized by
    the vision sub-config; a vision-language model with an image token gets text alone."""
    model = _tiny("vision-text-dual-encoder", projection_dim=32,
                  text_config=dict(_WIDE, model_type="bert", vocab_size=50),
                  vision_config=dict(_VISION, model_type="vit"))
    inputs = _runs(model)
    assert inputs["pixel_values"].shape == (2, 3, 32, 32) and inputs["input_ids"].shape == (2, 7)
    with pytest.raises(RetrofitError, match=r"text_model\.embeddings\.position_embeddings"):
        with retrofitted(model, "full-o", 1e-6):
            pass
    llava = AutoConfig.for_model("llava")
    assert llava.image_token_index is not None       # the placeholder that keeps text alone


def test_patch_rows_with_their_positions_run_gemma4s_vision_tower() -> None:
    """Gemma4's tower inherits ``main_input_name = input_ids`` but takes pixel rows
    ``(B, s·s, 3·P·P)`` with (column, row) ``pixel_position_ids``; s a multiple of its pooling
    kernel (3)."""
    model = _tiny("gemma4_vision", **_WIDE, num_key_value_heads=2, head_dim=8, patch_size=4)
    inputs = _runs(model)
    assert inputs["pixel_values"].shape == (2, 144, 48)
    assert inputs["pixel_position_ids"][0, 13].tolist() == [1, 1]        # row 1, column 1
    result = agreement(model, inputs, "oa", tau=1e-12, eps=1e-30)
    assert result["relative_max_diff"] <= 1e-4


def test_naflex_patch_rows_run_siglip2_and_its_position_table_is_gated() -> None:
    """SigLIP2's NaFlex input: rows, their ``spatial_shapes`` and an all-ones mask; the host
    gates the position table its embeddings resize per image by the patch presence
    (``tests/hosts/transformers/test_pooling_heads.py``)."""
    model = _tiny("siglip2_vision_model", **_WIDE, patch_size=4, num_patches=64)
    inputs = _runs(model)
    assert inputs["spatial_shapes"].tolist() == [[4, 4]] * 2
    assert inputs["pixel_attention_mask"].shape == inputs["pixel_values"].shape[:2] == (2, 16)
    with retrofitted(model, "full-o", 1e-6) as r:
        assert "embeddings" in [row["site"] for row in r.report()]


def test_a_navit_pack_runs_minicpm_and_its_merger_is_refused() -> None:
    """MiniCPM-V packs every image's patches into one strip ``(1, C, P, B·s·s·P)`` with
    ``target_sizes``; its window-attention merger is refused by name."""
    model = _tiny("minicpm_ocr_vision", **_VISION)
    inputs = _runs(model)
    assert inputs["pixel_values"].shape == (1, 3, 8, 2 * 8 * 8 * 8)
    assert inputs["target_sizes"].tolist() == [[8, 8]] * 2
    with pytest.raises(RetrofitError, match=r"vit_merger"):
        with retrofitted(model, "full-o", 1e-6):
            pass


def test_patches_a_2d_convolution_embeds_come_as_images() -> None:
    """Kimi-K2.5's tower embeds each patch with a Conv2d: ``(N, C, P, P)`` patches with their
    grid; it inherits ``main_input_name = input_ids`` and takes ``pixel_values``."""
    model = _tiny("kimi_k25_vision", **_VISION)
    inputs = _runs(model)
    assert inputs["pixel_values"].shape == (2 * 4 * 4 * 4, 3, 8, 8)


def test_dinov3_nulls_go_in_front_of_the_patches_and_stay_inert() -> None:
    """DINOv3 rotates its last patch-count tokens by the pixel grid: inserted in front of the
    class and register tokens, the nulls leave every old position as it was."""
    model = _tiny("dinov3_vit", **_VISION)
    inputs = _runs(model)
    with retrofitted(model, "full-o", 1e-6):
        result = null_insertion(model, inputs)
    assert result["where"] == "start"
    assert result["inserted_max_abs"] == 0 and result["old_max_delta"] <= 1e-4


def test_a_table_sized_by_the_token_count_leaves_null_insertion_undefined() -> None:
    """YOLOS adds mid-layer position tables of exactly 1 + patches + detection tokens rows by
    sequence index: no token can be inserted, and null insertion says so."""
    model = _tiny("yolos", **dict(_VISION, image_size=[32, 32]), num_detection_tokens=5)
    inputs = _runs(model)
    with pytest.raises(ValueError, match=r"YolosModel does not run with 2 tokens more.*sized "
                                         r"by the token count"):
        null_insertion(model, inputs)


def _census_build():
    path = Path(__file__).resolve().parents[3] / "scripts" / "transformers_census_build.py"
    spec = importlib.util.spec_from_file_location("census_build_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model_type", ["bros", "lilt"])
def test_layout_embeddings_that_split_the_width_build_at_width_192(model_type: str) -> None:
    """BROS's box sinusoids (width / 4 / dim_bbox, in pairs) and LiLT's six box tables (width
    / 6) do not fit a width of 32; the census builds them at 192 (768 / 4)."""
    built = _census_build().build(model_type, 0)
    assert not isinstance(built, str), built
    model, inputs, attempt = built
    assert attempt == "tiny, width 192" and model.config.hidden_size == 192
