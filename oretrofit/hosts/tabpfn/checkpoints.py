"""TabPFN checkpoints (every supported model version): find, validate, load (weights only) and
build; random-init hosts.

A checkpoint is tabpfn's own format: a ``.ckpt`` (``torch.save``) or ``.safetensors`` file
holding ``state_dict``, ``config``, ``architecture_name`` and ``inference_config``; tabpfn reads
the model version from the file name (``v2.5``, ``v2.6``, ``v3``, ``v3.5``; see
:func:`oretrofit.hosts.tabpfn.versions.version_from_name`). Up to v2.6 a regressor's bucket
borders are criterion state (``criterion.borders`` and ``criterion.losses_per_bucket``, as
tabpfn loads them), from v3 the model's ``regression_borders``. Files written here also carry
an ``oretrofit`` entry ``{"weights": "random" | ..., "size", "seed"}`` that tabpfn ignores.

Loading reads regular files only (:func:`oretrofit._files.reading.regular_file`: a FIFO or device is
refused unopened) and checks, before any model is built, that the architecture config holds
only keys the version knows and describes the weights: the model is built on the meta device
(no memory) and its tensor shapes compared with the checkpoint's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import pickle
import tempfile
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterator

import torch

from ..._files.atomic import atomic_file, scratch_folder
from ..._files.reading import FileRefused, parse_json, regular_file
from ..._files.provenance import cache_dir, sha256_file
from ..._surgery.registry import RetrofitError
from . import releases

# every path to a TabPFN model passes here: refuse an untested tabpfn before importing from it
releases.require_tested_release()

__all__ = ["SIZES", "write_random_checkpoint", "resolve_model_path", "checkpoint_sha256",
           "load_checkpoint", "build_model", "weights_label", "cache_dir", "save_atomic", "check_checkpoint_name",
           "default_inference_config", "checkpoint_task", "DEMO_CHECKPOINT", "DEMO_CLASSIFIER_CHECKPOINT",
           "DEFAULT_CHECKPOINT_NAME",
           "DEFAULT_CHECKPOINT_NAMES", "RANDOM_CLASSIFIER_CLASSES", "V2_SIZES", "release_checkpoint"]

# progress and notices, not results: shown by the CLI (oretrofit.cli.output.show_progress)
_log = logging.getLogger(__name__)

# "default" is the vendor's v3 architecture (58.3M parameters with 5000 buckets); "small" a
# ~1.6M-parameter version of it for tests, the random host and the demo.
SIZES: dict[str, dict[str, Any]] = {
    "default": {"num_buckets": 5000},
    "small": {"num_buckets": 5000, "embed_dim": 32, "dist_embed_num_blocks": 2,
              "dist_embed_num_heads": 4, "dist_embed_num_inducing_points": 16,
              "feat_agg_num_blocks": 2, "feat_agg_num_heads": 4, "feat_agg_num_cls_tokens": 4,
              "nlayers": 4, "icl_num_heads": 4, "softmax_scaling_mlp_hidden_dim": 16},
}
# The sizes of the v2 family (v2, v2.5, v2.6: per-feature transformers), by the same names
# (each version's own features_per_group; v2 has no thinking rows and ignores their number).
V2_SIZES: dict[str, dict[str, Any]] = {
    "default": {"num_buckets": 5000},
    "small": {"num_buckets": 5000, "emsize": 32, "nlayers": 3, "nhead": 4,
              "num_thinking_rows": 8},
}
DEMO_CHECKPOINT = Path(__file__).resolve().parents[2] / "data" / "tabpfn-v3-demo.ckpt"
DEMO_CLASSIFIER_CHECKPOINT = DEMO_CHECKPOINT.with_name("tabpfn-v3-demo-classifier.ckpt")
DEFAULT_CHECKPOINT_NAME = "tabpfn-v3-regressor-v3_default.ckpt"
DEFAULT_CHECKPOINT_NAMES = {"regressor": DEFAULT_CHECKPOINT_NAME,
                            "classifier": "tabpfn-v3-classifier-v3_default.ckpt"}
# A random classifier host reads out up to this many classes (the vendor's v3 default).
RANDOM_CLASSIFIER_CLASSES = 10
_REQUIRED_KEYS = ("state_dict", "config", "architecture_name", "inference_config")
# Weights the vendor initialises to zero (out-projections, MLP outputs, the scaling MLPs'
# query modulation): a fresh host would be near the identity and hide bugs.
_ZERO_INIT_SUFFIXES = ("out_projection.weight", "mlp.2.weight", "query_mlp.2.weight",
                       "query_mlp.2.bias")


def checkpoint_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a checkpoint file (recorded with every result made from it)."""
    return sha256_file(path)


def save_atomic(checkpoint: dict[str, Any], path: Path) -> Path:
    """Write ``checkpoint`` to ``path`` via a temporary file and a rename, byte-reproducibly.

    ``.ckpt``: ``torch.save`` into memory first, because a zip written straight to a file takes
    the file's name as its archive name and the random temporary name would change the bytes
    (and the sha256) of identical weights. ``.safetensors``: tabpfn's ``save_as_safetensors``,
    into a scratch folder named for this process (a killed run's is swept by the next,
    :func:`~oretrofit._files.atomic.scratch_folder`).
    """
    with atomic_file(path, "wb") as fh:
        if path.suffix == ".safetensors":             # tabpfn's writer takes a path only
            with scratch_folder(tempfile.gettempdir(), "oretrofit-safetensors") as scratch:
                releases.save_safetensors(checkpoint, scratch / path.name)
                fh.write((scratch / path.name).read_bytes())
        else:
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            fh.write(buffer.getbuffer())
    return path


def default_inference_config(task: str = "regressor") -> dict[str, Any]:
    """tabpfn's v2.5 inference config of ``task`` as a dict (what v3 checkpoints carry)."""
    from tabpfn.constants import ModelVersion
    from tabpfn.inference_config import InferenceConfig
    task_type = "multiclass" if task == "classifier" else "regression"
    return asdict(InferenceConfig.get_default(task_type, ModelVersion.V2_5))


def checkpoint_task(checkpoint: dict[str, Any], task: str | None = None) -> str:
    """The task of a checkpoint: v3 reads out classes when ``max_num_classes >= 2``
    (``"classifier"``), else ``"regressor"``; a v3.5 model serves both, so ``task`` (when
    given) is its task."""
    if checkpoint.get("architecture_name") == "tabpfn_v3_5" and task is not None:
        return task
    return "classifier" if checkpoint["config"].get("max_num_classes", -1) >= 2 else "regressor"


def random_model(version: str = "v3", size: str = "small", seed: int = 0,
                 task: str = "regressor") -> tuple[torch.nn.Module, Any]:
    """A random-init model of TabPFN ``version`` (a supported row of
    :data:`~oretrofit.hosts.tabpfn.versions.VERSIONS`), built from that version's own
    ``parse_config`` (v2.5/v2.6 at :data:`V2_SIZES`; v3 also at size ``"demo"``, the shipped
    demo regressor's architecture), and its config. A classifier (and every
    v3.5 model, which serves both tasks) reads out :data:`RANDOM_CLASSIFIER_CLASSES` classes.

    The zero-initialised weights (out-projections, MLP outputs, query modulation) are redrawn
    from N(0, 1/fan_in) (query modulation N(0, 0.02²)) so the host is far from the identity.
    Deterministic in ``seed``; the global RNG is left untouched.
    """
    from .versions import VERSIONS, architecture, supported
    row = next((v for v in VERSIONS if v.label == version and v.sites), None)
    if row is None:
        raise RetrofitError(f"no random TabPFN {version!r} host: supported are {supported()}")
    sizes = V2_SIZES if row.sites == "v2_5" else {**SIZES, "demo": {}}
    if size not in sizes:
        raise ValueError(f"size must be one of {', '.join(sizes)}, got {size!r}")
    fields = _demo_architecture() if size == "demo" else sizes[size]
    if task not in DEFAULT_CHECKPOINT_NAMES:
        raise ValueError(f"task must be regressor or classifier, got {task!r}")
    arch = architecture(row)
    classes = ({"max_num_classes": RANDOM_CLASSIFIER_CLASSES}
               if task == "classifier" or version == "v3.5" else
               {"max_num_classes": 0} if row.sites == "v2_5" else {})   # a v2.x regressor's
    # (the configs' default -1 is no task: tabpfn 8.0.1 refuses to load it from a file)
    config, _ = arch.parse_config({**fields, **classes})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = arch.get_architecture(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(_ZERO_INIT_SUFFIXES):
                    std = 0.02 if "query_mlp" in name else param.shape[-1] ** -0.5
                    param.normal_(0.0, std)
    return releases.ensure_config(model.eval(), config), config


def write_random_checkpoint(path: str | os.PathLike[str], size: str = "small", seed: int = 0,
                            task: str = "regressor", version: str = "v3") -> Path:
    """Write :func:`random_model` as a checkpoint in tabpfn's format (``architecture_name``
    of the version, the version's name in the file name, checked)."""
    path = Path(path)
    check_checkpoint_name(path, version)
    model, config = random_model(version, size, seed, task)
    state = model.state_dict()
    if getattr(model, "regression_borders", None) is None and task == "regressor":
        criterion = releases.bar_distribution()(_regression_borders(config.num_buckets))
        state.update({f"criterion.{k}": v for k, v in criterion.state_dict().items()})
    checkpoint = {
        "state_dict": state,
        "config": asdict(config),
        "architecture_name": _architecture_name(version),
        "inference_config": default_inference_config(task),
        "oretrofit": {"weights": "random", "size": size, "seed": int(seed), "version": version},
    }
    return save_atomic(checkpoint, path)


def _regression_borders(num_buckets: int) -> torch.Tensor:
    """Bucket borders for a v2.x regressor, stored as tabpfn stores them up to v2.6 (criterion
    state ``criterion.borders``): v3's spline-based borders of ``num_buckets`` buckets."""
    from tabpfn.architectures import tabpfn_v3
    return tabpfn_v3._spline_based_regression_borders(num_buckets)


def _architecture_name(version: str) -> str:
    from .versions import VERSIONS
    return next(v.architecture_name for v in VERSIONS if v.label == version)


def check_checkpoint_name(path: Path, version: str | None = None) -> str:
    """The TabPFN version tabpfn reads from the file name (``versions.version_from_name``),
    refused when it is not supported, not ``version`` (when given), or the file is not
    .ckpt/.safetensors. Every checkpoint oretrofit writes or reads is checked."""
    from .versions import version_from_name
    if path.suffix not in (".ckpt", ".safetensors"):
        raise RetrofitError(f"{path.name}: a TabPFN checkpoint is a .ckpt or .safetensors file")
    row = version_from_name(path.name, refuse=version is None)
    if version is not None and row.label != version:
        raise RetrofitError(f"{path.name}: tabpfn reads the model version from the file name, "
                            f"which must contain '{version}' for this TabPFN {version} checkpoint "
                            f"(it reads {row.label}); rename the file (e.g. "
                            f"tabpfn-{version}-regressor.ckpt)")
    return row.label


def _demo_architecture() -> dict[str, Any]:
    """The demo regressor's architecture config, read from the shipped checkpoint (its
    architecture only: a tabpfn too old for its inference config builds the architecture)."""
    if not DEMO_CHECKPOINT.exists():
        raise RetrofitError(f"size 'demo' is the architecture of the demo checkpoint "
                            f"{DEMO_CHECKPOINT}, which is not installed; reinstall oretrofit")
    return dict(torch.load(DEMO_CHECKPOINT, map_location="cpu", weights_only=True,
                           mmap=True)["config"])


def _random_host(task: str, size: str = "small") -> Path:
    """The cached random host of ``size``, one file per task and tabpfn release (each release
    writes its own inference config)."""
    kind = "" if task == "regressor" else f"{task}-"
    path = (cache_dir()
            / f"tabpfn-v3-random-{kind}{size}-seed0-tabpfn{releases.installed_version()}.ckpt")
    if not path.exists():
        write_random_checkpoint(path, size, seed=0, task=task)
    return path


def _demo_host(task: str) -> Path:
    """The ``demo`` host of ``task``: the trained checkpoint shipped in ``oretrofit/data``, the
    regressor ``tabpfn-v3-demo.ckpt`` or the classifier ``tabpfn-v3-demo-classifier.ckpt``
    (the classifier prior-fitted from the regressor's weights; their cards, the ``.md`` beside
    each, say how). Without the shipped checkpoint: the small random host, with a warning."""
    path = DEMO_CHECKPOINT if task == "regressor" else DEMO_CLASSIFIER_CHECKPOINT
    if not path.exists():
        _log.warning(f"oretrofit: the trained demo checkpoint {path} is not "
                     "installed; using the small RANDOM-WEIGHTS v3 host instead")
        return _random_host(task)
    return path


def resolve_model_path(model_path: str | os.PathLike[str] | None, task: str = "regressor"
                       ) -> Path:
    """A validated TabPFN v3 checkpoint path (``task``: regressor or classifier).

    * ``"random"``: a deterministic small random-init host of ``task`` (random weights), cached
      under :func:`cache_dir`.
    * ``"demo"``: the trained demo regressor or classifier shipped in ``oretrofit/data`` when
      present, otherwise the random host with a warning logged (:func:`_demo_host`).
    * ``None``: tabpfn's download cache (``tabpfn.model_loading.get_cache_dir()``).
    * a path: must exist, be named ``*v3*.ckpt``/``*.safetensors`` and load weights-only; a
      bare file name not found in the working directory is looked up in tabpfn's cache.
    """
    if model_path is None:
        from tabpfn.model_loading import get_cache_dir
        path = Path(get_cache_dir()) / DEFAULT_CHECKPOINT_NAMES[task]
        if not path.exists():
            raise RetrofitError(
                f"no TabPFN v3 checkpoint at {path}. Get one on a machine with internet access: "
                "accept the licence at https://huggingface.co/Prior-Labs/tabpfn_3, then fit any "
                "tabpfn.TabPFNRegressor once (tabpfn downloads it to that folder), or download "
                f"{DEFAULT_CHECKPOINT_NAMES[task]} by hand and place it there (TABPFN_MODEL_CACHE_DIR "
                "moves the folder). Or pass --model-path PATH, "
                "or --model-path demo / random for a local host")
    elif str(model_path) == "random":
        return _random_host(task)
    elif str(model_path) == "demo":
        path = _demo_host(task)
    else:
        path = Path(model_path).expanduser()
        if path.parent == Path() and not path.exists():       # a bare name: tabpfn's cache, as
            from tabpfn.model_loading import get_cache_dir     # tabpfn itself resolves it
            path = Path(get_cache_dir()) / path
    if not path.exists():
        raise RetrofitError(f"checkpoint {path} does not exist; pass a TabPFN v3 .ckpt or "
                            ".safetensors file, 'demo' or 'random'")
    from .versions import version_of_checkpoint
    architecture = load_checkpoint(path)["architecture_name"]
    check_checkpoint_name(path, version_of_checkpoint(architecture).label)
    return path


@functools.lru_cache(maxsize=2)
def _load_cached(resolved: str, _identity: tuple[int, int]) -> dict[str, Any]:
    path = Path(resolved)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(resolved, framework="pt", device="cpu") as fh:
                checkpoint: dict[str, Any] = {
                    k: parse_json(v, f"its metadata entry {k!r}", "re-create it")
                    for k, v in (fh.metadata() or {}).items()}
                checkpoint["state_dict"] = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
        else:
            checkpoint = torch.load(resolved, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Unsupported global" not in str(exc):     # not a code pickle: other bytes
            raise RetrofitError(f"checkpoint {path} is not a checkpoint: neither a torch file "
                                "nor safetensors (its bytes do not parse); re-download or "
                                "re-create it") from None
        raise RetrofitError(                     # torch's weights-only refusal of a code pickle
            f"checkpoint {path} holds pickled Python objects, not a weights-only checkpoint (a "
            "model saved whole, with oretrofit.save or torch.save(model)?); oretrofit never "
            "unpickles code from a checkpoint: pass a TabPFN checkpoint (.ckpt or .safetensors, e.g. "
            "written by `oretrofit patch --out`); a model you saved yourself loads in Python "
            "with torch.load(path, weights_only=False)") from None
    except Exception as exc:  # noqa: BLE001  (any failure to read is a corrupt checkpoint)
        raise RetrofitError(f"checkpoint {path} is corrupt or not a weights-only TabPFN "
                            f"checkpoint ({type(exc).__name__}: {str(exc)[:200]}); re-download "
                            "or re-create it") from exc
    if not isinstance(checkpoint, dict) or any(k not in checkpoint for k in _REQUIRED_KEYS):
        raise RetrofitError(f"checkpoint {path} lacks one of {', '.join(_REQUIRED_KEYS)}; it is "
                            "not a TabPFN v3 checkpoint")
    from .versions import version_of_checkpoint
    version_of_checkpoint(str(checkpoint["architecture_name"]))      # refused by name
    _check_inference_fields(path, checkpoint["inference_config"])
    _check_finite(path, checkpoint["state_dict"])
    _check_shapes(path, checkpoint)
    return checkpoint


def _parse_config(checkpoint: dict[str, Any], where: str) -> tuple[Any, Any]:
    """``(architecture module, parsed config)`` of a checkpoint; a key of its architecture
    config that the version does not know is refused by name (tabpfn would drop it with a
    log line, and a model other than the one meant would run), except a chunking key at its
    default (:func:`.versions.droppable_keys`: another release's memory setting)."""
    from .versions import architecture, droppable_keys, version_of_checkpoint
    row = version_of_checkpoint(checkpoint["architecture_name"])
    arch = architecture(row)
    if not isinstance(checkpoint["config"], dict):
        raise RetrofitError(f"{where}: the architecture config is not a dict; re-download or "
                            "re-create the checkpoint")
    config, unused = arch.parse_config(dict(checkpoint["config"]))
    unused = sorted(set(unused) - droppable_keys(unused))
    if unused:
        raise RetrofitError(f"{where}: the architecture config has keys TabPFN {row.label} "
                            f"(tabpfn {version('tabpfn')}) does not know: "
                            f"{', '.join(map(str, unused))}; they would be ignored, so the "
                            "checkpoint is refused: re-create it with this tabpfn, or remove "
                            "the keys")
    return arch, config


def _check_shapes(path: Path, checkpoint: dict[str, Any]) -> None:
    """Refuse an architecture config that does not describe the checkpoint's weights (a huge
    ``embed_dim`` or ``nlayers`` would otherwise allocate its model before the weights are
    compared), by the first tensor that differs: the model is built on the meta device, which
    allocates nothing."""
    arch, config = _parse_config(checkpoint, f"checkpoint {path}")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in arch.get_architecture(config).state_dict()
                    .items()}
    found = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items()
             if "criterion." not in k and torch.is_tensor(v)}
    for name in sorted({*expected, *found}):
        if expected.get(name) != found.get(name):
            raise RetrofitError(
                f"checkpoint {path}: its architecture config does not describe its weights: "
                f"tensor {name!r} has shape {found.get(name, 'none (missing)')}, the config "
                f"asks for {expected.get(name, 'none (unexpected tensor)')}; re-download or "
                "re-create the checkpoint")


def _check_finite(path: Path, state_dict: dict[str, Any]) -> None:
    """Refuse NaN or infinite weights, naming each such tensor and how many of its values (they
    make every prediction NaN or the same, and a run would score them as a NaN RMSE)."""
    found = [(name, int((~torch.isfinite(tensor)).sum()), tensor.numel())
             for name, tensor in state_dict.items()
             if torch.is_tensor(tensor) and tensor.is_floating_point()]
    found = [entry for entry in found if entry[1]]
    if found:
        named = ", ".join(f"{name!r} ({bad} of {total} values)" for name, bad, total in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        raise RetrofitError(f"checkpoint {path}: {len(found)} tensor(s) hold NaN or infinite "
                            f"values: {named}{more}; re-download or re-create the checkpoint")


def _check_inference_fields(path: Path, stored: dict[str, Any]) -> None:
    """Refuse an inference config written by a newer tabpfn whose fields this one can neither
    take nor express another way (:func:`.releases.translate_inference_config`), by name."""
    try:
        releases.translate_inference_config(stored)
    except RetrofitError as exc:
        raise RetrofitError(f"checkpoint {path}: {exc}") from None


def release_checkpoint(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """``(file, arguments)``: the checkpoint file the installed tabpfn loads for ``path``, and
    the estimator arguments that carry the settings of inference-config fields it lacks.

    ``path`` itself with no arguments when the release knows every field; else a copy whose
    inference config holds only the fields it knows (:func:`.releases.translate_inference_config`),
    written once to ``cache_dir()/tabpfn-release/<digest>/`` under the checkpoint's own name,
    ``digest = sha256(checkpoint SHA-256 ‖ 0x00 ‖ the dropped fields' names)`` (the copy is
    the source less those fields)."""
    path = Path(path)
    checkpoint = load_checkpoint(path)
    kept, arguments = releases.translate_inference_config(checkpoint["inference_config"])
    dropped = sorted(set(checkpoint["inference_config"]) - set(kept))
    if not dropped:
        return path, {}
    digest = hashlib.sha256(f"{checkpoint_sha256(path)}\0{','.join(dropped)}".encode()
                            ).hexdigest()
    out = cache_dir() / "tabpfn-release" / digest[:32] / path.name
    if not out.exists():
        save_atomic({**checkpoint, "inference_config": kept}, out)
    return out, arguments


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint dict, loaded weights-only (cached by path, mtime and size; read-only)."""
    path = Path(path).resolve()
    try:
        regular_file(path, "checkpoint", "checkpoint", "pass a TabPFN .ckpt or .safetensors file")
    except FileRefused as exc:
        raise RetrofitError(str(exc)) from None
    stat = path.stat()
    return _load_cached(str(path), (stat.st_mtime_ns, stat.st_size))


@contextlib.contextmanager
def _no_parameter_init() -> Iterator[None]:
    """Skip the vendor's parameter init when tabpfn offers it (the checkpoint overwrites it)."""
    from tabpfn import model_loading
    skip = getattr(model_loading, "_skip_parameter_init", None)
    with (skip() if skip is not None else contextlib.nullcontext()):
        yield


def build_model(checkpoint: dict[str, Any]) -> tuple[torch.nn.Module, Any, Any]:
    """A fresh model of the checkpoint's version (``architecture_name``, as tabpfn picks the
    architecture; eval mode, strict load) with its architecture and inference configs.

    Always a new instance: never the model object tabpfn may share through its caches.
    """
    arch, config = _parse_config(checkpoint, "the checkpoint")
    with _no_parameter_init():
        model = arch.get_architecture(config)
    state = {k: v for k, v in checkpoint["state_dict"].items() if "criterion." not in k}
    model.load_state_dict(state, strict=True)
    model.eval()
    return releases.ensure_config(model, config), config, inference_config(checkpoint)


def inference_config(checkpoint: dict[str, Any]) -> Any:
    """The checkpoint's inference config as tabpfn's ``InferenceConfig``: the fields the
    installed release knows (the others are carried by estimator arguments or are the
    release's own behaviour, :func:`release_checkpoint`)."""
    from tabpfn.inference_config import InferenceConfig
    return InferenceConfig(**releases.translate_inference_config(
        checkpoint["inference_config"])[0])


def weights_label(checkpoint: dict[str, Any]) -> str:
    """Label of a checkpoint's weights: 'random weights (…)', its own label, or 'pretrained'."""
    meta = checkpoint.get("oretrofit") or {}
    if meta.get("weights") == "random":
        return f"random weights (size {meta.get('size')}, seed {meta.get('seed')})"
    if meta.get("weights"):
        return str(meta["weights"])
    return "pretrained"
