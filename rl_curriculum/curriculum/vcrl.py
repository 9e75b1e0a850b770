"""VCRL: variance-based prompt selection with a bounded replay memory.

Score of a group with n valid completions of correctness (or reward) r:
  p = Var(r) / Var_max,   Var(r) = mean_g (r_g - mean r)^2   (population variance)
For 0/1 outcomes with s correct, Var = s/n (1 - s/n), so p = 4 (s/n)(1 - s/n) with Var_max = 0.25;
for even n this equals the paper's unbiased variance divided by its maximum, G/(4(G-1)).

High-variance prompts (p >= threshold) enter a bounded replay memory of `memory_size` slots whose
priority is their score (see `prompt_level.update_memory`: a prompt observed again is re-scored,
and leaves the memory if its new score is below the threshold; when full, the lowest priority is
evicted, ties to the oldest). Each `select` draws `round(replay_fraction * P)` prompts from the
memory without replacement, with probability proportional to priority, and the rest uniformly
from the pool (never a prompt already drawn from the memory); while the memory holds fewer
entries, the pool fills the gap. `update` also reports `high_variance: bool[P]`, the groups with
p >= threshold, which a trainer may use as a training mask.

Reference: Jiang et al. (2025), "VCRL: Variance-based Curriculum Reinforcement Learning for Large
Language Models", arXiv:2509.19803. The threshold, memory size, replay fraction and the memory's
eviction and replay rules are our choices where the paper leaves them open.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection

SCORE_SOURCES = ("correct", "reward")


class VCRLState(NamedTuple):
  """State of `vcrl`; N pool prompts, M memory slots."""
  stats: prompt_stats.PromptStats  # per-prompt statistics (arrays of N)
  memory: prompt_level.Memory      # ids i32[M], priority f32[M] (score p), age i32[M]
  arms: jax.Array                  # i32[N] arm of each pool prompt
  step: jax.Array                  # i32[] updates applied so far


def vcrl(pool: checks.PoolOrNumArms, *, batch_size: int, memory_size: Optional[int] = None,
         replay_fraction: float = 0.25, threshold: float = 0.5, var_max: float = 0.25,
         score_on: str = "correct", max_age: Optional[int] = None) -> Curriculum:
  """VCRL curriculum (module docstring).

  Args:
    pool: the PromptPool (or just its number of arms); the state is sized in `init` from the
      pool given there.
    batch_size: P, prompts per step.
    memory_size: M, replay memory slots (default 2 * P).
    replay_fraction: share of the batch drawn from the memory, round(replay_fraction * P) slots.
    threshold: prompts with p >= threshold enter the memory (default 0.5; for G = 8 that is
      2 to 6 correct completions).
    var_max: Var_max of the score (0.25 for 0/1 outcomes).
    score_on: "correct" (default: raw correctness) or "reward" (the shaped reward; then set
      var_max to the reward's largest variance).
    max_age: entries not refreshed for more than max_age steps expire (default None: never).
  Returns:
    Curriculum with state `VCRLState`. `update` metrics: `scores` f32[P], `high_variance` bool[P],
    `memory_fill` i32[], `mean_score` f32[].
  Raises:
    ValueError: on an argument out of range (named in the message); `init` raises if the pool
      has fewer than P + round(replay_fraction * P) prompts.
  """
  checks.num_arms(pool)  # the pool's arrays are read in init
  p = int(batch_size)
  if p < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  m = 2 * p if memory_size is None else int(memory_size)
  if m < 1:
    raise ValueError(f"memory_size must be >= 1, got {memory_size}")
  if not 0.0 <= replay_fraction <= 1.0:
    raise ValueError(f"replay_fraction must lie in [0, 1], got {replay_fraction}")
  if not 0.0 <= threshold <= 1.0:
    raise ValueError(f"threshold must lie in [0, 1], got {threshold}")
  if not var_max > 0:
    raise ValueError(f"var_max must be > 0, got {var_max}")
  if score_on not in SCORE_SOURCES:
    raise ValueError(f"score_on must be one of {SCORE_SOURCES}, got {score_on!r}")
  if max_age is not None and int(max_age) < 0:
    raise ValueError(f"max_age must be >= 0 or None, got {max_age}")
  num_replay = min(int(round(replay_fraction * p)), m)

  def init(pool: PromptPool, key: jax.Array) -> VCRLState:
    del key  # VCRL starts from an empty memory; nothing random.
    if pool.size < p + num_replay:
      raise ValueError(f"the pool ({pool.size} prompts) must hold at least batch_size + "
                       f"replay slots = {p + num_replay} prompts")
    return VCRLState(stats=prompt_stats.init(pool.size), memory=prompt_level.empty_memory(m),
                     arms=pool.arms, step=jnp.zeros((), jnp.int32))

  def select(state: VCRLState, key: jax.Array) -> tuple[Selection, VCRLState]:
    logits = jnp.log(jnp.maximum(state.memory.priority, 1e-30))
    ids, _ = prompt_level.mix_memory_and_pool(key, state.memory, logits, num_replay,
                                              state.arms.shape[0], p)
    return Selection(prompt_ids=ids, arms=state.arms[ids]), state

  def update(state: VCRLState, feedback: Feedback) -> tuple[VCRLState, dict]:
    valid = prompt_stats.valid_mask(feedback)
    values = feedback.correct if score_on == "correct" else feedback.rewards
    ids = jnp.asarray(feedback.prompt_ids, jnp.int32)
    # Rows sharing a prompt id are pooled (sums of n, sum r, sum r^2) so they get one score.
    w = valid.astype(jnp.float32)
    r = jnp.asarray(values, jnp.float32)
    n = prompt_level.rows_pooled(ids, w.sum(axis=1))
    s1 = prompt_level.rows_pooled(ids, (w * r).sum(axis=1))
    s2 = prompt_level.rows_pooled(ids, (w * r * r).sum(axis=1))
    mean = s1 / jnp.maximum(n, 1.0)
    var = jnp.maximum(s2 / jnp.maximum(n, 1.0) - mean * mean, 0.0)
    scores = jnp.where(n > 0, var / var_max, 0.0)
    observed = n > 0
    high = observed & (scores >= threshold)
    memory = prompt_level.update_memory(state.memory, ids, scores, observed, high, max_age)
    stats = prompt_stats.update(state.stats, feedback, state.step)
    metrics = {
        "scores": scores,
        "high_variance": high,
        "mean_score": jnp.where(observed, scores, 0.0).sum() / jnp.maximum(observed.sum(), 1),
        "memory_fill": (memory.ids != prompt_level.EMPTY).sum(dtype=jnp.int32),
    }
    return state._replace(stats=stats, memory=memory, step=state.step + 1), metrics

  return Curriculum(init=init, select=select, update=update)
