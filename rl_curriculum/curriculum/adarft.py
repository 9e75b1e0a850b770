"""AdaRFT: a target difficulty that follows the learner, and the prompts closest to it.

Every prompt carries a scalar difficulty d (`PromptPool.difficulty`). The state keeps a target T.

update, after a step with mean success R (mean of the valid raw correctness by default):
  T <- clip(T + eta * tanh(a * (R - beta)), d_min, d_max)
  beta is the target success rate (default 0.5). A step without any valid completion
  leaves T unchanged.

select: the P prompts with the smallest |d - T|; exact ties are broken uniformly at random (a
  random secondary sort key). With `no_repeat=True` the prompts of the previous selection are
  ranked after all others, so they come back only when the pool has nothing else.

Defaults (our choice where the paper leaves them open): d_min, d_max = the pool's smallest and
largest difficulty; initial T = d_min (start easy); eta = 0.1 * (d_max - d_min); a = 2.

Reference: Shi et al. (2025), "Efficient Reinforcement Finetuning via Adaptive Curriculum
Learning", arXiv:2504.05520.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection

REWARD_SOURCES = ("correct", "reward")


class AdaRFTState(NamedTuple):
  """State of `adarft`; N pool prompts, P batch size."""
  target: jax.Array      # f32[] target difficulty T
  d_min: jax.Array       # f32[] lower clip of T
  d_max: jax.Array       # f32[] upper clip of T
  eta: jax.Array         # f32[] step size of T (difficulty units)
  difficulty: jax.Array  # f32[N] difficulty of each pool prompt
  arms: jax.Array        # i32[N] arm of each pool prompt
  previous: jax.Array    # i32[P] prompt ids of the last selection (-1 before the first)
  step: jax.Array        # i32[] updates applied so far


def target_update(target: jax.Array, mean_reward: jax.Array, *, eta: jax.Array, sensitivity: float,
                  beta: float, d_min: jax.Array, d_max: jax.Array) -> jax.Array:
  """f32[] clip(T + eta * tanh(sensitivity * (R - beta)), d_min, d_max)."""
  new = target + eta * jnp.tanh(sensitivity * (mean_reward - beta))
  return jnp.clip(new, d_min, d_max).astype(jnp.float32)


def closest_to_target(key: jax.Array, difficulty: jax.Array, target: jax.Array, k: int,
                      exclude: Optional[jax.Array] = None) -> jax.Array:
  """i32[k] the k prompts with the smallest |d - T|, random tie-breaking, excluded ones last."""
  dist = jnp.abs(difficulty - target)
  tie = jax.random.uniform(key, difficulty.shape)
  keys = (tie, dist) if exclude is None else (tie, dist, exclude.astype(jnp.int32))
  return jnp.lexsort(keys)[:k].astype(jnp.int32)


def adarft(pool: checks.PoolOrNumArms, *, batch_size: int, eta: Optional[float] = None,
           sensitivity: float = 2.0, beta: float = 0.5, d_min: Optional[float] = None,
           d_max: Optional[float] = None, initial_target: Optional[float] = None,
           no_repeat: bool = False, reward_source: str = "correct") -> Curriculum:
  """AdaRFT curriculum (module docstring).

  Args:
    pool: the PromptPool (or just its number of arms); the state is sized in `init` from the
      pool given there.
    batch_size: P, prompts per step.
    eta: step size of T in difficulty units (default 0.1 * (d_max - d_min)).
    sensitivity: a in tanh(a (R - beta)) (default 2).
    beta: target success rate in [0, 1] (default 0.5).
    d_min, d_max: range of T (default the pool's smallest / largest difficulty).
    initial_target: first T (default d_min).
    no_repeat: rank the previous selection last (default False).
    reward_source: R from "correct" (default; raw success rate, what beta is compared with) or
      "reward" (mean shaped reward).
  Returns:
    Curriculum with state `AdaRFTState`. `update` metrics: `target` (after), `mean_reward`.
  Raises:
    ValueError: on an argument out of range; `init` raises if the pool is smaller than P
      (or 2 P with no_repeat) or the difficulty range is empty.
  """
  checks.num_arms(pool)  # the pool's arrays are read in init
  p = int(batch_size)
  if p < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if eta is not None and not eta >= 0:
    raise ValueError(f"eta must be >= 0, got {eta}")
  if not sensitivity > 0:
    raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
  if not 0.0 <= beta <= 1.0:
    raise ValueError(f"beta must lie in [0, 1], got {beta}")
  if d_min is not None and d_max is not None and not d_min <= d_max:
    raise ValueError(f"need d_min <= d_max, got d_min={d_min}, d_max={d_max}")
  if reward_source not in REWARD_SOURCES:
    raise ValueError(f"reward_source must be one of {REWARD_SOURCES}, got {reward_source!r}")

  def init(pool: PromptPool, key: jax.Array) -> AdaRFTState:
    del key
    if pool.size < (2 * p if no_repeat else p):
      raise ValueError(f"the pool ({pool.size} prompts) is too small for batch_size={p}"
                       + (" with no_repeat (needs 2 * batch_size)" if no_repeat else ""))
    diff = jnp.asarray(pool.difficulty, jnp.float32)
    lo = jnp.min(diff) if d_min is None else jnp.float32(d_min)
    hi = jnp.max(diff) if d_max is None else jnp.float32(d_max)
    step_size = 0.1 * (hi - lo) if eta is None else jnp.float32(eta)
    t0 = lo if initial_target is None else jnp.clip(jnp.float32(initial_target), lo, hi)
    return AdaRFTState(target=jnp.asarray(t0, jnp.float32), d_min=jnp.asarray(lo, jnp.float32),
                       d_max=jnp.asarray(hi, jnp.float32),
                       eta=jnp.asarray(step_size, jnp.float32), difficulty=diff, arms=pool.arms,
                       previous=jnp.full((p,), -1, jnp.int32), step=jnp.zeros((), jnp.int32))

  def select(state: AdaRFTState, key: jax.Array) -> tuple[Selection, AdaRFTState]:
    exclude = None
    if no_repeat:
      n = state.difficulty.shape[0]
      hit = jnp.where(state.previous >= 0, 1, 0)
      exclude = jnp.zeros((n,), jnp.int32).at[jnp.maximum(state.previous, 0)].add(hit) > 0
    ids = closest_to_target(key, state.difficulty, state.target, p, exclude)
    return Selection(prompt_ids=ids, arms=state.arms[ids]), state._replace(previous=ids)

  def update(state: AdaRFTState, feedback: Feedback) -> tuple[AdaRFTState, dict]:
    valid = prompt_stats.valid_mask(feedback)
    values = feedback.correct if reward_source == "correct" else feedback.rewards
    w = valid.astype(jnp.float32)
    mean_reward = (w * jnp.asarray(values, jnp.float32)).sum() / jnp.maximum(w.sum(), 1.0)
    target = target_update(state.target, mean_reward, eta=state.eta, sensitivity=sensitivity,
                           beta=beta, d_min=state.d_min, d_max=state.d_max)
    target = jnp.where(w.sum() > 0, target, state.target)  # nothing observed: T stays
    metrics = {"target": target, "mean_reward": mean_reward}
    return state._replace(target=target, step=state.step + 1), metrics

  return Curriculum(init=init, select=select, update=update)
