"""Hard-focus retention: the lowest-accuracy prompts stay in a retained set across steps.

After each step, every observed prompt (rows with the same id pooled) whose group accuracy acc
satisfies min_accuracy <= acc <= max_accuracy enters (or is refreshed in) a bounded retained set
with priority 1 - acc; a retained prompt observed with an accuracy outside that range leaves it.
When the set is full the highest-accuracy entry is evicted (ties: the oldest). Each `select` draws
round(retain_fraction * P) prompts uniformly without replacement from the retained set and the rest
uniformly from the pool (never a retained prompt drawn in the same step); while the set holds
fewer, the pool fills the gap. The bounded set is `prompt_level.update_memory`.

Pair it with `allocation.allocate_by_difficulty` to spend more rollouts on the retained prompts
(the competitive-programming recipe of the reference below: 64 rollouts on a small retained hard
set, 8 elsewhere). Defaults (our choice): retained set of P slots, a quarter of the batch from it,
accuracies in [0, 0.5], no expiry. Prompts that are never solved stay while they keep failing;
raise `min_accuracy` above 0 to leave all-wrong groups out, or set `max_age` to expire entries
that were not observed for that many steps.

Reference: Zhu et al. (2025), "DRIVE: Data Curation Best Practices for Reinforcement Learning with
Verifiable Reward in Competitive Code Generation", arXiv:2511.06307 (its hard-focus curriculum).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection


class HardFocusState(NamedTuple):
  """State of `hard_focus`; N pool prompts, R retained slots."""
  stats: prompt_stats.PromptStats  # per-prompt statistics (arrays of N)
  retained: prompt_level.Memory    # ids i32[R], priority f32[R] (1 - accuracy), age i32[R]
  arms: jax.Array                  # i32[N] arm of each pool prompt
  step: jax.Array                  # i32[] updates applied so far


def hard_focus(pool: checks.PoolOrNumArms, *, batch_size: int,
               retained_size: Optional[int] = None, retain_fraction: float = 0.25,
               min_accuracy: float = 0.0, max_accuracy: float = 0.5,
               max_age: Optional[int] = None) -> Curriculum:
  """Hard-focus retention curriculum (module docstring).

  Args:
    pool: the PromptPool (or just its number of arms); the state is sized in `init` from the
      pool given there.
    batch_size: P, prompts per step.
    retained_size: R, slots of the retained set (default P).
    retain_fraction: share of the batch drawn from the retained set (default 0.25).
    min_accuracy, max_accuracy: accuracy range that enters the set (default [0, 0.5], closed).
    max_age: entries not observed for more than max_age steps expire (default None: never).
  Returns:
    Curriculum with state `HardFocusState`. `update` metrics: `accuracy` f32[P] (pooled per
    prompt), `retained_fill` i32[], `retained_mean_accuracy` f32[].
  Raises:
    ValueError: on an argument out of range; `init` raises if the pool has fewer than
      P + round(retain_fraction * P) prompts.
  """
  checks.num_arms(pool)  # the pool's arrays are read in init
  p = int(batch_size)
  if p < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  r = p if retained_size is None else int(retained_size)
  if r < 1:
    raise ValueError(f"retained_size must be >= 1, got {retained_size}")
  if not 0.0 <= retain_fraction <= 1.0:
    raise ValueError(f"retain_fraction must lie in [0, 1], got {retain_fraction}")
  if not 0.0 <= min_accuracy <= max_accuracy <= 1.0:
    raise ValueError(f"need 0 <= min_accuracy <= max_accuracy <= 1, got "
                     f"min_accuracy={min_accuracy}, max_accuracy={max_accuracy}")
  if max_age is not None and int(max_age) < 0:
    raise ValueError(f"max_age must be >= 0 or None, got {max_age}")
  num_retained = min(int(round(retain_fraction * p)), r)

  def init(pool: PromptPool, key: jax.Array) -> HardFocusState:
    del key
    if pool.size < p + num_retained:
      raise ValueError(f"the pool ({pool.size} prompts) must hold at least batch_size + "
                       f"retained slots = {p + num_retained} prompts")
    return HardFocusState(stats=prompt_stats.init(pool.size),
                          retained=prompt_level.empty_memory(r), arms=pool.arms,
                          step=jnp.zeros((), jnp.int32))

  def select(state: HardFocusState, key: jax.Array) -> tuple[Selection, HardFocusState]:
    logits = jnp.zeros(state.retained.ids.shape, jnp.float32)
    ids, _ = prompt_level.mix_memory_and_pool(key, state.retained, logits, num_retained,
                                              state.arms.shape[0], p)
    return Selection(prompt_ids=ids, arms=state.arms[ids]), state

  def update(state: HardFocusState, feedback: Feedback) -> tuple[HardFocusState, dict]:
    ids = jnp.asarray(feedback.prompt_ids, jnp.int32)
    n_row, s_row = prompt_stats.group_counts(feedback)
    n = prompt_level.rows_pooled(ids, n_row)
    s = prompt_level.rows_pooled(ids, s_row)
    observed = n > 0
    # Compare counts, not a rounded float: min_accuracy * n <= s <= max_accuracy * n.
    nf, sf = n.astype(jnp.float32), s.astype(jnp.float32)
    acc = sf / jnp.maximum(nf, 1.0)
    hard = observed & (sf >= min_accuracy * nf) & (sf <= max_accuracy * nf)
    retained = prompt_level.update_memory(state.retained, ids, 1.0 - acc, observed, hard, max_age)
    stats = prompt_stats.update(state.stats, feedback, state.step)
    occupied = retained.ids != prompt_level.EMPTY
    metrics = {
        "accuracy": jnp.where(observed, acc, jnp.nan),
        "retained_fill": occupied.sum(dtype=jnp.int32),
        "retained_mean_accuracy": (jnp.where(occupied, 1.0 - retained.priority, 0.0).sum()
                                   / jnp.maximum(occupied.sum(), 1)),
    }
    return state._replace(stats=stats, retained=retained, step=state.step + 1), metrics

  return Curriculum(init=init, select=select, update=update)
