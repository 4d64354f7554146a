"""Every model, tokenizer and config oretrofit loads from a transformers folder goes through
:func:`from_pretrained`: offline, with ``trust_remote_code=False``, and never from a folder whose
files name Python code of their own (``auto_map``), which is refused before transformers reads
the folder, so transformers never asks on stdin whether to run it. Corrupt weights are named
with the fix.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from ..._files.reading import check_folder_files, read_json

__all__ = ["from_pretrained"]

# the files of a folder that can name Python code of its own for transformers to import
_CODE_NAMING = ("config.json", "tokenizer_config.json", "processor_config.json",
                "preprocessor_config.json")
# the release from which from_pretrained takes ``dtype=``; before it, ``torch_dtype=``
DTYPE_KEYWORD_FROM = "4.56.0"
_SAFE_FIX = ("save the model with a class transformers ships (model.save_pretrained(folder, "
             "safe_serialization=True) where you trust the code), then pass the folder again")


def _refuse_custom_code(path: Path) -> None:
    """Refuse a folder whose files name Python code of their own (``auto_map``), and any
    entry that is no regular file (a FIFO would hang the reader), by name."""
    check_folder_files(path, "the model folder", "a model folder holds regular files only")
    for name in _CODE_NAMING:
        if not (path / name).exists():
            continue
        found = read_json(path / name, "the model file", _SAFE_FIX)
        code = found.get("auto_map") if isinstance(found, dict) else None
        if code:
            named = code.values() if isinstance(code, dict) else [code]
            raise ValueError(f"{path / name} names Python code of its own (auto_map: "
                             f"{', '.join(map(str, named))}); oretrofit never runs a model "
                             f"folder's code (trust_remote_code is off): {_SAFE_FIX}")


def from_pretrained(loader: Any, path: str | Path, **kwargs: Any) -> Any:
    """``loader.from_pretrained(path, **kwargs)`` (an ``Auto*`` class) offline, with
    ``trust_remote_code=False``: a folder naming code of its own is refused before transformers
    reads it (and transformers never asks on stdin). Every model, tokenizer and config oretrofit
    loads from a folder goes through here."""
    from packaging.version import Version
    from safetensors import SafetensorError

    from .releases import transformers_version
    _refuse_custom_code(Path(path))
    if "dtype" in kwargs and Version(transformers_version()) < Version(DTYPE_KEYWORD_FROM):
        kwargs["torch_dtype"] = kwargs.pop("dtype")
    try:
        return loader.from_pretrained(path, local_files_only=True, trust_remote_code=False,
                                      **kwargs)
    except pickle.UnpicklingError as exc:
        if "Unsupported global" not in str(exc):            # not a code pickle: bad bytes
            raise ValueError(f"the weights in {path} are corrupt: not a torch checkpoint "
                             f"({str(exc).splitlines()[-1][:120] if str(exc) else exc!r}); "
                             f"re-save or re-download the model") from None
        raise ValueError(                   # torch's weights-only refusal of a code pickle
            f"{path} holds its weights as a pickle with Python objects in it (pytorch_model.bin), "
            "which oretrofit never unpickles; re-save the model as safetensors "
            "(model.save_pretrained(folder, safe_serialization=True) where you trust the file), "
            "then pass the folder again") from None
    except OSError as exc:
        raise ValueError(f"{path} does not load ({exc}); re-save the model with "
                         "model.save_pretrained(folder), or re-download it") from None
    except SafetensorError as exc:
        raise ValueError(f"the safetensors weights in {path} are corrupt ({exc}); re-save the "
                         "model with model.save_pretrained(folder, safe_serialization=True), or "
                         "re-download it") from None
