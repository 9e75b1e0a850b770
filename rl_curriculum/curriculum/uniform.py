"""The uniform baseline: arms in proportion to their prompts, or uniform over arms.

The curriculum every other one is compared against; it keeps no statistics.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import arms as arms_lib
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum
from rl_curriculum.types import Feedback

__all__ = ["UniformState", "uniform", "UNIFORM_BY"]

UNIFORM_BY = ("prompt", "arm")


class UniformState(NamedTuple):
  """State of `uniform`."""
  sampler: ArmSamplerState  # per-arm permutations and cursors


def uniform(pool: checks.PoolOrNumArms, *, batch_size: int, by: str = "prompt") -> Curriculum:
  """Uniform baseline: pi(k) = N_k / N (by="prompt", default) or 1 / K' (by="arm").

  N_k is the number of prompts of arm k and K' the number of non-empty arms. Prompts are drawn
  without replacement within each arm, as for every category-level curriculum.

  Args:
    pool: the PromptPool (or just its number of arms K).
    batch_size: P, prompts per step.
    by: "prompt" (default) or "arm".

  Returns:
    Curriculum whose state is `UniformState`. Metrics: probs, arm_counts (f32[K]).

  Raises:
    ValueError: if `by` is not "prompt" or "arm", or batch_size < 1.
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  checks.choice("by", by, UNIFORM_BY)

  def probs(state: UniformState) -> jax.Array:
    sizes = state.sampler.sizes
    w = sizes.astype(jnp.float32) if by == "prompt" else (sizes > 0).astype(jnp.float32)
    return w / jnp.sum(w)

  def update_state(state: UniformState, feedback: Feedback) -> tuple[UniformState, dict]:
    del feedback  # nothing to learn
    return state, {}

  return arms_lib.category_curriculum(num_arms, batch_size, UniformState, probs, update_state)
