"""VADE: Thompson sampling on per-prompt Beta posteriors, picking the most informative prompts.

Each prompt i carries a Beta(a_i, b_i) posterior over its success probability (in the shared
`PromptStats`, prior Beta(prior_a, prior_b)).

select: draw C candidates (all N prompts when `num_candidates` is None, else C distinct prompts
  uniformly); for each draw theta_i ~ Beta(a_i, b_i); keep the P candidates with the largest
  theta_i (1 - theta_i), the Bernoulli variance of the draw (our proxy for the information gain
  of training on the prompt). Ties, which have probability zero, go to the earlier candidate.

update, in this order:
  1. slow decay of every prompt:   a <- a0 + slow * (a - a0),   b <- b0 + slow * (b - b0)
  2. fast decay of the prompts of this batch (recently trained: the policy just moved on them):
                                   a <- a0 + fast * (a - a0),   b likewise
     so a prompt in the batch is shrunk by fast * slow in total, every other prompt by slow;
  3. evidence of this batch:       a += s_i,   b += n_i - s_i
     (n_i valid completions and s_i correct ones, rows with the same id pooled).
  Defaults fast = 0.9, slow = 0.99. With (a0, b0) = (1, 1), decay keeps old evidence with weight
  slow^t, so the posterior tracks a moving success probability.

Reference: Hu et al. (2025), "VADE: Variance-Aware Dynamic Sampling via Online Sample-Level
Difficulty Estimation for Multimodal RL", arXiv:2511.18902.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection


class VADEState(NamedTuple):
  """State of `vade`; N pool prompts."""
  stats: prompt_stats.PromptStats  # per-prompt statistics; beta_a/beta_b hold the decayed posterior
  arms: jax.Array                  # i32[N] arm of each pool prompt
  step: jax.Array                  # i32[] updates applied so far


def information_gain(theta: jax.Array) -> jax.Array:
  """theta (1 - theta), the Bernoulli variance at success probability theta; same shape."""
  return theta * (1.0 - theta)


def vade_decay(stats: prompt_stats.PromptStats, batch_ids: jax.Array, *, fast: float,
               slow: float) -> prompt_stats.PromptStats:
  """Steps 1-2 of the update: every prompt shrinks by `slow`, batch prompts by `fast * slow`.

  Args:
    stats: the store.
    batch_ids: i32[P] prompt ids trained in this step (duplicates allowed).
  """
  n = stats.beta_a.shape[0]
  in_batch = jnp.zeros((n,), jnp.int32).at[batch_ids].add(1) > 0
  factor = jnp.where(in_batch, fast * slow, slow).astype(jnp.float32)
  return prompt_stats.decay_beta(stats, factor)


def vade(pool: checks.PoolOrNumArms, *, batch_size: int, num_candidates: Optional[int] = None,
         fast_decay: float = 0.9, slow_decay: float = 0.99, prior_a: float = 1.0,
         prior_b: float = 1.0) -> Curriculum:
  """VADE curriculum (module docstring).

  Args:
    pool: the PromptPool (or just its number of arms); the state is sized in `init` from the
      pool given there.
    batch_size: P, prompts per step.
    num_candidates: C, size of the uniformly drawn candidate set (default None: all N prompts).
    fast_decay: factor for prompts in the current batch, in (0, 1] (default 0.9).
    slow_decay: factor for every prompt, in (0, 1] (default 0.99).
    prior_a, prior_b: Beta prior, > 0 (default 1, 1: uniform).
  Returns:
    Curriculum with state `VADEState`. `update` metrics: `posterior_mean` f32[P] and
    `posterior_var` f32[P] of the batch prompts after the update, `batch_accuracy` f32[].
  Raises:
    ValueError: on an argument out of range; `init` raises if the pool is smaller than C or P.
  """
  checks.num_arms(pool)  # the pool's arrays are read in init
  p = int(batch_size)
  if p < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if num_candidates is not None and int(num_candidates) < p:
    raise ValueError(f"num_candidates must be >= batch_size={p}, got {num_candidates}")
  if not 0.0 < fast_decay <= 1.0:
    raise ValueError(f"fast_decay must lie in (0, 1], got {fast_decay}")
  if not 0.0 < slow_decay <= 1.0:
    raise ValueError(f"slow_decay must lie in (0, 1], got {slow_decay}")
  if not (prior_a > 0 and prior_b > 0):
    raise ValueError(f"prior_a and prior_b must be > 0, got {prior_a}, {prior_b}")

  def init(pool: PromptPool, key: jax.Array) -> VADEState:
    del key
    need = p if num_candidates is None else int(num_candidates)
    if pool.size < need:
      raise ValueError(f"the pool ({pool.size} prompts) is smaller than the {need} candidates "
                       "select draws")
    return VADEState(stats=prompt_stats.init(pool.size, prior_a=prior_a, prior_b=prior_b),
                     arms=pool.arms, step=jnp.zeros((), jnp.int32))

  def select(state: VADEState, key: jax.Array) -> tuple[Selection, VADEState]:
    n = state.arms.shape[0]
    key_cand, key_theta = jax.random.split(key)
    if num_candidates is None:
      cand = jnp.arange(n, dtype=jnp.int32)
    else:
      cand = prompt_level.sample_without_replacement(key_cand, n, int(num_candidates))
    theta = jax.random.beta(key_theta, state.stats.beta_a[cand], state.stats.beta_b[cand])
    _, top = jax.lax.top_k(information_gain(theta), p)
    ids = cand[top]
    return Selection(prompt_ids=ids, arms=state.arms[ids]), state

  def update(state: VADEState, feedback: Feedback) -> tuple[VADEState, dict]:
    ids = jnp.asarray(feedback.prompt_ids, jnp.int32)
    stats = vade_decay(state.stats, ids, fast=fast_decay, slow=slow_decay)
    stats = prompt_stats.update(stats, feedback, state.step)
    a, b = stats.beta_a[ids], stats.beta_b[ids]
    n_row, s_row = prompt_stats.group_counts(feedback)
    metrics = {
        "posterior_mean": a / (a + b),
        "posterior_var": a * b / ((a + b) ** 2 * (a + b + 1.0)),
        "batch_accuracy": s_row.sum() / jnp.maximum(n_row.sum(), 1),
    }
    return state._replace(stats=stats, step=state.step + 1), metrics

  return Curriculum(init=init, select=select, update=update)
