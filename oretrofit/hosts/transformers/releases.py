"""The transformers host's version gate: which transformers releases it admits, and what differs
between them.

:func:`check_transformers` admits the releases ``results/transformers-compat.md`` shows passing
(:data:`TESTED_RELEASES`) and the later patch releases of their minors, and refuses any other
release naming the ``pip install`` that fixes it (:func:`requirement`); a release newer than
every tested one (:func:`untested_newer`) is not refused by the list: the host checks the
model's architecture on it first (:mod:`.selfcheck`). :data:`COVERED_FROM` names the
architectures the host covers only from some admitted release on.
"""

from __future__ import annotations

import os
from typing import Any

from ..._surgery.host import RetrofitError
from ..._surgery.moved import moved_attribute

__all__ = ["check_transformers", "transformers_version", "TESTED_RELEASES", "BLOCKED",
           "FIRST_MASK_INTERFACE", "SWEEP_RELEASE", "ROUTES_FROM", "supported_range",
           "supported_text", "requirement", "admits", "untested_newer", "COVERED_FROM",
           "INTERFACE", "SOFTMAX_ROUTE", "NEW_LAYOUT", "TOP_K_INDEXER", "NEW_MODEL_TYPE",
           "covered_from", "before_covered", "not_covered_yet"]


# The passing rows of results/transformers-compat.md (scripts/transformers_compat.py runs the
# host's tests on the newest patch release of every minor from 4.53, and on earlier patch
# releases users pin, each in its own environment).
TESTED_RELEASES: tuple[str, ...] = (
    "4.53.3", "4.54.1", "4.55.4", "4.56.1", "4.56.2", "4.57.1", "4.57.6", "5.0.0", "5.1.0",
    "5.2.0", "5.3.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1", "5.9.0", "5.10.4", "5.11.0", "5.12.1",
    "5.13.1", "5.14.1", "5.15.1", "5.16.0", "5.16.1", "5.17.0", "5.18.0", "5.19.0", "5.20.1",
    "5.20.2", "5.21.1", "5.22.1", "5.22.2", "5.23.0", "5.24.0", "5.25.0")

# Why releases before FIRST_MASK_INTERFACE are refused. The host registers the mask function of
# its attention implementation with AttentionMaskInterface (transformers.masking_utils), first
# shipped in 4.53.0 (AttentionInterface alone, from 4.51, would leave transformers building no
# mask for it).
FIRST_MASK_INTERFACE = "4.53.0"
_BEFORE_MASK_INTERFACE = (
    f"transformers before {FIRST_MASK_INTERFACE} has no AttentionMaskInterface "
    "(transformers.masking_utils), where the host registers the mask function of its attention "
    "implementation (without it transformers builds no mask for the implementation, and padding "
    "and causality would be lost)")

# Minors the gate refuses because their rows fail, with why (named in the refusal); the compat
# sweep tries them every time, and a minor leaves this table once its row passes.
BLOCKED: dict[str, str] = {
    "5.4": "transformers 5.4.0 cannot build the configs of OLMo, OLMo2, OLMo3, OLMoE, mBART, "
           "M2M100, Cohere2, ERNIE 4.5, EuroBERT, Phi-MoE and more with the huggingface-hub it "
           "installs (strict field validation: 'tie_word_embeddings expected int, got bool'); "
           "5.5 fixed it",
}


# Architectures the host covers only from some admitted release on: model type -> (the first
# tested release where it does, why not before). Almost all because their modeling code computes
# attention itself before that release (the host then finds no module calling the interface);
# model types missing here are covered in every admitted release that has them. Measured, not
# read from changelogs: scripts/transformers_compat.py probes every architecture of
# tests/hosts/transformers/zoo.py in each release's environment (per row of the receipt: how many
# are covered, refused, absent; per architecture in its .json) and prints this table from the
# probes; the other rows (ESM, Qwen3.5, UMT5, Doge, Llama4, DeepSeek-V3) are where that
# release's tests failed, the release found by running the failing contract in each release's
# environment.
# tests/hosts/transformers/test_releases.py checks the table against the receipt.
INTERFACE = "does not route attention through the attention interface"
_ESM = ("rotates queries and keys by sequence index, not by position_ids, so a null token "
        "inserted mid-sequence would move the tokens after it")
_QWEN35 = ("fails in transformers' own forward with full-attention layers only (has_previous_state "
           "asked of a cache without linear-attention layers), and with linear-attention layers "
           "the host refuses it (a token mixer outside the interface)")
_UMT5 = ("disagrees with itself under the retrofit at τ→0 (relative difference 0.87 on the tiny "
         "model, eager and SDPA alike), though it routes attention through the interface")
_LLAMA4 = ("scales each token's expert input by another token's router score (its router scores "
           "are reshaped without the transpose transformers 4.56.1 added), so a token inserted "
           "moves the others (relative difference 0.10 on the tiny model)")
_DEEPSEEK_V3 = ("fails in transformers' own forward on the tiny model (its SDPA call is given "
                "fewer key heads than query heads)")
_DOGE = ("computes other attention under SDPA than under eager (its dynamic mask; relative "
         "difference 1.2 on the tiny model), and the retrofit follows eager, so it would change "
         "an SDPA model's outputs")
# The softmax route, the layouts and rules added with it and the top-k indexer came on
# ROUTES_FROM, then the newest tested release: measured there and on the releases the sweep ran
# since (results/transformers-compat.json), refused before it.
ROUTES_FROM = "5.24.0"
SOFTMAX_ROUTE = ("its attention is the module's own code, covered by the softmax route "
                 "(softmax_route.py), which is measured on later releases only so far")
NEW_LAYOUT = ("has layers (or a decoder word embedding, or an attention output projection) the "
              "host describes from a layout or rule added on a later release, measured on the "
              "releases from that one only so far")
TOP_K_INDEXER = ("selects its attention's keys with a top-k indexer (DeepSeek sparse attention), "
                 "which the host ranks by presence (indexer.py), measured on later releases only "
                 "so far")
# a model type newer than the oldest tested release: absent there, so the tests expect its
# build to fail naming it; the row names the first tested release that has it
NEW_MODEL_TYPE = "is a model type that release does not have yet"
COVERED_FROM: dict[str, tuple[str, str]] = {
    "minimax_m2": ("5.0.0", NEW_MODEL_TYPE),           # new in 5.0
    **{model_type: ("4.54.1", NEW_MODEL_TYPE)           # new in 4.54
       for model_type in ("exaone4", "ernie4_5", "ernie4_5_moe", "modernbert-decoder",
                          "deepseek_v2", "glm4_moe")},
    "gpt_oss": ("4.55.4", NEW_MODEL_TYPE),             # new in 4.55
    **{model_type: ("4.56.1", NEW_MODEL_TYPE)           # new in 4.56
       for model_type in ("apertus", "hunyuan_v1_dense", "hunyuan_v1_moe", "seed_oss")},
    "llama4_text": ("4.56.1", _LLAMA4),
    "gpt_bigcode": ("4.54.1", INTERFACE),
    "deepseek_v3": ("4.54.1", _DEEPSEEK_V3),
    **{model_type: ("4.57.1", NEW_MODEL_TYPE)           # new in 4.57
       for model_type in ("olmo3", "vaultgemma", "flex_olmo")},
    "modernbert": ("5.1.0", INTERFACE),
    "qwen3_5_text": ("5.15.1", _QWEN35),              # the model type is new in 5.2
    "eurobert": ("5.3.0", INTERFACE),                # new in 5.3
    "jina_embeddings_v3": ("5.5.4", INTERFACE),      # new in 5.4 (refused: BLOCKED)
    "nomic_bert": ("5.5.4", INTERFACE),              # new in 5.5
    "esm": ("5.6.2", _ESM),
    "beit": ("5.9.0", INTERFACE),
    "nemotron": ("5.13.1", INTERFACE),
    "diffllama": ("5.13.1", INTERFACE),
    "t5": ("5.15.1", INTERFACE),
    "mt5": ("5.15.1", INTERFACE),
    "umt5": ("5.18.0", _UMT5),                       # on the interface from 5.15
    "switch_transformers": ("5.15.1", INTERFACE),
    "gte": ("5.18.0", INTERFACE),                    # new in 5.18
    "gptj": ("5.24.0", INTERFACE),
    "codegen": ("5.24.0", INTERFACE),
    "doge": ("5.18.0", _DOGE),
    **{model_type: (ROUTES_FROM, SOFTMAX_ROUTE) for model_type in (
        "xglm", "openai-gpt", "mpt", "bloom", "falcon", "gpt_neo", "big_bird", "roformer",
        "megatron-bert", "deberta", "deberta-v2", "mpnet", "tapas", "luke", "bigbird_pegasus",
        "gpt_neox_japanese", "imagegpt", "mvp", "data2vec-vision")},
    **{model_type: (ROUTES_FROM, NEW_LAYOUT) for model_type in (
        "aimv2_vision_model", "nllb-moe", "t5gemma", "internvl_vision", "xmod", "albert",
        "vjepa2", "siglip_vision_model", "siglip2_vision_model", "gemma4_vision")},
    # the default minimax_m3_vl_text has dense layers only, which the refused row of indexers
    # matched too
    **{model_type: (ROUTES_FROM, TOP_K_INDEXER) for model_type in (
        "deepseek_v32", "glm_moe_dsa", "axk2", "mistral_large4", "mistral_large4_text")},
    "minimax_m3_vl_text": (ROUTES_FROM, NEW_LAYOUT),
}


def covered_from(model_type: str) -> str | None:
    """The first tested release where the host covers ``model_type`` (None: every admitted
    release that has the model type)."""
    return COVERED_FROM.get(model_type, (None, ""))[0]


def before_covered(model_type: str, version: str | None = None) -> str | None:
    """The release the host covers ``model_type`` from, when transformers ``version`` (default: the
    installed one) is older; else None."""
    from packaging.version import Version
    first = covered_from(model_type)
    version = version or transformers_version()
    return first if first is not None and Version(version) < Version(first) else None


def not_covered_yet(name: str, model_type: str, version: str | None = None) -> str | None:
    """Why a ``model_type`` model is refused in transformers ``version`` (installed by default)
    when the host covers it only from a later release; else None."""
    version = version or transformers_version()
    first = before_covered(model_type, version)
    if first is None:
        return None
    why, fix = COVERED_FROM[model_type][1], requirement().replace(TESTED_RELEASES[0], first, 1)
    if why == INTERFACE:
        said = f"{why} in transformers {version}; it does from {first}"
    else:
        said = (f"is not covered in transformers {version}: there it {why}; the host covers it "
                f"from {first}")
    return f'{name} (model type {model_type!r}) {said} (pip install "{fix}")'


def transformers_version() -> str:
    import transformers
    return transformers.__version__


def _minor(version: str) -> tuple[int, int]:
    from packaging.version import Version
    return Version(version).release[:2]


def supported_range() -> tuple[str, str]:
    """The admitted releases as pip bounds ``(oldest, below)``: from the oldest tested release
    up to, not including, the minor after the newest tested one (``"5.24.0", "5.25"``)."""
    major, minor = _minor(TESTED_RELEASES[-1])
    return TESTED_RELEASES[0], f"{major}.{minor + 1}"


def admits(version: str) -> bool:
    """Whether the gate admits transformers ``version``: at least the oldest tested release and
    of a tested minor (the receipt tests each minor's newest patch release), so the patch
    releases of a tested minor are admitted and a pre-release of the next minor is not."""
    from packaging.version import InvalidVersion, Version
    try:
        return (Version(version) >= Version(TESTED_RELEASES[0])
                and _minor(version) in {_minor(release) for release in TESTED_RELEASES})
    except InvalidVersion:
        return False


def untested_newer(version: str) -> bool:
    """Whether transformers ``version`` is newer than every tested release (and of no minor
    :data:`BLOCKED` refuses): there a retrofit checks its model's architecture on a tiny copy
    first (:mod:`.selfcheck`) instead of being refused by this list."""
    from packaging.version import InvalidVersion, Version
    try:
        newer = Version(version) > Version(TESTED_RELEASES[-1])
    except InvalidVersion:
        return False
    return newer and not admits(version) and ".".join(map(str, _minor(version))) not in BLOCKED


def _gaps() -> list[str]:
    """Minors between the oldest and the newest tested release that the gate refuses (a major
    before the newest one: up to its newest tested minor)."""
    tested = {_minor(release) for release in TESTED_RELEASES}
    first, last = _minor(TESTED_RELEASES[0]), _minor(TESTED_RELEASES[-1])
    gaps = []
    for major in range(first[0], last[0] + 1):
        low = first[1] if major == first[0] else 0
        high = last[1] if major == last[0] else max(m for j, m in tested if j == major)
        gaps += [f"{major}.{m}" for m in range(low, high + 1) if (major, m) not in tested]
    return gaps


def requirement() -> str:
    """The admitted releases as one pip requirement, e.g. ``transformers>=5.0.0,!=5.4.*,<5.25``
    (the hf extra of pyproject.toml and the fix each refusal names)."""
    oldest, below = supported_range()
    return ",".join([f"transformers>={oldest}", *(f"!={gap}.*" for gap in _gaps()), f"<{below}"])


def supported_text() -> str:
    """The admitted releases as the docs and refusals say them, e.g. ``5.0.0 to 5.24.x (not
    5.4)``."""
    major, minor = _minor(TESTED_RELEASES[-1])
    gaps = _gaps()
    return (f"{TESTED_RELEASES[0]} to {major}.{minor}.x"
            + (f" (not {', '.join(gaps)})" if gaps else ""))


def _why_not(version: str) -> str:
    """Why ``version`` is refused, beyond not being among the tested releases."""
    from packaging.version import InvalidVersion, Version
    try:
        name, older = ".".join(map(str, _minor(version))), Version(version) < Version(
            TESTED_RELEASES[0])
        before_mask = Version(version) < Version(FIRST_MASK_INTERFACE)
    except InvalidVersion:
        return ""
    why = (_BEFORE_MASK_INTERFACE if before_mask else BLOCKED.get(name)
           or (f"oretrofit's tests have not passed on transformers {name} yet"
               if older or name in _gaps() else ""))
    if older:
        return f"; support starts at {TESTED_RELEASES[0]}: {why}"
    if not why and untested_newer(version):
        why = ("it is newer than every tested release, so a retrofit checks the model's "
               "architecture on a tiny random copy first and admits it when the contracts hold")
    return f"; {why}" if why else ""


# scripts/transformers_compat.py measures releases the gate does not admit (yet): it names the
# installed release in this variable for the host's tests and probe, and for nothing else
SWEEP_RELEASE = "ORETROFIT_COMPAT_SWEEP_RELEASE"


def check_transformers() -> None:
    """Refuse a transformers release the host has not been shown to work with, naming the fix
    (the tested releases are results/transformers-compat.md's passing rows)."""
    version = transformers_version()
    if admits(version) or os.environ.get(SWEEP_RELEASE) == version:
        return
    raise RetrofitError(
        f"transformers {version} is not supported by the transformers host; it is tested on "
        f"{supported_text()}{_why_not(version)}: "
        f'pip install "{requirement()}"')


def __getattr__(name: str) -> Any:
    """A name that moved out of this module, for pickles written before
    (:data:`oretrofit._surgery.moved.MOVED`)."""
    return moved_attribute(__name__, name)
