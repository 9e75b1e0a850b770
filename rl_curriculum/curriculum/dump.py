"""DUMP: distribution-level curriculum learning by UCB over the recent |advantage| of each arm.

Reference: Wang et al. (2025), "DUMP: Automated Distribution-Level Curriculum Learning for RL-based
LLM Post-training", arXiv:2504.09710.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import arms as arms_lib
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum
from rl_curriculum.types import Feedback

__all__ = ["DUMPState", "dump", "dump_scores"]


class DUMPState(NamedTuple):
  """State of `dump`."""
  window: jax.Array   # f32[K, W] ring buffer of each arm's last W per-completion |A|
  filled: jax.Array   # i32[K] values stored in arm k's window (<= W)
  head: jax.Array     # i32[K] next write position in arm k's window
  counts: jax.Array   # i32[K] n_k, prompts of arm k trained so far
  sampler: ArmSamplerState


def dump_scores(window: jax.Array, filled: jax.Array, counts: jax.Array) -> jax.Array:
  """DUMP's UCB score `s_k = mean(window_k) + sqrt(2 ln(N + 1) / (n_k + 1))`, N = sum_k n_k.

  Args:
    window: f32[K, W]; filled: i32[K] (entries [0, filled) are valid until the window is full,
      which is how `arms.ring_push` fills it from position 0); counts: i32[K].

  Returns:
    f32[K]; an empty window has mean 0.
  """
  width = window.shape[1]
  mask = jnp.arange(width)[None, :] < filled[:, None]
  mean, _ = arms_lib.masked_row_mean(window, mask)
  n = counts.astype(jnp.float32)
  return mean + jnp.sqrt(2.0 * jnp.log(jnp.sum(n) + 1.0) / (n + 1.0))


def dump(pool: checks.PoolOrNumArms, *, batch_size: int, window: int = 300,
         temperature: float = 0.1) -> Curriculum:
  """DUMP: distribution-level curriculum by UCB over the recent mean |advantage| of each arm.

  Each arm keeps its last W per-completion |A| (valid completions only) and a count n_k of its
  prompts trained so far (our reading of "times the arm was sampled": one per prompt). Arms are
  drawn from softmax(s / T) with s = `dump_scores`. Validation rewards are never used as
  advantages: the authors' released code fed them in, which mixes held-out signal into training.

  Reference: Wang et al. (2025), "DUMP: Automated Distribution-Level Curriculum Learning for
  RL-based LLM Post-training", arXiv:2504.09710.

  Args:
    pool: the PromptPool (or just its number of arms K).
    batch_size: P.
    window: W, default 300.
    temperature: T > 0, default 0.1.

  Returns:
    Curriculum with `DUMPState`; metrics: probs, score, window_mean, counts, arm_counts.

  Raises:
    ValueError: window < 1 or temperature <= 0.
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  width = checks.positive("window", window, integer=True)
  temperature = checks.positive("temperature", temperature)

  def init_state(sampler: ArmSamplerState) -> DUMPState:
    zeros = jnp.zeros((num_arms,), jnp.int32)
    return DUMPState(window=jnp.zeros((num_arms, width), jnp.float32), filled=zeros, head=zeros,
                     counts=zeros, sampler=sampler)

  def probs(state: DUMPState) -> jax.Array:
    s = dump_scores(state.window, state.filled, state.counts)
    logits = jnp.where(state.sampler.sizes > 0, s / temperature, -jnp.inf)
    return jax.nn.softmax(logits)

  def update_state(state: DUMPState, feedback: Feedback) -> tuple[DUMPState, dict]:
    p, g = feedback.advantages.shape
    valid = arms_lib.valid_weights(feedback) > 0
    values = jnp.abs(feedback.advantages.astype(jnp.float32)).reshape(p * g)
    arms = jnp.broadcast_to(feedback.arms[:, None], (p, g)).reshape(p * g)
    buf, head, filled = arms_lib.ring_push(state.window, state.head, state.filled, values, arms,
                                           valid.reshape(p * g))
    counts = state.counts + arms_lib.arm_counts(feedback.arms, num_arms).astype(jnp.int32)
    state = state._replace(window=buf, head=head, filled=filled, counts=counts)
    mask = jnp.arange(width)[None, :] < filled[:, None]
    metrics = {"score": dump_scores(buf, filled, counts),
               "window_mean": arms_lib.masked_row_mean(buf, mask)[0],
               "counts": counts.astype(jnp.float32)}
    return state, metrics

  return arms_lib.category_curriculum(num_arms, batch_size, init_state, probs, update_state)
