"""GRESO: probabilistic pre-rollout skipping of prompts that keep giving zero-variance groups.

Per prompt (in the shared `PromptStats`): k = streak, the number of consecutive observations whose
group was zero-variance of the same kind (easy: all correct; hard: all wrong), and that kind.

select: draw C = ceil(oversample * P) distinct candidates uniformly; candidate i is kept with
  probability  q_i = max(p_i ** k_i, min_keep)  (p_i = p_easy or p_hard by its kind; q_i = 1 when
  k_i = 0), i.e. skipped with probability 1 - q_i. The P slots take the kept candidates in draw
  order; if fewer than P survive, the remaining slots hold skipped candidates in draw order (the
  batch never repeats a prompt; `state.last_kept` records how many candidates were kept, so
  min(last_kept, P) slots hold kept candidates; 1 - last_kept / C is the skip rate). Those slots
  are marked inactive (`Selection.active`): the trainer rolls none of them out, so the step trains
  on fewer groups and saves their rollouts, which is GRESO's point. With `refill=True` they are
  rolled out like the others (the batch always has P groups; nothing is saved).

update: besides the store, adapt the two base probabilities so that the zero-variance share of the
  batch tracks its target. With z_easy (z_hard) the fraction of observed groups of the batch that
  were all correct (all wrong), and targets t_easy = target * easy_share, t_hard = target -
  t_easy (defaults 0.25 * 1/3 and 0.25 * 2/3):
    p_easy <- clip(p_easy - step_size * sign(z_easy - t_easy), p_min, p_max)
  and likewise p_hard: too many zero-variance groups of a kind lower its p, so such prompts are
  skipped more; too few raise it. Defaults step_size 0.01, [p_min, p_max] = [0.05, 0.95],
  min_keep 0.01, initial p 0.5 (our choice).

Reference: Zheng et al. (2025), "Act Only When It Pays: Efficient Reinforcement Learning for LLM
Reasoning via Selective Rollouts", arXiv:2506.02177.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection


class GRESOState(NamedTuple):
  """State of `greso`; N pool prompts."""
  stats: prompt_stats.PromptStats  # per-prompt statistics (streak and streak_kind drive skipping)
  p_easy: jax.Array                # f32[] base keep probability for easy (all-correct) streaks
  p_hard: jax.Array                # f32[] base keep probability for hard (all-wrong) streaks
  arms: jax.Array                  # i32[N] arm of each pool prompt
  last_kept: jax.Array             # i32[] candidates the last select kept (may exceed P)
  step: jax.Array                  # i32[] updates applied so far


def keep_probability(streak: jax.Array, kind: jax.Array, p_easy: jax.Array, p_hard: jax.Array,
                     min_keep: float = 0.01) -> jax.Array:
  """f32[...] q = max(p ** k, min_keep), p = p_easy (easy streak) or p_hard; q = 1 if k = 0."""
  p = jnp.where(kind == prompt_stats.KIND_EASY, p_easy, p_hard)
  q = jnp.maximum(p ** streak.astype(jnp.float32), min_keep)
  return jnp.where(streak > 0, q, 1.0).astype(jnp.float32)


def skip_mask(key: jax.Array, streak: jax.Array, kind: jax.Array, p_easy: jax.Array,
              p_hard: jax.Array, min_keep: float = 0.01) -> jax.Array:
  """bool[C]: candidate i is skipped, with probability 1 - keep_probability (independent draws)."""
  u = jax.random.uniform(key, streak.shape)
  return u >= keep_probability(streak, kind, p_easy, p_hard, min_keep)


def adapt_probability(p: jax.Array, observed_fraction: jax.Array, target: float, step_size: float,
                      p_min: float, p_max: float) -> jax.Array:
  """f32[] p - step_size * sign(observed_fraction - target), clipped to [p_min, p_max]."""
  return jnp.clip(p - step_size * jnp.sign(observed_fraction - target), p_min, p_max)


def greso(pool: checks.PoolOrNumArms, *, batch_size: int, oversample: float = 2.0,
          target_zero_variance: float = 0.25, easy_share: float = 1.0 / 3.0,
          step_size: float = 0.01, p_min: float = 0.05, p_max: float = 0.95, p_init: float = 0.5,
          min_keep: float = 0.01, refill: bool = False) -> Curriculum:
  """GRESO curriculum (module docstring).

  Args:
    pool: the PromptPool (or just its number of arms); the state is sized in `init` from the
      pool given there.
    batch_size: P, prompts per step.
    oversample: candidates drawn per step, C = ceil(oversample * P) >= P (default 2).
    target_zero_variance: target zero-variance share of a batch (default 0.25).
    easy_share: part of that target for easy groups (default 1/3; hard gets the rest).
    step_size: change of p_easy / p_hard per update (default 0.01).
    p_min, p_max: range of p_easy / p_hard (default [0.05, 0.95]).
    p_init: initial p_easy and p_hard (default 0.5).
    min_keep: floor of the keep probability (default 0.01).
    refill: roll out skipped candidates when fewer than P are kept (default False: their slots
      are inactive and not rolled out).
  Returns:
    Curriculum with state `GRESOState`. `update` metrics: `zero_variance_easy`,
    `zero_variance_hard` (fractions of the batch), `p_easy`, `p_hard` (after the update).
  Raises:
    ValueError: on an argument out of range; `init` raises if the pool is smaller than C.
  """
  checks.num_arms(pool)  # the pool's arrays are read in init
  p = int(batch_size)
  if p < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not oversample >= 1.0:
    raise ValueError(f"oversample must be >= 1, got {oversample}")
  if not 0.0 <= target_zero_variance <= 1.0:
    raise ValueError(f"target_zero_variance must lie in [0, 1], got {target_zero_variance}")
  if not 0.0 <= easy_share <= 1.0:
    raise ValueError(f"easy_share must lie in [0, 1], got {easy_share}")
  if not step_size >= 0.0:
    raise ValueError(f"step_size must be >= 0, got {step_size}")
  if not 0.0 <= p_min <= p_max <= 1.0:
    raise ValueError(f"need 0 <= p_min <= p_max <= 1, got p_min={p_min}, p_max={p_max}")
  if not p_min <= p_init <= p_max:
    raise ValueError(f"p_init must lie in [p_min, p_max] = [{p_min}, {p_max}], got {p_init}")
  if not 0.0 <= min_keep <= 1.0:
    raise ValueError(f"min_keep must lie in [0, 1], got {min_keep}")
  if not isinstance(refill, bool):
    raise ValueError(f"refill must be True or False, got {refill!r}")
  num_candidates = int(math.ceil(oversample * p - 1e-9))
  target_easy = target_zero_variance * easy_share
  target_hard = target_zero_variance - target_easy

  def init(pool: PromptPool, key: jax.Array) -> GRESOState:
    del key
    if pool.size < num_candidates:
      raise ValueError(f"the pool ({pool.size} prompts) is smaller than the {num_candidates} "
                       "candidates select draws (oversample * batch_size)")
    return GRESOState(stats=prompt_stats.init(pool.size), p_easy=jnp.float32(p_init),
                      p_hard=jnp.float32(p_init), arms=pool.arms,
                      last_kept=jnp.zeros((), jnp.int32), step=jnp.zeros((), jnp.int32))

  def select(state: GRESOState, key: jax.Array) -> tuple[Selection, GRESOState]:
    key_cand, key_skip = jax.random.split(key)
    cand = prompt_level.sample_without_replacement(key_cand, state.arms.shape[0], num_candidates)
    skip = skip_mask(key_skip, state.stats.streak[cand], state.stats.streak_kind[cand],
                     state.p_easy, state.p_hard, min_keep)
    order = jnp.argsort(skip, stable=True)[:p]
    ids = cand[order]
    kept = (~skip).sum(dtype=jnp.int32)
    active = None if refill else jnp.arange(p) < kept
    selection = Selection(prompt_ids=ids, arms=state.arms[ids], active=active)
    return selection, state._replace(last_kept=kept)

  def update(state: GRESOState, feedback: Feedback) -> tuple[GRESOState, dict]:
    n_row, s_row = prompt_stats.group_counts(feedback)
    observed = n_row > 0
    num = jnp.maximum(observed.sum(), 1).astype(jnp.float32)
    z_easy = (observed & (s_row == n_row)).sum() / num
    z_hard = (observed & (s_row == 0)).sum() / num
    p_easy = adapt_probability(state.p_easy, z_easy, target_easy, step_size, p_min, p_max)
    p_hard = adapt_probability(state.p_hard, z_hard, target_hard, step_size, p_min, p_max)
    stats = prompt_stats.update(state.stats, feedback, state.step)
    metrics = {"zero_variance_easy": z_easy, "zero_variance_hard": z_hard,
               "p_easy": p_easy, "p_hard": p_hard}
    new = state._replace(stats=stats, p_easy=p_easy, p_hard=p_hard, step=state.step + 1)
    return new, metrics

  return Curriculum(init=init, select=select, update=update)
