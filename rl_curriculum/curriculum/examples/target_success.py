"""Target-success curriculum: practise the arms whose success rate is closest to a target.

The worked example of docs/howto.md ("Add a curriculum"). Each arm keeps a running estimate of
its success rate; selection prefers arms whose estimate is near `target` (0.5 by default, where a
0/1 reward gives the largest mean |advantage|):

  success[k] <- success[k] + rate (acc[k] - success[k])     for every arm k sampled this step
  pi = softmax(-|success - target| / temperature)           over arms that hold prompts

acc[k] is the mean raw correctness of arm k's valid completions in the step. Estimates start at
`target`, so the first steps are uniform over arms and every arm gets measured. Arms with success
near 0 (too hard, or unlearnable) and near 1 (mastered) are both far from the target and fade out.
"""

from typing import NamedTuple, Union

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import arm_sampling
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.curriculum.arms import arm_mean
from rl_curriculum.types import Feedback, Selection


class TargetSuccessState(NamedTuple):
  """State of `target_success`."""
  success: jax.Array                    # f32[K] running success rate of each arm
  sampler: arm_sampling.ArmSamplerState  # per-arm permutations of the pool and cursors


def target_probabilities(success: jax.Array, sizes: jax.Array, target: float,
                         temperature: float) -> jax.Array:
  """pi: f32[K] = softmax(-|success - target| / temperature) over arms with prompts (sizes > 0)."""
  logits = -jnp.abs(success - target) / temperature
  return jax.nn.softmax(jnp.where(sizes > 0, logits, -jnp.inf))


def target_success(pool: Union[PromptPool, int], *, batch_size: int,
                   target: float = 0.5, rate: float = 0.2,
                   temperature: float = 0.1) -> Curriculum:
  """Builds the curriculum (module docstring).

  Args:
    pool: the PromptPool the curriculum will select from, or its number of arms K.
    batch_size: P, prompts per step.
    target: success rate to aim for, in (0, 1).
    rate: step size of the running success estimate, in (0, 1].
    temperature: > 0; smaller concentrates the batch on the arms nearest the target.

  Returns:
    Curriculum whose state is `TargetSuccessState`. `update` metrics: probs f32[K] (of the next
    select), success f32[K], arm_counts f32[K] (prompts of each arm in the feedback).

  Raises:
    ValueError: an argument out of range (named in the message).
  """
  num_arms = pool.num_arms if isinstance(pool, PromptPool) else int(pool)
  if num_arms < 1 or batch_size < 1:
    raise ValueError(f"need at least one arm and batch_size >= 1, got {num_arms} and {batch_size}")
  if not 0.0 < target < 1.0:
    raise ValueError(f"target must lie in (0, 1), got {target}")
  if not 0.0 < rate <= 1.0:
    raise ValueError(f"rate must lie in (0, 1], got {rate}")
  if not temperature > 0.0:
    raise ValueError(f"temperature must be > 0, got {temperature}")

  def probs_of(state: TargetSuccessState) -> jax.Array:
    return target_probabilities(state.success, state.sampler.sizes, target, temperature)

  def init(pool: PromptPool, key: jax.Array) -> TargetSuccessState:
    if pool.num_arms != num_arms:
      raise ValueError(f"built for {num_arms} arms, but the pool has {pool.num_arms}")
    return TargetSuccessState(
        success=jnp.full((num_arms,), target, jnp.float32),
        sampler=arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: TargetSuccessState, key: jax.Array) -> tuple[Selection, TargetSuccessState]:
    selection, sampler = arm_sampling.sample_selection(state.sampler, probs_of(state), key,
                                                       batch_size)
    return selection, state._replace(sampler=sampler)

  def update(state: TargetSuccessState, feedback: Feedback) -> tuple[TargetSuccessState, dict]:
    valid = (jnp.ones(feedback.correct.shape, jnp.float32) if feedback.valid is None
             else feedback.valid.astype(jnp.float32))
    acc, n = arm_mean(feedback.correct.astype(jnp.float32), feedback.arms, valid, num_arms)
    sampled = n > 0
    success = jnp.where(sampled, state.success + rate * (acc - state.success), state.success)
    state = state._replace(success=success)
    counts = jax.ops.segment_sum(jnp.ones(feedback.arms.shape, jnp.float32), feedback.arms,
                                 num_segments=num_arms)
    return state, {"probs": probs_of(state), "success": success, "arm_counts": counts}

  return Curriculum(init=init, select=select, update=update)
