"""A seeded synthetic regression prior for prior-fitting the demo TabPFN v3 host.

Each task draws correlated latent Gaussians, gives every column its own marginal, and
builds a target ``f(X)`` as a random mixture of three (or up to five) function families:

* a random MLP          f(x) = W_L σ(... σ(W_1 x_S + b_1) ...)      on a feature subset S,
* random Fourier feats  f(x) = Σ_j a_j cos(w_j·x + c_j),  w_j ~ N(0, diag(1/ℓ²)),
                        ℓ_i log-uniform (ARD: a large ℓ_i makes feature i irrelevant),
* sparse linear + interactions  f(x) = Σ_{i∈S} β_i x_i + Σ_{(i,k)} γ_ik x_i x_k  (0 to
                        ``linear_max_interactions`` random products),
* (optional 4th weight) random oblivious trees  f(x) = Σ_t c_t[Σ_l 2^l·1(x_{k_tl} > θ_tl)],
                        axis-aligned steps and interactions, thresholds at data points,
* (optional 5th weight) additive curves  f(x) = Σ_{i∈S} [β_i x_i + Σ_k a_ik cos(w_ik x_i + c_ik)],
                        w_ik ~ N(0, 1/ℓ_i²) with ℓ_i log-uniform like the Fourier family's: one
                        smooth curve per column and no interactions (a GAM's shape),

then ``y = f/sd(f) + σ ε`` with σ log-uniform. X and y are standardised with the
train rows' mean and standard deviation, as TabPFN sees them at inference.

Two options model how real columns relate to their causes; both are off by default, giving
the distribution the shipped demo host was trained on:

* ``zero_inflated``: the chance a column is censored, x = max(0, z − θ) (a mass at zero and a
  skewed tail, like an optional ingredient's amount);
* ``latent_inputs``: the chance that f reads a column's latent Gaussian z_i rather than the
  observed x_i, so the target depends on, e.g., the log of a log-normal column.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from scipy.special import ndtr

__all__ = ["PriorConfig", "TaskBatch", "sample_batch", "sample_task"]


@dataclasses.dataclass(frozen=True)
class PriorConfig:
    """Ranges of the synthetic tasks. Rows and features are drawn per batch."""

    min_rows: int = 32
    max_rows: int = 256
    min_features: int = 1
    max_features: int = 14
    min_train_fraction: float = 0.5
    max_train_fraction: float = 0.9
    noise_min: float = 0.01      # σ, relative to sd(f), drawn log-uniform
    noise_max: float = 1.0
    mlp_max_layers: int = 3
    mlp_max_width: int = 64
    fourier_features: int = 96
    length_scale_min: float = 0.3   # ARD length-scales, log-uniform, in latent sd units
    length_scale_max: float = 20.0
    family_weights: tuple[float, ...] = (0.4, 0.35, 0.25)  # mlp, fourier, linear[, trees[, additive]]
    tree_max_count: int = 8
    tree_max_depth: int = 4
    linear_max_interactions: int = 3  # pairwise products γ_ik x_i x_k in a linear term: 0..this many
    additive_cosines: int = 4      # cosines per column in an additive curve
    zero_inflated: float = 0.0     # chance a column is censored at a random threshold
    latent_inputs: float = 0.0     # chance f reads a column's latent z instead of its observed x

    def __post_init__(self) -> None:
        # a task needs 2 train rows and 1 test row (sample_batch), and each range must be non-empty
        if not 3 <= self.min_rows <= self.max_rows:
            raise ValueError(f"rows must satisfy 3 <= min_rows <= max_rows, got min_rows {self.min_rows}, "
                             f"max_rows {self.max_rows}; raise max_rows or lower min_rows")
        if not 1 <= self.min_features <= self.max_features:
            raise ValueError(f"features must satisfy 1 <= min_features <= max_features, got min_features "
                             f"{self.min_features}, max_features {self.max_features}")
        if len(self.family_weights) not in (3, 4, 5) or min(self.family_weights) < 0 or not any(self.family_weights):
            raise ValueError(f"family_weights {self.family_weights} must be 3 to 5 non-negative weights "
                             "(mlp, fourier, linear[, trees[, additive]]), not all zero")
        if self.additive_cosines < 0:
            raise ValueError(f"additive_cosines is a count >= 0, got {self.additive_cosines}")
        if self.linear_max_interactions < 0:
            raise ValueError(f"linear_max_interactions is a count >= 0, got {self.linear_max_interactions}")
        for name in ("zero_inflated", "latent_inputs"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} is a probability in [0, 1], got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class TaskBatch:
    """A batch of same-shape tasks in TabPFN's layout: x (R, B, F), y (R, B); first n_train rows train."""

    x: torch.Tensor       # (R, B, F)
    y: torch.Tensor       # (R, B)
    n_train: int


_ACTIVATIONS = (np.tanh, lambda z: np.maximum(z, 0.0), np.sin, lambda z: z / (1.0 + np.abs(z)),
                lambda z: np.exp(-z * z))


def _marginals(z: np.ndarray, cfg: PriorConfig, rng: np.random.Generator) -> np.ndarray:
    """Give each latent Gaussian column a marginal: normal, uniform, skewed, heavy-tailed, discrete,
    binary, or (with chance ``cfg.zero_inflated``) censored at zero."""
    x = np.empty_like(z)
    for i in range(z.shape[1]):
        col = z[:, i]
        if cfg.zero_inflated and rng.random() < cfg.zero_inflated:
            x[:, i] = np.maximum(0.0, col - rng.normal(scale=0.7))
            continue
        kind = rng.integers(6)
        if kind == 0:
            x[:, i] = col
        elif kind == 1:
            x[:, i] = ndtr(col)
        elif kind == 2:
            x[:, i] = np.exp(rng.uniform(0.3, 1.2) * col)
        elif kind == 3:
            x[:, i] = np.sinh(rng.uniform(0.5, 1.5) * col)
        elif kind == 4:
            levels = int(rng.integers(3, 11))
            x[:, i] = np.digitize(col, np.sort(rng.normal(size=levels - 1))).astype(float)
        else:
            x[:, i] = (col > rng.normal(scale=0.7)).astype(float)
    return x


def _standardise(a: np.ndarray, n_train: int) -> np.ndarray:
    """(a − mean_train) / sd_train column-wise, sd floored so constant columns stay finite."""
    mean = a[:n_train].mean(axis=0)
    sd = a[:n_train].std(axis=0)
    return (a - mean) / np.where(sd > 1e-8, sd, 1.0)


def _mlp(x: np.ndarray, cfg: PriorConfig, rng: np.random.Generator) -> np.ndarray:
    h = x
    for _ in range(int(rng.integers(1, cfg.mlp_max_layers + 1))):
        width = int(rng.integers(4, cfg.mlp_max_width + 1))
        w = rng.normal(size=(h.shape[1], width)) * rng.uniform(0.5, 2.0) / math.sqrt(h.shape[1])
        h = _ACTIVATIONS[rng.integers(len(_ACTIVATIONS))](h @ w + rng.normal(size=width))
    return h @ rng.normal(size=h.shape[1])


def _length_scales(n: int, cfg: PriorConfig, rng: np.random.Generator) -> np.ndarray:
    """(n,) ARD length-scales ℓ_i, log-uniform in [length_scale_min, length_scale_max]."""
    return np.exp(rng.uniform(math.log(cfg.length_scale_min), math.log(cfg.length_scale_max), size=n))


def _fourier(x: np.ndarray, cfg: PriorConfig, rng: np.random.Generator) -> np.ndarray:
    scales = _length_scales(x.shape[1], cfg, rng)
    w = rng.normal(size=(x.shape[1], cfg.fourier_features)) / scales[:, None]
    phase = rng.uniform(0.0, 2.0 * math.pi, size=cfg.fourier_features)
    return np.cos(x @ w + phase) @ rng.normal(size=cfg.fourier_features)


def _sparse_linear(x: np.ndarray, cfg: PriorConfig, rng: np.random.Generator) -> np.ndarray:
    n_features = x.shape[1]
    f = x @ (rng.normal(size=n_features) * (rng.random(n_features) < rng.uniform(0.3, 1.0)))
    for _ in range(int(rng.integers(0, cfg.linear_max_interactions + 1))):
        i, k = rng.integers(n_features, size=2)
        f = f + rng.normal() * x[:, i] * x[:, k]
    return f


def _trees(x: np.ndarray, cfg: PriorConfig, rng: np.random.Generator) -> np.ndarray:
    f = np.zeros(x.shape[0])
    for _ in range(int(rng.integers(1, cfg.tree_max_count + 1))):
        depth = int(rng.integers(1, cfg.tree_max_depth + 1))
        split = rng.integers(x.shape[1], size=depth)                             # (depth,) feature per level
        threshold = x[rng.integers(x.shape[0], size=depth), split]               # a data value per level
        leaf = (x[:, split] > threshold) @ (2 ** np.arange(depth))               # (n_rows,) leaf index
        f = f + rng.normal(size=2 ** depth)[leaf]
    return f


def _additive(x: np.ndarray, cfg: PriorConfig, rng: np.random.Generator) -> np.ndarray:
    n_features, k = x.shape[1], cfg.additive_cosines
    w = rng.normal(size=(n_features, k)) / _length_scales(n_features, cfg, rng)[:, None]  # (F, K)
    phase = rng.uniform(0.0, 2.0 * math.pi, size=(n_features, k))
    amplitude = rng.normal(size=(n_features, k))                                      # a_ik
    curves = (np.cos(x[:, :, None] * w + phase) * amplitude).sum(axis=2)              # (N, F)
    return x @ rng.normal(size=n_features) + curves.sum(axis=1)


def sample_task(rng: np.random.Generator, n_rows: int, n_features: int, n_train: int,
                cfg: PriorConfig) -> tuple[np.ndarray, np.ndarray]:
    """One task: X (n_rows, n_features) and y (n_rows,), both standardised on the first n_train rows."""
    mixing = rng.normal(size=(n_features, n_features)) * rng.uniform(0.0, 1.0)
    z = rng.normal(size=(n_rows, n_features)) @ (np.eye(n_features) + mixing)
    z = _standardise(z, n_train)
    x = _standardise(_marginals(z, cfg, rng), n_train)
    inputs = x
    if cfg.latent_inputs:
        inputs = np.where(rng.random(n_features) < cfg.latent_inputs, z, x)
    relevant = rng.random(n_features) < rng.uniform(0.5, 1.0)
    relevant[rng.integers(n_features)] = True
    xs = inputs[:, relevant]
    f = np.zeros(n_rows)
    weights = np.asarray(cfg.family_weights)
    families = rng.random(len(weights)) < weights
    if not families.any():
        families[rng.choice(len(weights), p=weights / weights.sum())] = True
    for family, on in enumerate(families):
        if not on:
            continue
        part = (_mlp, _fourier, _sparse_linear, _trees, _additive)[family](xs, cfg, rng)
        part = _standardise(part[:, None], n_train)[:, 0]
        f = f + rng.uniform(0.3, 1.0) * part
    f = _standardise(f[:, None], n_train)[:, 0]
    noise = math.exp(rng.uniform(math.log(cfg.noise_min), math.log(cfg.noise_max)))
    y = _standardise((f + noise * rng.normal(size=n_rows))[:, None], n_train)[:, 0]
    return x, y


def sample_batch(rng: np.random.Generator, batch_size: int, cfg: PriorConfig,
                 shape_rng: np.random.Generator | None = None) -> TaskBatch:
    """``batch_size`` tasks sharing one (rows, features, train split) drawn from ``cfg``'s ranges;
    the shape is drawn from ``shape_rng`` where given (data-parallel workers share one, so each
    step's workers run equal-sized tasks), else from ``rng``."""
    shape_rng = rng if shape_rng is None else shape_rng
    n_rows = int(shape_rng.integers(cfg.min_rows, cfg.max_rows + 1))
    n_features = int(shape_rng.integers(cfg.min_features, cfg.max_features + 1))
    n_train = int(round(n_rows * shape_rng.uniform(cfg.min_train_fraction, cfg.max_train_fraction)))
    n_train = min(max(n_train, 2), n_rows - 1)
    tasks = [sample_task(rng, n_rows, n_features, n_train, cfg) for _ in range(batch_size)]
    x = torch.tensor(np.stack([t[0] for t in tasks], axis=1), dtype=torch.float32)  # (R, B, F)
    y = torch.tensor(np.stack([t[1] for t in tasks], axis=1), dtype=torch.float32)  # (R, B)
    return TaskBatch(x=x, y=y, n_train=n_train)
