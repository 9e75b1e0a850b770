"""What the category-level curricula share: per-arm statistics of a feedback, and the builder.

A category-level curriculum keeps statistics per arm (K arms) and turns them into arm probabilities
`pi: f32[K]`. `category_curriculum` makes a `Curriculum(init, select, update)` from three pieces
that differ between methods (the initial state, pi, and the statistics update); the sampling of
prompts from pi (`arm_sampling`) and the checks of pool and feedback are the same for all.

Per-arm statistics (pure functions of arrays):
  arm_mean         weighted mean of per-completion values over each arm's completions.
  arm_counts       prompts of each arm in a batch.
  ema_update       constant-rate running average per arm.
  ring_push        per-arm ring buffers of the most recent values.
  ring_ages        age of each ring buffer entry.
  masked_row_mean  mean of each row over a mask.
"""

from typing import Callable, TypeVar

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import arm_sampling
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection

__all__ = ["category_curriculum", "valid_weights", "arm_mean", "arm_counts", "ema_update",
           "ring_push", "ring_ages", "masked_row_mean"]

State = TypeVar("State")  # a NamedTuple with a field `sampler: ArmSamplerState`


def category_curriculum(num_arms: int, batch_size: int,
                        init_state: Callable[[ArmSamplerState], State],
                        probs: Callable[[State], jax.Array],
                        update_state: Callable[[State, Feedback], tuple[State, dict]]
                        ) -> Curriculum:
  """A category-level Curriculum from its arm probabilities.

    init(pool, key):   checks that the pool has K arms, shuffles each arm's prompts with `key`
                       (`arm_sampling.init_arm_sampler`) and returns `init_state(sampler)`.
    select(state, key): draws the P arms i.i.d. from `probs(state)`, then prompts without
                       replacement within each arm (`arm_sampling.sample_selection`).
    update(state, fb): checks the feedback's shapes and applies `update_state`; its metrics gain
                       `probs` f32[K] (of the next select) and `arm_counts` f32[K] (prompts of each
                       arm in the feedback).

  Args:
    num_arms: K.
    batch_size: P, prompts per step.
    init_state: builds the curriculum's state around the arm sampler.
    probs: f32[K] arm probabilities of a state, summing to 1 over the arms that hold prompts.
    update_state: (state, feedback) -> (state, metrics) without the two metrics above.

  Returns:
    Curriculum(init, select, update).
  """

  def init(pool: PromptPool, key: jax.Array) -> State:
    checks.check_init_pool(pool, num_arms)
    return init_state(arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: State, key: jax.Array) -> tuple[Selection, State]:
    sel, sampler = arm_sampling.sample_selection(state.sampler, probs(state), key, batch_size)
    return sel, state._replace(sampler=sampler)

  def update(state: State, feedback: Feedback) -> tuple[State, dict]:
    checks.check_feedback(feedback)
    state, metrics = update_state(state, feedback)
    metrics = {"probs": probs(state), "arm_counts": arm_counts(feedback.arms, num_arms),
               **metrics}
    return state, metrics

  return Curriculum(init=init, select=select, update=update)


def valid_weights(feedback: Feedback) -> jax.Array:
  """f32[P, G] weight 1 on completion slots that exist."""
  if feedback.valid is None:
    return jnp.ones(feedback.rewards.shape, jnp.float32)
  return feedback.valid.astype(jnp.float32)


def arm_mean(values: jax.Array, arms: jax.Array, weights: jax.Array,
             num_arms: int) -> tuple[jax.Array, jax.Array]:
  """Weighted mean of per-completion values over the completions of each arm.

  mean[k] = sum_{p: arms[p] = k} sum_g w[p, g] x[p, g] / n[k],  n[k] = sum_{p: arms[p] = k} sum_g w

  Args:
    values: f32[P, G] per-completion values.
    arms: i32[P] arm of each prompt.
    weights: f32[P, G] non-negative weights (the validity mask).
    num_arms: K.

  Returns:
    (mean f32[K], 0 where n[k] = 0; n f32[K]).
  """
  if values.ndim != 2 or weights.shape != values.shape or arms.shape != values.shape[:1]:
    raise ValueError(f"expected values [P, G], weights [P, G], arms [P]; got {values.shape}, "
                     f"{weights.shape}, {arms.shape}")
  total = jax.ops.segment_sum(jnp.sum(values * weights, axis=1), arms, num_segments=num_arms)
  n = jax.ops.segment_sum(jnp.sum(weights, axis=1), arms, num_segments=num_arms)
  return jnp.where(n > 0, total / jnp.where(n > 0, n, 1.0), 0.0), n


def arm_counts(arms: jax.Array, num_arms: int) -> jax.Array:
  """f32[K] number of prompts of each arm."""
  return jax.ops.segment_sum(jnp.ones(arms.shape, jnp.float32), arms, num_segments=num_arms)


def ema_update(est: jax.Array, seen: jax.Array, obs: jax.Array, sampled: jax.Array,
               rate: float) -> tuple[jax.Array, jax.Array]:
  """Running average with constant rate; the first observation of an arm replaces the estimate.

  Args:
    est: f32[K] estimates; seen: bool[K] arm observed before; obs: f32[K] this step's values;
    sampled: bool[K] arm observed this step; rate: step size in (0, 1].

  Returns:
    (est f32[K], seen bool[K]) after the step; arms not sampled keep their estimate.
  """
  new = jnp.where(seen, est + rate * (obs - est), obs)
  return jnp.where(sampled, new, est), seen | sampled


def ring_push(buffer: jax.Array, head: jax.Array, filled: jax.Array, values: jax.Array,
              arms: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Appends values to per-arm ring buffers, oldest first overwritten.

  Args:
    buffer: f32[K, W] ring buffer per arm.
    head: i32[K] next write position of each arm.
    filled: i32[K] stored values of each arm (<= W).
    values: f32[M] new values, in order.
    arms: i32[M] arm of each value.
    keep: bool[M] which values to append.

  Returns:
    (buffer, head, filled) after appending. If an arm receives more than W values, only its last
    W are kept.
  """
  num_arms, width = buffer.shape
  onehot = (arms[:, None] == jnp.arange(num_arms)[None, :]) & keep[:, None]   # bool[M, K]
  csum = jnp.cumsum(onehot.astype(jnp.int32), axis=0)
  rank = jnp.take_along_axis(csum, arms[:, None], axis=1)[:, 0] - 1            # i32[M]
  n = csum[-1]                                                                 # i32[K]
  write = keep & (rank >= n[arms] - width)
  pos = jnp.mod(head[arms] + rank, width)
  rows = jnp.where(write, arms, num_arms)  # out-of-range rows are dropped
  buffer = buffer.at[rows, pos].set(values, mode="drop")
  head = jnp.mod(head + n, width).astype(jnp.int32)
  filled = jnp.minimum(filled + n, width).astype(jnp.int32)
  return buffer, head, filled


def ring_ages(head: jax.Array, width: int) -> jax.Array:
  """i32[K, W] age of each buffer entry: 0 = newest, W-1 = oldest."""
  idx = jnp.arange(width, dtype=jnp.int32)[None, :]
  return jnp.mod(head[:, None] - 1 - idx, width)


def masked_row_mean(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(mean f32[K] of each row of x f32[K, W] over mask bool[K, W], 0 for an empty row; count)."""
  n = jnp.sum(mask, axis=1)
  s = jnp.sum(jnp.where(mask, x, 0.0), axis=1)
  return jnp.where(n > 0, s / jnp.maximum(n, 1), 0.0), n
