"""Learnability sampling: arms in proportion to p (1 - p), p the arm's running success rate.

A prompt solved with probability p gives G completions whose 0/1 correctness has variance
p (1 - p); its group's rewards, and so the expected |advantage| of its completions, vanish at
p = 0 and p = 1 and peak at p = 1/2. Arms whose prompts the policy sometimes solves, but not
always, are the ones a step learns most from.

Each step moves the success estimate p[k] of every sampled arm toward the arm's success rate in
the step (`learnability_update`); the next batch draws its arms from the scores p (1 - p) with a
uniform floor (`learnability_probabilities`).

Reference: Foster et al. (2025), "Learning to Reason at the Frontier of Learnability",
arXiv:2502.12272 (questions prioritised by the learnability score p (1 - p)). Related: Tzannetos
et al. (2023), "Proximal Curriculum for Reinforcement Learning Agents", arXiv:2304.12877 (tasks
neither too easy nor too hard for the learner).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import arms as arms_lib
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum
from rl_curriculum.types import Feedback

__all__ = ["LearnabilityState", "learnability", "learnability_update",
           "learnability_probabilities"]


class LearnabilityState(NamedTuple):
  """State of `learnability`."""
  success: jax.Array        # f32[K] running success rate p[k] of each arm (0.5 before any step)
  sampler: ArmSamplerState  # per-arm permutations and cursors


def learnability_update(success: jax.Array, obs: jax.Array, sampled: jax.Array,
                        alpha) -> jax.Array:
  """Exponential moving average of each arm's per-step success rate.

    p[k] <- p[k] + alpha (s[k] - p[k])   if arm k has a valid completion in the step,
    p[k] <- p[k]                         otherwise,

  with s[k] = (correct valid completions of arm k) / (valid completions of arm k) in the step.

  Args:
    success: f32[K] p before the step; obs: f32[K] s of the step (any value where not sampled);
    sampled: bool[K] arm k has at least one valid completion; alpha: step size in (0, 1].

  Returns:
    f32[K] p after the step.
  """
  return jnp.where(sampled, success + alpha * (obs - success), success)


def learnability_probabilities(success: jax.Array, sizes: jax.Array, epsilon) -> jax.Array:
  """Arm probabilities pi: f32[K] from the learnability scores w[k] = p[k] (1 - p[k]).

  Over the K' arms with prompts (pi = 0 on the others),
    pi[k] = epsilon / K' + (1 - epsilon) w[k] / sum_j w[j],
  and pi[k] = 1 / K' when every score is 0 (each non-empty arm at p = 0 or p = 1).

  Args:
    success: f32[K] p; sizes: i32[K] prompts of each arm; epsilon: uniform share in [0, 1].

  Returns:
    f32[K] summing to 1 over the non-empty arms.
  """
  nonempty = sizes > 0
  unif = nonempty.astype(jnp.float32) / jnp.maximum(jnp.sum(nonempty), 1)
  w = jnp.where(nonempty, success * (1.0 - success), 0.0)
  total = jnp.sum(w)
  greedy = jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), unif)
  return epsilon * unif + (1.0 - epsilon) * greedy


def learnability(pool: checks.PoolOrNumArms, *, batch_size: int, alpha: float = 0.3,
                 epsilon: float = 0.05) -> Curriculum:
  """Learnability sampling over arms: pi[k] grows with p[k] (1 - p[k]), largest at p[k] = 1/2.

  p[k] is an exponential moving average (rate alpha) of arm k's success rate per step that
  sampled it (`learnability_update`): each step counts once, whatever its number of valid
  completions, and arms without a valid completion in the step keep their estimate. Every p
  starts at 1/2, the maximal score, so every non-empty arm starts with the same probability and
  an arm not yet sampled keeps the largest score until it is. Selection draws each of the P
  slots' arm i.i.d. from `learnability_probabilities` (pi = epsilon / K' + (1 - epsilon) w / sum w,
  w = p (1 - p)), then prompts without replacement within each arm. Success is read from
  `Feedback.correct`, never from the shaped reward.

  Foster et al. score questions by p (1 - p); scoring arms, the moving average and the uniform
  floor are our choices. Defaults alpha = 0.3 (an estimate that forgets a step's outcome after
  about 1 / alpha = 3 of the arm's steps, so it follows a policy that improves) and
  epsilon = 0.05 (every arm keeps a probability >= epsilon / K', so an arm whose estimate reached
  0 or 1 is still revisited) are ours.

  Reference: Foster et al. (2025), "Learning to Reason at the Frontier of Learnability",
  arXiv:2502.12272.

  Args:
    pool: the PromptPool (or just its number of arms K).
    batch_size: P, prompts per step.
    alpha: step size of the moving average, in (0, 1]; default 0.3.
    epsilon: share of uniform exploration, in [0, 1]; default 0.05.

  Returns:
    Curriculum whose state is `LearnabilityState`. Metrics (all f32[K]): probs, success (p),
    learnability (p (1 - p)), sampled, arm_counts.

  Raises:
    ValueError: alpha outside (0, 1], epsilon outside [0, 1], or batch_size < 1.
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  alpha = checks.unit("alpha", alpha, closed_low=False)
  epsilon = checks.unit("epsilon", epsilon)

  def init_state(sampler: ArmSamplerState) -> LearnabilityState:
    return LearnabilityState(success=jnp.full((num_arms,), 0.5, jnp.float32), sampler=sampler)

  def probs(state: LearnabilityState) -> jax.Array:
    return learnability_probabilities(state.success, state.sampler.sizes, epsilon)

  def update_state(state: LearnabilityState,
                   feedback: Feedback) -> tuple[LearnabilityState, dict]:
    obs, n = arms_lib.arm_mean(feedback.correct.astype(jnp.float32), feedback.arms,
                               arms_lib.valid_weights(feedback), num_arms)
    sampled = n > 0
    success = learnability_update(state.success, obs, sampled, alpha)
    metrics = {"success": success, "learnability": success * (1.0 - success),
               "sampled": sampled.astype(jnp.float32)}
    return state._replace(success=success), metrics

  return arms_lib.category_curriculum(num_arms, batch_size, init_state, probs, update_state)
