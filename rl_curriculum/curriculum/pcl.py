"""PCL: a value model predicts each prompt's success probability; train on the prompts near 0.5.

Every prompt i has a feature vector x_i (f32[D], carried by the pool as `PromptPool.features`, for
example the policy's mean-pooled last hidden state over the prompt tokens). A logistic head
predicts its success rate:
  v_i = sigmoid(x_i . w + b)

select: draw C = ceil(oversample * P) distinct candidates uniformly (no rollouts needed) and keep
  the P whose prediction is closest to 0.5 (smallest |v - 0.5|; ties to the earlier candidate,
  whose order is random).

update: `num_sgd_steps` steps of plain gradient descent on the mean squared error between the
  prediction and the observed group accuracy y_p = s_p / n_p of each row with n_p > 0 valid
  completions (raw correctness):
    L(w, b) = sum_p m_p (v_p - y_p)^2 / sum_p m_p,   m_p = [n_p > 0]
    (w, b) <- (w, b) - learning_rate * grad L
  For one row, dL/dw = 2 (v - y) v (1 - v) x and dL/db = 2 (v - y) v (1 - v).

The features live in the state (`PCLState.features`), so a trainer may refresh them as the policy
changes: `state = state._replace(features=new_features)` (same shape). Defaults (our choice):
oversample 4, learning_rate 0.1, one SGD step per update, w = 0 and b = 0 at start (every
prediction 0.5, so the first selection is uniform).

Reference: Gao et al. (2025), "Prompt Curriculum Learning for Efficient LLM Post-Training",
arXiv:2510.01135. The value model here is a logistic head on given features (our choice).
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection


class PCLState(NamedTuple):
  """State of `pcl`; N pool prompts, D feature width."""
  weights: jax.Array   # f32[D] head weights w
  bias: jax.Array      # f32[] head bias b
  features: jax.Array  # f32[N, D] per-prompt features x (the trainer may replace them)
  arms: jax.Array      # i32[N] arm of each pool prompt
  step: jax.Array      # i32[] updates applied so far


def predict(weights: jax.Array, bias: jax.Array, features: jax.Array) -> jax.Array:
  """f32[...] sigmoid(x . w + b) for features f32[..., D]."""
  return jax.nn.sigmoid(features @ weights + bias)


def value_loss(params: tuple[jax.Array, jax.Array], features: jax.Array, targets: jax.Array,
               mask: jax.Array) -> jax.Array:
  """f32[] masked mean of (sigmoid(x . w + b) - y)^2 over rows; features f32[P, D], y f32[P]."""
  weights, bias = params
  err = predict(weights, bias, features) - targets
  m = mask.astype(jnp.float32)
  return (m * err * err).sum() / jnp.maximum(m.sum(), 1.0)


def sgd_step(weights: jax.Array, bias: jax.Array, features: jax.Array, targets: jax.Array,
             mask: jax.Array, learning_rate: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One gradient step on `value_loss`; returns (weights, bias, loss before the step)."""
  loss, (gw, gb) = jax.value_and_grad(value_loss)((weights, bias), features, targets, mask)
  return weights - learning_rate * gw, bias - learning_rate * gb, loss


def _checked_features(features) -> np.ndarray:
  """features as f32[N, D], N, D >= 1, every entry finite."""
  feats = np.asarray(features, np.float32)
  if feats.ndim != 2 or feats.shape[0] < 1 or feats.shape[1] < 1:
    raise ValueError(f"features must be a non-empty f32[N, D] array, got shape {feats.shape}")
  if not np.all(np.isfinite(feats)):
    raise ValueError("features must be finite")
  return feats


def pcl(pool: checks.PoolOrNumArms, *, batch_size: int, oversample: float = 4.0,
        learning_rate: float = 0.1, num_sgd_steps: int = 1) -> Curriculum:
  """PCL curriculum (module docstring).

  The features are read from the pool given to `init` when it carries them, else from the pool
  given here; a number of arms stands in for the pool where none exists yet (a config check), and
  then `init` must get a pool with features.

  Args:
    pool: the PromptPool, with `features` f32[N, D] (finite, one row per prompt) set by
      `PromptPool.with_features`, or just its number of arms.
    batch_size: P, prompts per step.
    oversample: candidates per step C = ceil(oversample * P) >= P (default 4).
    learning_rate: SGD step size (default 0.1).
    num_sgd_steps: gradient steps per update (default 1).
  Returns:
    Curriculum with state `PCLState`. `update` metrics: `value_loss` (before the update),
    `predictions` f32[P] (before the update), `mean_abs_error` f32[].
  Raises:
    ValueError: on malformed features or an argument out of range; `init` raises if no features
      are given, if the pool size differs from the number of feature rows, or if the pool is
      smaller than C.
  """
  checks.num_arms(pool)
  built_features = None
  if isinstance(pool, PromptPool) and pool.features is not None:
    built_features = _checked_features(pool.features)
  p = int(batch_size)
  if p < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not oversample >= 1.0:
    raise ValueError(f"oversample must be >= 1, got {oversample}")
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
  if int(num_sgd_steps) < 1:
    raise ValueError(f"num_sgd_steps must be >= 1, got {num_sgd_steps}")
  num_candidates = int(math.ceil(oversample * p - 1e-9))

  def init(pool: PromptPool, key: jax.Array) -> PCLState:
    del key
    feats = pool.features if pool.features is not None else built_features
    if feats is None:
      raise ValueError("pcl needs per-prompt features: give init (or the constructor) a pool "
                       "built with PromptPool.with_features")
    if feats.ndim != 2 or feats.shape[1] < 1:
      raise ValueError(f"features must be a non-empty f32[N, D] array, got shape {feats.shape}")
    if pool.size != feats.shape[0]:
      raise ValueError(f"features has {feats.shape[0]} rows but the pool has {pool.size} prompts")
    if pool.size < num_candidates:
      raise ValueError(f"the pool ({pool.size} prompts) is smaller than the {num_candidates} "
                       "candidates select draws (oversample * batch_size)")
    return PCLState(weights=jnp.zeros((feats.shape[1],), jnp.float32),
                    bias=jnp.zeros((), jnp.float32), features=jnp.asarray(feats, jnp.float32),
                    arms=pool.arms, step=jnp.zeros((), jnp.int32))

  def select(state: PCLState, key: jax.Array) -> tuple[Selection, PCLState]:
    cand = prompt_level.sample_without_replacement(key, state.arms.shape[0], num_candidates)
    v = predict(state.weights, state.bias, state.features[cand])
    _, top = jax.lax.top_k(-jnp.abs(v - 0.5), p)
    ids = cand[top]
    return Selection(prompt_ids=ids, arms=state.arms[ids]), state

  def update(state: PCLState, feedback: Feedback) -> tuple[PCLState, dict]:
    n_row, s_row = prompt_stats.group_counts(feedback)
    mask = n_row > 0
    y = s_row.astype(jnp.float32) / jnp.maximum(n_row, 1).astype(jnp.float32)
    x = state.features[jnp.asarray(feedback.prompt_ids, jnp.int32)]
    before = predict(state.weights, state.bias, x)
    w, b, loss = sgd_step(state.weights, state.bias, x, y, mask, learning_rate)
    for _ in range(int(num_sgd_steps) - 1):
      w, b, _ = sgd_step(w, b, x, y, mask, learning_rate)
    m = mask.astype(jnp.float32)
    metrics = {
        "value_loss": loss,
        "predictions": before,
        "mean_abs_error": (m * jnp.abs(before - y)).sum() / jnp.maximum(m.sum(), 1.0),
    }
    return state._replace(weights=w, bias=b, step=state.step + 1), metrics

  return Curriculum(init=init, select=select, update=update)
