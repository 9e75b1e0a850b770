"""Teacher algorithms over arms: absolute learning progress, and mastering rate.

  alp_teacher     samples arms in proportion to the absolute change of their success rate between
                  an older and a recent window of steps (the bin version of ALP-GMM).
  mastering_rate  samples the arms whose prerequisites are learned and that are not yet mastered.
"""

from typing import Iterable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.curriculum import arm_sampling
from rl_curriculum.curriculum import arms as arms_lib
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum
from rl_curriculum.types import Feedback

__all__ = ["ALPState", "alp_teacher", "alp_values", "MasteringState", "mastering_rate"]


class ALPState(NamedTuple):
  """State of `alp_teacher`: per-arm ring buffers of the last 2W steps that sampled the arm."""
  sums: jax.Array     # f32[K, 2W] correct completions of arm k in each stored step
  counts: jax.Array   # f32[K, 2W] valid completions of arm k in each stored step (> 0 if stored)
  filled: jax.Array   # i32[K] steps stored (<= 2W)
  head: jax.Array     # i32[K] next write position
  sampler: ArmSamplerState


def alp_values(sums: jax.Array, counts: jax.Array, filled: jax.Array,
               head: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Absolute learning progress per arm from ring buffers of the arm's last 2W steps.

  Entry j of arm k holds one step: s[k, j] correct out of n[k, j] valid completions. With R the W
  newest stored steps of arm k and O the (up to) W stored before them,
    recent[k] = sum_{j in R} s[k, j] / sum_{j in R} n[k, j]   (0 while R is empty),
    older[k]  = sum_{j in O} s[k, j] / sum_{j in O} n[k, j]   (0 while O is empty),
    ALP[k]    = |recent[k] - older[k]|, and 0 while O is empty.
  The means are weighted by completions, so a step with few valid completions counts little.

  Args:
    sums: f32[K, 2W]; counts: f32[K, 2W]; filled: i32[K]; head: i32[K] (see `ALPState`).

  Returns:
    (alp f32[K], recent f32[K], older f32[K]).
  """
  width2 = sums.shape[1]
  w = width2 // 2
  age = arms_lib.ring_ages(head, width2)
  stored = age < filled[:, None]

  def window_mean(mask):
    n = jnp.sum(jnp.where(mask, counts, 0.0), axis=1)
    s = jnp.sum(jnp.where(mask, sums, 0.0), axis=1)
    return jnp.where(n > 0, s / jnp.where(n > 0, n, 1.0), 0.0), n

  recent, _ = window_mean(stored & (age < w))
  older, n_old = window_mean(stored & (age >= w))
  alp = jnp.where(n_old > 0, jnp.abs(recent - older), 0.0)
  return alp, recent, older


def alp_teacher(pool: checks.PoolOrNumArms, *, batch_size: int, window: int = 8,
                epsilon: float = 0.2) -> Curriculum:
  """Absolute-learning-progress teacher over arms (the bin version of ALP-GMM).

  Windows count STEPS in which the arm was sampled, not completions: every update pushes, for
  each arm with at least one valid completion, one entry (correct completions, valid
  completions) of that step. ALP = |success rate over the arm's W newest steps - success rate
  over the W steps before| (`alp_values`), so progress is measured between updates of the policy
  and not between two halves of one batch (a window of W completions would fill both halves from
  a single step of P x G outcomes). Arms not sampled in a step keep their windows.

  pi = epsilon / K' + (1 - epsilon) ALP / sum ALP over the K' non-empty arms, and uniform over
  them while every ALP is 0 (in particular until some arm has been sampled in W + 1 steps).
  Defaults W = 8 steps and epsilon = 0.2 are our choices: the progress between the two windows
  grows with W while their sampling noise shrinks as 1 / sqrt(W) (a step gives a sampled arm tens
  to hundreds of outcomes), and ALP still reacts within 2W = 16 steps of the arm. Success is read
  from `Feedback.correct`, never from the shaped reward.

  Reference: Portelas et al. (2019), "Teacher algorithms for curriculum learning of Deep RL in
  continuously parameterized environments", arXiv:1910.07224.

  Args:
    pool: the PromptPool (or just its number of arms K).
    batch_size: P.
    window: W, steps per window, default 8.
    epsilon: share of uniform exploration, default 0.2.

  Returns:
    Curriculum with `ALPState`; metrics: probs, alp, recent, older, arm_counts.

  Raises:
    ValueError: window < 1 or epsilon outside [0, 1].
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  width = checks.positive("window", window, integer=True)
  epsilon = checks.unit("epsilon", epsilon)

  def init_state(sampler: ArmSamplerState) -> ALPState:
    zeros = jnp.zeros((num_arms,), jnp.int32)
    ring = jnp.zeros((num_arms, 2 * width), jnp.float32)
    return ALPState(sums=ring, counts=ring, filled=zeros, head=zeros, sampler=sampler)

  def probs(state: ALPState) -> jax.Array:
    alp, _, _ = alp_values(state.sums, state.counts, state.filled, state.head)
    nonempty = state.sampler.sizes > 0
    unif = nonempty.astype(jnp.float32) / jnp.maximum(jnp.sum(nonempty), 1)
    alp = jnp.where(nonempty, alp, 0.0)
    total = jnp.sum(alp)
    greedy = jnp.where(total > 0, alp / jnp.where(total > 0, total, 1.0), unif)
    return epsilon * unif + (1.0 - epsilon) * greedy

  def update_state(state: ALPState, feedback: Feedback) -> tuple[ALPState, dict]:
    valid = arms_lib.valid_weights(feedback)
    correct = jnp.sum(feedback.correct.astype(jnp.float32) * valid, axis=1)      # f32[P]
    s = jax.ops.segment_sum(correct, feedback.arms, num_segments=num_arms)      # f32[K]
    n = jax.ops.segment_sum(jnp.sum(valid, axis=1), feedback.arms, num_segments=num_arms)
    sampled = n > 0                                                               # bool[K]
    # Arms without a valid completion push nothing: windows count the steps that sampled them.
    write = sampled[:, None] & (jnp.arange(2 * width)[None, :] == state.head[:, None])
    sums = jnp.where(write, s[:, None], state.sums)
    counts = jnp.where(write, n[:, None], state.counts)
    step = sampled.astype(jnp.int32)
    head = jnp.mod(state.head + step, 2 * width).astype(jnp.int32)
    filled = jnp.minimum(state.filled + step, 2 * width).astype(jnp.int32)
    state = state._replace(sums=sums, counts=counts, filled=filled, head=head)
    alp, recent, older = alp_values(sums, counts, filled, head)
    return state, {"alp": alp, "recent": recent, "older": older}

  return arms_lib.category_curriculum(num_arms, batch_size, init_state, probs, update_state)


class MasteringState(NamedTuple):
  """State of `mastering_rate`."""
  success: jax.Array  # f32[K] running success rate of each arm (0 before its first sample)
  seen: jax.Array     # bool[K] arm has been sampled at least once
  step: jax.Array     # i32[] updates so far
  sampler: ArmSamplerState


def _prerequisite_matrix(prerequisites: Optional[Iterable[tuple[int, int]]], order: np.ndarray,
                         num_arms: int) -> np.ndarray:
  """bool[K, K]: m[j, k] = arm j is a prerequisite of arm k."""
  m = np.zeros((num_arms, num_arms), bool)
  if prerequisites is None:
    for before, after in zip(order[:-1], order[1:]):
      m[before, after] = True
    return m
  for pair in prerequisites:
    if len(pair) != 2:
      raise ValueError(f"prerequisites must be (before, after) pairs, got {pair!r}")
    before, after = int(pair[0]), int(pair[1])
    if not (0 <= before < num_arms and 0 <= after < num_arms) or before == after:
      raise ValueError(f"prerequisites must be pairs of distinct arms in [0, {num_arms}), got "
                       f"{pair!r}")
    m[before, after] = True
  return m


def mastering_rate(pool: checks.PoolOrNumArms, *, batch_size: int,
                   order: Optional[Sequence[int]] = None,
                   prerequisites: Optional[Iterable[tuple[int, int]]] = None,
                   unlock_threshold: float = 0.5, mastery_threshold: float = 0.9,
                   rate: float = 0.2) -> Curriculum:
  """Mastering-rate teacher: practise the arms that are available and not yet mastered.

  Arm k is available when every prerequisite j of k has running success >= unlock_threshold
  (default 0.5); it is mastered when its own running success >= mastery_threshold (default 0.9).
  pi is uniform over available, non-mastered, non-empty arms (over available arms once all of
  them are mastered). Prerequisites are (before, after) pairs; default a chain along `order`
  (easiest first, the default `order` of `easy_to_hard`). Running success: `s <- s + rate (mean
  correct - s)` per step that samples the arm (default rate 0.2), starting from the first
  observation. Defaults are ours.

  Reference: Willems et al. (2020), "Mastering Rate based Curriculum Learning", arXiv:2008.06456.

  Args:
    pool: the PromptPool (or just its number of arms K).
    batch_size: P.
    order: arms easiest first (default `checks.arm_order`), for the default prerequisites.
    prerequisites: (before, after) pairs of arms; default the chain along `order`.
    unlock_threshold, mastery_threshold: success rates in [0, 1].
    rate: step size of the running success, in (0, 1].

  Returns:
    Curriculum with `MasteringState`; metrics: probs, success, available, mastered, arm_counts.

  Raises:
    ValueError: bad order or prerequisites, thresholds or rate outside [0, 1].
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  order = checks.arm_order(order, pool)
  prereq_np = _prerequisite_matrix(prerequisites, order, num_arms)
  unlock = checks.unit("unlock_threshold", unlock_threshold)
  mastery = checks.unit("mastery_threshold", mastery_threshold)
  rate = checks.unit("rate", rate, closed_low=False)

  def sets_of(state: MasteringState) -> tuple[jax.Array, jax.Array]:
    prereq = jnp.asarray(prereq_np)
    ok = state.success[:, None] >= unlock                        # bool[K, 1] over j
    available = jnp.all(~prereq | ok, axis=0)                     # bool[K] over k
    mastered = state.success >= mastery
    return available, mastered

  def init_state(sampler: ArmSamplerState) -> MasteringState:
    return MasteringState(success=jnp.zeros((num_arms,), jnp.float32),
                          seen=jnp.zeros((num_arms,), bool), step=jnp.zeros((), jnp.int32),
                          sampler=sampler)

  def probs(state: MasteringState) -> jax.Array:
    available, mastered = sets_of(state)
    nonempty = state.sampler.sizes > 0
    cand = available & ~mastered & nonempty
    fallback = available & nonempty
    w = jnp.where(jnp.any(cand), cand, fallback).astype(jnp.float32)
    return arm_sampling.mask_empty_arms(w, state.sampler.sizes)

  def update_state(state: MasteringState, feedback: Feedback) -> tuple[MasteringState, dict]:
    obs, n = arms_lib.arm_mean(feedback.correct.astype(jnp.float32), feedback.arms,
                               arms_lib.valid_weights(feedback), num_arms)
    success, seen = arms_lib.ema_update(state.success, state.seen, obs, n > 0, rate)
    state = state._replace(success=success, seen=seen, step=state.step + 1)
    available, mastered = sets_of(state)
    metrics = {"success": success, "available": available.astype(jnp.float32),
               "mastered": mastered.astype(jnp.float32)}
    return state, metrics

  return arms_lib.category_curriculum(num_arms, batch_size, init_state, probs, update_state)
