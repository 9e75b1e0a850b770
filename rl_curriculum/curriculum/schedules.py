"""Fixed schedules over arms ordered from easy to hard.

  easy_to_hard   all P slots on the current arm of `order`, advancing after N steps or once the
                 arm's running accuracy passes a threshold.
  hard_to_easy   the same, walking `order` backwards.
  linear_pacing  uniform over a prefix of `order` that grows over training.
  cyclical       uniform over a prefix of `order` that grows and shrinks periodically.
  mixed_replay   the progressive schedule plus replay of the arms before the current one.

`order` defaults to the pool's arms by increasing mean difficulty (`checks.arm_order`). The
schedules share one state, `ScheduleState`, and differ only in their arm probabilities.
"""

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import arm_sampling
from rl_curriculum.curriculum import arms as arms_lib
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum
from rl_curriculum.types import Feedback

__all__ = ["ScheduleState", "easy_to_hard", "hard_to_easy", "linear_pacing", "cyclical",
           "mixed_replay"]


class ScheduleState(NamedTuple):
  """State shared by the fixed schedules."""
  step: jax.Array         # i32[] updates so far
  stage: jax.Array        # i32[] position in `order` of the current arm (progressive schedules)
  stage_start: jax.Array  # i32[] step at which the current stage began
  accuracy: jax.Array     # f32[K] running accuracy (constant-rate average of correctness)
  seen: jax.Array         # bool[K] arm has been sampled at least once
  sampler: ArmSamplerState


def _allowed_prefix(order: jax.Array, m: jax.Array) -> jax.Array:
  """bool[K]: arm k is among the first m arms of `order`."""
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  return rank < m


def _schedule(num_arms, batch_size, order, probs_fn, steps_per_arm, accuracy_threshold,
              accuracy_rate) -> Curriculum:
  """Builds a schedule from `probs_fn(state, order) -> f32[K]` (before masking empty arms)."""
  order_np = order

  def init_state(sampler: ArmSamplerState) -> ScheduleState:
    zero = jnp.zeros((), jnp.int32)
    return ScheduleState(step=zero, stage=zero, stage_start=zero,
                         accuracy=jnp.zeros((num_arms,), jnp.float32),
                         seen=jnp.zeros((num_arms,), bool), sampler=sampler)

  def probs(state: ScheduleState) -> jax.Array:
    order_j = jnp.asarray(order_np)
    return arm_sampling.mask_empty_arms(probs_fn(state, order_j), state.sampler.sizes)

  def update_state(state: ScheduleState, feedback: Feedback) -> tuple[ScheduleState, dict]:
    acc_obs, n = arms_lib.arm_mean(feedback.correct.astype(jnp.float32), feedback.arms,
                                   arms_lib.valid_weights(feedback), num_arms)
    accuracy, seen = arms_lib.ema_update(state.accuracy, state.seen, acc_obs, n > 0,
                                         accuracy_rate)
    step = state.step + 1
    current = jnp.asarray(order_np)[state.stage]
    advance = jnp.zeros((), bool)
    if steps_per_arm is not None:
      advance = advance | (step - state.stage_start >= steps_per_arm)
    if accuracy_threshold is not None:
      advance = advance | (seen[current] & (accuracy[current] > accuracy_threshold))
    advance = advance & (state.stage < num_arms - 1)
    state = state._replace(step=step, stage=state.stage + advance.astype(jnp.int32),
                           stage_start=jnp.where(advance, step, state.stage_start),
                           accuracy=accuracy, seen=seen)
    return state, {"accuracy": accuracy, "stage": state.stage.astype(jnp.float32)}

  return arms_lib.category_curriculum(num_arms, batch_size, init_state, probs, update_state)


def _progress_args(steps_per_arm, accuracy_threshold, accuracy_rate):
  """The checked advance criteria (steps_per_arm, accuracy_threshold, accuracy_rate)."""
  if steps_per_arm is None and accuracy_threshold is None:
    raise ValueError("steps_per_arm and accuracy_threshold cannot both be None: the schedule "
                     "would never advance")
  if steps_per_arm is not None:
    steps_per_arm = checks.positive("steps_per_arm", steps_per_arm, integer=True)
  if accuracy_threshold is not None:
    accuracy_threshold = checks.unit("accuracy_threshold", accuracy_threshold)
  accuracy_rate = checks.unit("accuracy_rate", accuracy_rate, closed_low=False)
  return steps_per_arm, accuracy_threshold, accuracy_rate


def easy_to_hard(pool: checks.PoolOrNumArms, *, batch_size: int,
                 order: Optional[Sequence[int]] = None, steps_per_arm: Optional[int] = 50,
                 accuracy_threshold: Optional[float] = None,
                 accuracy_rate: float = 0.2) -> Curriculum:
  """Fixed easy-to-hard schedule: all P slots on the current arm, then the next one.

  The current arm is `order[stage]` (default: the pool's arms by increasing mean difficulty, or
  0, 1, ..., K-1 when built from a number of arms; see `checks.arm_order`). The stage
  advances after `steps_per_arm` updates on it (default 50, our choice; None disables), or when
  the arm's running accuracy exceeds `accuracy_threshold` (default None = off), whichever comes
  first; it stays on the last arm. Running accuracy: `acc <- acc + accuracy_rate (mean correct -
  acc)` per step that samples the arm (default rate 0.2), starting from the first observation.

  Raises:
    ValueError: bad order, both criteria None, or values out of range.
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  order = checks.arm_order(order, pool)
  args = _progress_args(steps_per_arm, accuracy_threshold, accuracy_rate)

  def probs_fn(state, order_j):
    return jax.nn.one_hot(order_j[state.stage], num_arms, dtype=jnp.float32)

  return _schedule(num_arms, batch_size, order, probs_fn, *args)


def hard_to_easy(pool: checks.PoolOrNumArms, *, batch_size: int,
                 order: Optional[Sequence[int]] = None, steps_per_arm: Optional[int] = 50,
                 accuracy_threshold: Optional[float] = None,
                 accuracy_rate: float = 0.2) -> Curriculum:
  """Reverse schedule: `easy_to_hard` walking `order` (default easiest first, as there)
  backwards."""
  num_arms = checks.num_arms(pool)
  order = checks.arm_order(order, pool)[::-1].copy()
  return easy_to_hard(num_arms, batch_size=batch_size, order=order, steps_per_arm=steps_per_arm,
                      accuracy_threshold=accuracy_threshold, accuracy_rate=accuracy_rate)


def linear_pacing(pool: checks.PoolOrNumArms, *, batch_size: int,
                  order: Optional[Sequence[int]] = None, steps_to_full: int = 100,
                  start_arms: int = 1) -> Curriculum:
  """Linear pacing: uniform over the first m(t) arms of `order`, a set that grows over training.

  m(t) = min(K, start_arms + floor((K - start_arms) t / steps_to_full)), t = updates so far;
  defaults steps_to_full = 100 and start_arms = 1 (our choices).

  Raises:
    ValueError: bad order, steps_to_full < 1, or start_arms outside [1, K].
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  order = checks.arm_order(order, pool)
  steps_to_full = checks.positive("steps_to_full", steps_to_full, integer=True)
  if not 1 <= start_arms <= num_arms:
    raise ValueError(f"start_arms must lie in [1, {num_arms}], got {start_arms!r}")

  def probs_fn(state, order_j):
    m = start_arms + ((num_arms - start_arms) * state.step) // steps_to_full
    m = jnp.minimum(m, num_arms)
    return _allowed_prefix(order_j, m).astype(jnp.float32)

  return _schedule(num_arms, batch_size, order, probs_fn, None, None, 1.0)


def cyclical(pool: checks.PoolOrNumArms, *, batch_size: int,
             order: Optional[Sequence[int]] = None, period: int = 100,
             start_arms: int = 1) -> Curriculum:
  """Cyclical pacing: uniform over the first m(t) arms of `order`, growing then shrinking.

  With phase = (t mod period) / period and a triangle wave tri = 1 - |2 phase - 1| (0 at the start
  of a period, 1 half-way), m(t) = start_arms + round((K - start_arms) tri). Defaults period = 100
  and start_arms = 1 (our choices).

  Raises:
    ValueError: bad order, period < 1, or start_arms outside [1, K].
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  order = checks.arm_order(order, pool)
  period = checks.positive("period", period, integer=True)
  if not 1 <= start_arms <= num_arms:
    raise ValueError(f"start_arms must lie in [1, {num_arms}], got {start_arms!r}")

  def probs_fn(state, order_j):
    phase = jnp.mod(state.step, period).astype(jnp.float32) / period
    tri = 1.0 - jnp.abs(2.0 * phase - 1.0)
    m = start_arms + jnp.round((num_arms - start_arms) * tri).astype(jnp.int32)
    return _allowed_prefix(order_j, m).astype(jnp.float32)

  return _schedule(num_arms, batch_size, order, probs_fn, None, None, 1.0)


def mixed_replay(pool: checks.PoolOrNumArms, *, batch_size: int,
                 order: Optional[Sequence[int]] = None, replay_prob: float = 0.2,
                 steps_per_arm: Optional[int] = 50, accuracy_threshold: Optional[float] = None,
                 accuracy_rate: float = 0.2) -> Curriculum:
  """Progressive schedule with replay: pi = (1 - rho) 1[current] + rho uniform(earlier arms).

  The current arm advances as in `easy_to_hard`; rho = `replay_prob` (default 0.2, our choice)
  of the mass goes uniformly to the arms before the current one in `order` (none at stage 0, when
  all mass stays on the current arm).

  Raises:
    ValueError: bad order, replay_prob outside [0, 1], or bad advance criteria.
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  order = checks.arm_order(order, pool)
  rho = checks.unit("replay_prob", replay_prob)
  args = _progress_args(steps_per_arm, accuracy_threshold, accuracy_rate)

  def probs_fn(state, order_j):
    current = jax.nn.one_hot(order_j[state.stage], num_arms, dtype=jnp.float32)
    earlier = _allowed_prefix(order_j, state.stage).astype(jnp.float32)
    n_earlier = jnp.sum(earlier)
    replay = earlier / jnp.maximum(n_earlier, 1.0)
    return jnp.where(n_earlier > 0, (1.0 - rho) * current + rho * replay, current)

  return _schedule(num_arms, batch_size, order, probs_fn, *args)
