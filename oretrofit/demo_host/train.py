"""Prior-fitting loop for the demo TabPFN v3 hosts: the regressor's bar-distribution NLL or the
classifier's cross-entropy, wall-clock budget, resumable.

Each step draws a batch of synthetic tasks (:mod:`oretrofit.demo_host.prior`; for the
classifier, their targets cut into classes by :mod:`oretrofit.demo_host.classes`), runs the v3
architecture on train+test rows and minimises, for the regressor, the bar-distribution negative
log-likelihood of the test targets under v3's spline bucket borders b_0 < … < b_K:

    NLL(y) = −log softmax(logits)_k + log(b_{k+1} − b_k),   k such that b_k ≤ y < b_{k+1},

and for the classifier (``task="classifier"``) the cross-entropy −log softmax(logits)_c of the
test rows' classes c. A classifier run can start from a trained regressor's weights
(``warm_start``, :mod:`oretrofit.demo_host.warm_start`).

The learning rate warms up linearly over ``warmup_steps`` and then follows a cosine in the
fraction of the wall-clock budget spent, so a run ends annealed whenever its budget ends. With
``budget_steps`` the horizon is a step count instead: the run takes exactly that many steps and
the schedule depends on the step alone, so the same configuration takes the same steps on a
faster or slower machine (a wall-clock budget gives a faster machine more steps).
Every ``save_every_s`` seconds the loop writes ``train_state.pt`` (weights, optimiser, step,
elapsed time, sampler state, loss log) and the tabpfn-format checkpoint; ``resume=True``
continues from ``train_state.pt`` exactly where it stopped. With ``workers`` > 1 the batch is
split over that many worker processes, one per core, whose gradients are averaged every step
(:mod:`oretrofit.demo_host.parallel`); the state keeps every worker's sampler.

A run can also start as a new *stage* of an earlier run (``init_from``): same architecture,
the earlier weights, a fresh optimiser and schedule, and its own prior and learning rate. The
new state keeps every earlier stage's configuration and loss log, so the checkpoint's step
count and wall time are the totals over all stages.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._files.atomic import atomic_file, make_folder
from .._files.reading import regular_file
from .._files.provenance import portable, sha256_file
from .classes import ClassConfig, sample_class_batch
from .inference import DEFAULT_PRESET, inference_config
from .parallel import SOLO, Workers, spawn, weights_digest
from .prior import PriorConfig, TaskBatch, sample_batch
from .warm_start import regressor_weights, warm_start

__all__ = ["HostConfig", "MAX_CLASSES", "TASKS", "TrainConfig", "bar_nll", "build_host", "build_optimizer",
           "checkpoint_name", "class_nll", "config_from_state", "demo_meta", "export_checkpoint", "load_state",
           "save_tabpfn_checkpoint", "spline_borders", "stage_record", "stage_totals", "train", "training_step"]

# progress and notices, not results: shown by the CLI (oretrofit.cli.output.show_progress)
_log = logging.getLogger(__name__)

CHECKPOINT_NAME = "tabpfn-v3-demo.ckpt"
TASKS = ("regressor", "classifier")
# classes the demo classifier reads out (tabpfn v3's default, as the random classifier's
# hosts.tabpfn.checkpoints.RANDOM_CLASSIFIER_CLASSES)
MAX_CLASSES = 10
STATE_NAME = "train_state.pt"
LOSS_LOG_NAME = "loss.csv"


@dataclasses.dataclass(frozen=True)
class HostConfig:
    """The small TabPFN v3 configuration the demo host is trained with (fields of TabPFNV3Config)."""

    embed_dim: int = 32
    nlayers: int = 3
    num_buckets: int = 100
    dist_embed_num_blocks: int = 1
    dist_embed_num_heads: int = 4
    dist_embed_num_inducing_points: int = 32
    feat_agg_num_blocks: int = 2
    feat_agg_num_heads: int = 4
    icl_num_heads: int = 4

    def tabpfn_config(self, task: str = "regressor") -> Any:
        """The TabPFNV3Config; a classifier's reads out :data:`MAX_CLASSES` classes."""
        from tabpfn.architectures.tabpfn_v3 import TabPFNV3Config

        classes = {"max_num_classes": MAX_CLASSES} if task == "classifier" else {}
        return TabPFNV3Config(**dataclasses.asdict(self), **classes)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run depends on; stored in its state so a resume uses the same."""

    budget_s: float = 7200.0
    seed: int = 0
    batch_size: int = 4
    # peak rate of a first stage: 7e-4 trained the shipped host (v9b); 1e-3 sits near the rate
    # where training fails (2e-3 learned nothing; results/demo-host/history/attempts.md)
    lr: float = 7e-4
    final_lr_fraction: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    save_every_s: float = 120.0
    log_every: int = 10
    max_steps: int | None = None
    # the schedule's horizon in steps instead of budget_s (which it then replaces): machine-independent
    budget_steps: int | None = None
    # data-parallel worker processes, one core each, splitting batch_size between them
    workers: int = 1
    # what the host learns: "regressor" (bar NLL) or "classifier" (cross-entropy on `classes`' tasks)
    task: str = "regressor"
    # a tabpfn v3 regressor checkpoint whose weights a fresh classifier run starts from
    warm_start: str | None = None
    host: HostConfig = dataclasses.field(default_factory=HostConfig)
    prior: PriorConfig = dataclasses.field(default_factory=PriorConfig)
    classes: ClassConfig = dataclasses.field(default_factory=ClassConfig)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.warm_start is not None and self.task != "classifier":
            raise ValueError("warm_start starts a classifier from a regressor's weights; give task='classifier' "
                             "(a regressor run continues another with init_from)")
        if self.classes.max_classes > MAX_CLASSES:
            raise ValueError(f"the demo classifier reads out {MAX_CLASSES} classes; max_classes "
                             f"{self.classes.max_classes} is more")
        if self.budget_steps is not None and self.budget_steps < 1:
            raise ValueError(f"budget_steps must be a positive step count, got {self.budget_steps}")
        if self.workers < 1 or self.batch_size % self.workers:
            raise ValueError(f"{self.workers} workers cannot split a batch of {self.batch_size} tasks; "
                             f"give a batch size that is a multiple of the worker count")


def spline_borders(num_buckets: int) -> torch.Tensor:
    """TabPFN v3's spline-based bucket borders (num_buckets + 1,), as the architecture defines them."""
    from tabpfn.architectures.tabpfn_v3 import _spline_based_regression_borders

    return _spline_based_regression_borders(num_buckets)


def bar_nll(logits: torch.Tensor, y: torch.Tensor, borders: torch.Tensor) -> torch.Tensor:
    """Mean bar-distribution NLL of y (...,) under logits (..., K) and borders (K+1,); y clamped to the support."""
    widths = borders[1:] - borders[:-1]                                          # (K,)
    bucket = torch.bucketize(y.clamp(borders[0], borders[-1]), borders, right=True) - 1
    bucket = bucket.clamp(0, widths.numel() - 1)
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return (torch.log(widths[bucket]) - log_p.gather(-1, bucket.unsqueeze(-1)).squeeze(-1)).mean()


def class_nll(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy −log softmax(logits)_y of classes y (...,) under logits (..., C)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -log_p.gather(-1, y.long().unsqueeze(-1)).squeeze(-1).mean()


def checkpoint_name(task: str) -> str:
    """The file name of a run's checkpoint: ``tabpfn-v3-demo.ckpt``, or ``tabpfn-v3-demo-classifier.ckpt``."""
    return CHECKPOINT_NAME if task == "regressor" else "tabpfn-v3-demo-classifier.ckpt"


def build_host(host: HostConfig, seed: int, task: str = "regressor") -> torch.nn.Module:
    """A freshly initialised v3 architecture of ``task``, seeded."""
    from tabpfn.architectures.tabpfn_v3 import get_architecture

    torch.manual_seed(seed)
    return get_architecture(host.tabpfn_config(task))


def save_tabpfn_checkpoint(model: torch.nn.Module, host: HostConfig, path: Path,
                           meta: dict[str, Any], inference: dict[str, Any] | None = None) -> Path:
    """Write ``model`` in tabpfn's checkpoint format with the ``inference`` config (a stored
    inference_config dict; default: the default preset's for a regressor, tabpfn's v2.5
    classification default for a classifier); ``meta`` becomes the ``oretrofit`` entry.
    The name is checked first, as for every checkpoint oretrofit writes (tabpfn reads 'v3' from it)."""
    from ..hosts.tabpfn.checkpoints import check_checkpoint_name, default_inference_config, save_atomic

    check_checkpoint_name(Path(path), "v3")
    task = "classifier" if model.config.is_classification else "regressor"
    if inference is None:
        inference = inference_config(DEFAULT_PRESET) if task == "regressor" else default_inference_config(task)
    checkpoint = {
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "config": dataclasses.asdict(host.tabpfn_config(task)),
        "architecture_name": "tabpfn_v3",
        "inference_config": inference,
        "oretrofit": meta,
    }
    return save_atomic(checkpoint, Path(path))


def demo_meta(state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``oretrofit`` entry for a run state: total steps and wall time over all
    stages, and ``seed``, the seed of the initial weights (the first stage's)."""
    steps, elapsed_s = stage_totals(state)
    stages = state.get("stages", [])
    first = (stages[0] if stages else state)["train_config"]
    seed, warm = first["seed"], first.get("warm_start")
    start = f"from {Path(warm).name}" if warm else f"initial seed {seed}"
    kind = "demo" if state["train_config"].get("task", "regressor") == "regressor" else "demo classifier"
    meta = {"weights": f"{kind} (prior-fitted, {steps} steps in {len(stages) + 1} stage(s), "
                       f"{elapsed_s / 60:.0f} min CPU, {start})",
            "steps": steps, "elapsed_s": round(elapsed_s, 1), "seed": seed, "stages": len(stages) + 1}
    if warm:
        meta["warm_start"] = {"path": portable(Path(warm)), "sha256": state.get("warm_start_sha256")}
    return meta


def stage_totals(state: dict[str, Any]) -> tuple[int, float]:
    """(steps, wall seconds) of a run state summed over its earlier stages and itself."""
    stages = state.get("stages", [])
    return (state["step"] + sum(s["steps"] for s in stages),
            state["elapsed_s"] + sum(s["elapsed_s"] for s in stages))


def load_state(run: Path, fix: str) -> dict[str, Any]:
    """``run/train_state.pt``, or a ValueError ending in ``fix`` when the folder holds none.

    The state is read with ``weights_only=True``: it holds only tensors, numbers, strings and
    containers of them, so a file that asks the unpickler for anything else (a ``__reduce__``
    payload, an arbitrary class) is refused before any of it runs.
    """
    state_path = regular_file(Path(run) / STATE_NAME, "the run state", "checkpoint", fix)
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{state_path} is not a run state oretrofit wrote (it asks to load objects "
                         f"other than tensors and plain data: {str(err).splitlines()[0]}); it was not "
                         "loaded. Use a run folder written by `oretrofit demo-host train`") from None
    except (RuntimeError, EOFError, OSError) as err:
        raise ValueError(f"{state_path} cannot be read as a run state ({err}); {fix}") from None
    if not isinstance(state, dict) or not {"model", "step", "train_config"} <= state.keys():
        raise ValueError(f"{state_path} is not a run state oretrofit wrote (no model, step and "
                         f"train_config entries); {fix}")
    return state


def stage_record(state: dict[str, Any]) -> dict[str, Any]:
    """What a run state contributes to the stage history: steps, wall time, configuration, loss log."""
    return {"steps": state["step"], "elapsed_s": state["elapsed_s"],
            "train_config": state["train_config"], "loss_log": state["loss_log"]}


def export_checkpoint(run: Path, dest: Path, inference: str | None = None) -> Path:
    """Write the weights in ``run/train_state.pt`` as a standalone tabpfn checkpoint at ``dest``
    (no optimiser), carrying the ``inference`` preset's config (default :data:`DEFAULT_PRESET`);
    a classifier carries tabpfn's v2.5 classification default (the presets are regression configs)."""
    state = load_state(run, "point --run at a `demo-host train` output folder")
    cfg = config_from_state(state["train_config"])
    model = build_host(cfg.host, cfg.seed, cfg.task)
    model.load_state_dict(state["model"])
    if cfg.task == "classifier":
        if inference is not None:
            raise ValueError(f"--inference {inference}: the presets are regression configs and this run is a "
                             "classifier, which carries tabpfn's classification default; drop --inference")
        return save_tabpfn_checkpoint(model, cfg.host, Path(dest), {**demo_meta(state), "inference": "tabpfn"})
    inference = inference or DEFAULT_PRESET
    return save_tabpfn_checkpoint(model, cfg.host, Path(dest), {**demo_meta(state), "inference": inference},
                                  inference_config(inference))


def _budget_spent(cfg: TrainConfig, step: int, elapsed_s: float) -> float:
    """Fraction of the run's budget spent: of ``budget_steps`` when set, else of the wall-clock
    ``budget_s``; the run stops at 1 and the schedule anneals over it."""
    if cfg.budget_steps:
        return step / cfg.budget_steps
    return elapsed_s / cfg.budget_s if cfg.budget_s > 0 else 1.0


def _lr(cfg: TrainConfig, step: int, elapsed_s: float) -> float:
    """Linear warm-up, then cosine from lr to final_lr_fraction·lr over the budget's spent fraction."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = min(_budget_spent(cfg, step, elapsed_s), 1.0)
    floor = cfg.final_lr_fraction
    return cfg.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * frac)))


def _save_state(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, cfg: TrainConfig,
                step: int, elapsed_s: float, rngs: list[tuple[Any, torch.Tensor]], shape_rng: Any,
                log: list[tuple], stages: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the run state (``rngs``: each worker's numpy and torch sampler states, rank 0's first;
    ``shape_rng``: the workers' shared shape sampler, None for one worker), the checkpoint and the
    loss log; return the state."""
    (rng, torch_rng), *worker_rngs = rngs
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
             "elapsed_s": elapsed_s, "rng": rng, "torch_rng": torch_rng, "worker_rngs": worker_rngs,
             "shape_rng": shape_rng, "loss_log": log, "train_config": dataclasses.asdict(cfg), "stages": stages}
    if cfg.warm_start:
        state["warm_start_sha256"] = sha256_file(cfg.warm_start)
    with atomic_file(out / STATE_NAME) as fh:
        torch.save(state, fh)
    save_tabpfn_checkpoint(model, cfg.host, out / checkpoint_name(cfg.task), demo_meta(state))
    with atomic_file(out / LOSS_LOG_NAME, "w") as fh:
        fh.write("step,elapsed_s,lr,loss\n")
        fh.writelines(f"{s},{t:.1f},{lr:.3e},{loss:.5f}\n" for s, t, lr, loss in log)
    return state


def config_from_state(stored: dict[str, Any]) -> TrainConfig:
    """The TrainConfig a run state stores as a dict; a field the run predates takes its default
    (new fields default to the earlier behaviour)."""
    raw = dict(stored)
    prior, host, classes = dict(raw.pop("prior")), raw.pop("host"), raw.pop("classes", {})
    prior["family_weights"] = tuple(prior["family_weights"])
    return TrainConfig(**raw, host=HostConfig(**host), prior=PriorConfig(**prior), classes=ClassConfig(**classes))


def _earlier_stages(init_from: Path, cfg: TrainConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The stage records and final weights of the run at ``init_from``, checked against ``cfg.host``."""
    prev = load_state(init_from, "point --init-from at a `demo-host train` output folder")
    prev_cfg = config_from_state(prev["train_config"])
    if prev_cfg.host != cfg.host or prev_cfg.task != cfg.task:
        raise ValueError(f"--init-from {init_from} was trained as a {prev_cfg.task} with {prev_cfg.host}, this "
                         f"run asks for a {cfg.task} with {cfg.host}; a new stage keeps the task and architecture "
                         "(a classifier starts from a regressor with --warm-start)")
    return [*prev.get("stages", []), {"run": portable(Path(init_from)), **stage_record(prev)}], prev["model"]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The run's optimiser: AdamW at ``cfg.lr`` (the loop sets each step's rate) and ``cfg.weight_decay``."""
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def training_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: TaskBatch,
                  borders: torch.Tensor, grad_clip: float, workers: Workers = SOLO) -> float:
    """One optimiser step on a prior batch: the loss of the test rows given the train rows (bar
    NLL under ``borders`` for a regressor, cross-entropy for a classifier), its gradient averaged
    over the ``workers``; returns the loss (the mean over workers)."""
    logits = model(batch.x, batch.y[: batch.n_train])                            # (R_test, B, K or C)
    y_test = batch.y[batch.n_train:]
    loss = class_nll(logits, y_test) if model.config.is_classification else bar_nll(logits, y_test, borders)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    mean_loss = workers.average_gradients(model, loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return mean_loss


def train(out: Path, cfg: TrainConfig, *, resume: bool = False, init_from: Path | None = None,
          progress: bool = True) -> dict[str, Any]:
    """Prior-fit the host until its budget (``cfg.budget_steps`` steps, else ``cfg.budget_s`` of
    wall-clock) or ``max_steps`` is spent, on ``cfg.workers`` processes; return a summary.

    With ``resume``, ``cfg`` is replaced by the configuration stored in ``out/train_state.pt``
    except for ``budget_s``, ``budget_steps`` and ``max_steps``, which may be extended (the worker
    count stays the stored one: it decides which tasks are drawn). With ``init_from`` (a run
    folder), training starts from that run's weights as a new stage with ``cfg``'s prior,
    learning rate and budget and a fresh optimiser.
    """
    out = Path(out)
    if resume and init_from is not None:
        raise ValueError("--resume continues this run and --init-from starts a new stage; give one of them")
    make_folder(out, f"--out {out}")
    state, stages, weights = None, [], None
    if resume:
        state = load_state(out, "drop --resume to start fresh")
        stored = config_from_state(state["train_config"])
        cfg = dataclasses.replace(stored, budget_s=cfg.budget_s, budget_steps=cfg.budget_steps,
                                  max_steps=cfg.max_steps)
        stages = state.get("stages", [])
    if init_from is not None:
        stages, weights = _earlier_stages(Path(init_from), cfg)
    if cfg.workers == 1:
        final = _fit(SOLO, out, cfg, state, stages, weights, progress)
    else:
        spawn(cfg.workers, _fit, out, cfg, state, stages, weights, progress)
        final = load_state(out, "a worker stopped before saving")
    log = final["loss_log"]
    return {"steps": final["step"], "elapsed_s": final["elapsed_s"], "final_nll": log[-1][3] if log else None,
            "checkpoint": str(out / checkpoint_name(cfg.task)), "train_config": final["train_config"]}


def _fit(workers: Workers, out: Path, cfg: TrainConfig, state: dict[str, Any] | None,
         stages: list[dict[str, Any]], weights: dict[str, torch.Tensor] | None,
         progress: bool) -> dict[str, Any] | None:
    """The training loop of one worker (all of it with ``SOLO``); rank 0 returns the final state."""
    model = build_host(cfg.host, cfg.seed, cfg.task)
    if weights is not None:
        model.load_state_dict(weights)
    elif cfg.warm_start is not None and state is None:
        warm_start(model, regressor_weights(Path(cfg.warm_start)))
    opt = build_optimizer(model, cfg)
    rng, shape_rng = workers.samplers(cfg.seed)
    step, elapsed0, log = 0, 0.0, []
    if state is not None:
        model.load_state_dict(state["model"])
        # a copy: tensors handed to worker processes live in shared memory, and AdamW updates its
        # moments in place, so without one the workers would all step the same moment tensors
        opt.load_state_dict(copy.deepcopy(state["optimizer"]))
        rng_state, torch_rng = [(state["rng"], state["torch_rng"]), *state.get("worker_rngs", [])][workers.rank]
        rng.bit_generator.state = rng_state
        if shape_rng is not None:
            shape_rng.bit_generator.state = state["shape_rng"]
        torch.set_rng_state(torch_rng)
        step, elapsed0, log = state["step"], state["elapsed_s"], [tuple(r) for r in state["loss_log"]]
    borders = spline_borders(cfg.host.num_buckets)
    tasks = cfg.batch_size // cfg.workers
    talk = progress and workers.rank == 0

    def save(elapsed: float) -> dict[str, Any] | None:
        # every worker's sampler goes into the state; equal weight digests show the workers still agree
        gathered = workers.gather((rng.bit_generator.state, torch.get_rng_state(), weights_digest(model)))
        if len({digest for *_, digest in gathered}) > 1:
            raise RuntimeError(f"the workers' weights differ at step {step}; the run folder keeps the last "
                               "save where they agreed, resume from it")
        if workers.rank:
            return None
        return _save_state(out, model, opt, cfg, step, elapsed, [g[:2] for g in gathered],
                           None if shape_rng is None else shape_rng.bit_generator.state, log, stages)

    model.train()
    start = time.monotonic()
    last_save = elapsed0
    window: list[float] = []
    budget = f"{cfg.budget_steps} steps" if cfg.budget_steps else f"{cfg.budget_s:.0f}s"
    while True:
        # one clock for all workers: the stop, the rate and the save all read rank 0's
        elapsed = workers.from_rank0(elapsed0 + time.monotonic() - start)
        at_max_steps = cfg.max_steps is not None and step >= cfg.max_steps
        if _budget_spent(cfg, step, elapsed) >= 1.0 or at_max_steps:
            break
        if elapsed - last_save >= cfg.save_every_s:
            save(elapsed)
            last_save = elapsed
        lr = _lr(cfg, step, elapsed)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = (sample_class_batch(rng, tasks, cfg.prior, cfg.classes, shape_rng) if cfg.task == "classifier"
                 else sample_batch(rng, tasks, cfg.prior, shape_rng))
        window.append(training_step(model, opt, batch, borders, cfg.grad_clip, workers))
        step += 1
        if step % cfg.log_every == 0:
            log.append((step, elapsed, lr, float(np.mean(window))))
            window.clear()
            if talk:
                _log.info(f"step {step}  {elapsed:7.0f}s  budget {budget}  lr {lr:.2e}  "
                          f"nll {log[-1][3]:.4f}")
    elapsed = workers.from_rank0(elapsed0 + time.monotonic() - start)
    if window:  # the steps since the last log line, so the final NLL is always logged
        log.append((step, elapsed, lr, float(np.mean(window))))
    return save(elapsed)
