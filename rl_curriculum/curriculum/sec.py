"""SEC, the Self-Evolving Curriculum: curriculum selection as a non-stationary K-armed bandit.

Each arm is a category of prompts: a difficulty bin, a task, or a (task, bin) pair of a task
mixture (the "2-D" arms; `train.setup.data.arms_of` lays a run's arms out).
After every step each sampled arm k gets a reward R[k] (`sec_arm_rewards`), its value moves toward
it, `Q[k] <- Q[k] + alpha (R[k] - Q[k])` (`sec_update_q`), and the next batch draws its arms from a
distribution over Q (`sec_probabilities`, Boltzmann by default).

Reference: Chen et al. (2025), "Self-Evolving Curriculum for LLM Reasoning", arXiv:2505.14970.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import arms as arms_lib
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum
from rl_curriculum.types import Feedback

__all__ = ["SECState", "sec", "sec_arm_rewards", "sec_update_q", "sec_probabilities",
           "SEC_OBJECTIVES", "SEC_UNSAMPLED", "SEC_EXPLORATION"]

SEC_OBJECTIVES = ("abs_advantage", "unnormalized_abs_advantage", "learning_progress")
SEC_UNSAMPLED = ("keep", "decay")
SEC_EXPLORATION = ("boltzmann", "epsilon_greedy", "ucb")


class SECState(NamedTuple):
  """State of `sec`."""
  q: jax.Array                 # f32[K] arm values (running average of the arm reward)
  visits: jax.Array            # i32[K] updates in which arm k was sampled (UCB counts)
  last_mean_reward: jax.Array  # f32[K] arm's mean reward the last time it was sampled
  step: jax.Array              # i32[] updates so far
  sampler: ArmSamplerState     # per-arm permutations and cursors


def sec_arm_rewards(feedback: Feedback, num_arms: int, objective: str,
                    last_mean_reward: jax.Array,
                    visits: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """SEC's per-arm reward R[k] for one step.

  With c[p] the arm of prompt p and the mean taken over valid completions of arm k:
    abs_advantage:               R[k] = mean |A[p, g]|
    unnormalized_abs_advantage:  R[k] = mean |r[p, g] - mean_{g' valid} r[p, g']|
    learning_progress:           R[k] = |mean r (this step) - mean r (previous step that sampled
                                 k)|, and 0 the first time arm k is sampled (no earlier mean).

  Args:
    feedback: Feedback with arms i32[P], rewards f32[P, G], advantages f32[P, G], optional
      valid bool[P, G].
    num_arms: K.
    objective: one of SEC_OBJECTIVES.
    last_mean_reward: f32[K] mean reward of each arm when it was last sampled.
    visits: i32[K] earlier updates that sampled each arm.

  Returns:
    (R f32[K], 0 for unsampled arms; sampled bool[K], arm has >= 1 valid completion;
     mean_reward f32[K], this step's mean reward per arm, 0 when unsampled).
  """
  w = arms_lib.valid_weights(feedback)
  rewards = feedback.rewards.astype(jnp.float32)
  mean_reward, n = arms_lib.arm_mean(rewards, feedback.arms, w, num_arms)
  sampled = n > 0
  if objective == "abs_advantage":
    r, _ = arms_lib.arm_mean(jnp.abs(feedback.advantages.astype(jnp.float32)), feedback.arms, w,
                             num_arms)
  elif objective == "unnormalized_abs_advantage":
    gn = jnp.sum(w, axis=1, keepdims=True)
    gmean = jnp.sum(rewards * w, axis=1, keepdims=True) / jnp.maximum(gn, 1.0)
    r, _ = arms_lib.arm_mean(jnp.abs(rewards - gmean), feedback.arms, w, num_arms)
  elif objective == "learning_progress":
    r = jnp.where(visits > 0, jnp.abs(mean_reward - last_mean_reward), 0.0)
  else:
    raise ValueError(f"objective must be one of {list(SEC_OBJECTIVES)}, got {objective!r}")
  return jnp.where(sampled, r, 0.0), sampled, mean_reward


def sec_update_q(q: jax.Array, arm_reward: jax.Array, sampled: jax.Array, alpha: float,
                 unsampled: str) -> jax.Array:
  """TD(0) bandit update `Q[k] <- Q[k] + alpha (R[k] - Q[k])`.

  Sampled arms always update. Unsampled arms: "keep" leaves Q unchanged; "decay" updates with
  R = 0, i.e. Q <- (1 - alpha) Q (the released SEC code's behaviour).

  Args:
    q: f32[K]; arm_reward: f32[K]; sampled: bool[K]; alpha: step size in (0, 1];
    unsampled: "keep" | "decay".

  Returns:
    f32[K] new Q.
  """
  target = q + alpha * (arm_reward - q)
  if unsampled == "keep":
    return jnp.where(sampled, target, q)
  if unsampled == "decay":
    return jnp.where(sampled, target, (1.0 - alpha) * q)
  raise ValueError(f"unsampled must be one of {list(SEC_UNSAMPLED)}, got {unsampled!r}")


def _argmax_set_probs(score: jax.Array, allowed: jax.Array) -> jax.Array:
  """Uniform over the maximisers of `score` among allowed arms (ties share the mass)."""
  s = jnp.where(allowed, score, -jnp.inf)
  best = allowed & (s == jnp.max(s))
  return best.astype(jnp.float32) / jnp.maximum(jnp.sum(best), 1)


def sec_probabilities(q: jax.Array, visits: jax.Array, sizes: jax.Array, exploration: str,
                      temperature: float, epsilon: float, ucb_c: float) -> jax.Array:
  """Arm probabilities pi: f32[K] of SEC's selection, over arms with prompts.

    boltzmann:       pi = softmax(Q / temperature)
    epsilon_greedy:  pi = epsilon / K' + (1 - epsilon) 1[k in argmax Q] / |argmax Q|
    ucb:             pi = 1[k in argmax U] / |argmax U|, U[k] = Q[k] + c sqrt(ln N / n_k),
                     N = sum_k n_k, U = +inf for arms never sampled (each arm is tried once)

  K' is the number of arms with prompts; ties share the greedy mass equally.
  """
  allowed = sizes > 0
  if exploration == "boltzmann":
    logits = jnp.where(allowed, q / temperature, -jnp.inf)
    return jax.nn.softmax(logits)
  if exploration == "epsilon_greedy":
    unif = allowed.astype(jnp.float32) / jnp.maximum(jnp.sum(allowed), 1)
    return epsilon * unif + (1.0 - epsilon) * _argmax_set_probs(q, allowed)
  if exploration == "ucb":
    n = visits.astype(jnp.float32)
    total = jnp.maximum(jnp.sum(n), 1.0)
    bonus = ucb_c * jnp.sqrt(jnp.log(total) / jnp.maximum(n, 1.0))
    score = jnp.where(n > 0, q + bonus, jnp.inf)
    return _argmax_set_probs(score, allowed)
  raise ValueError(f"exploration must be one of {list(SEC_EXPLORATION)}, got {exploration!r}")


def sec(pool: checks.PoolOrNumArms, *, batch_size: int, alpha: float = 0.5,
        temperature: float = 1.0, unsampled: str = "keep", objective: str = "abs_advantage",
        exploration: str = "boltzmann", epsilon: float = 0.1, ucb_c: float = 1.0) -> Curriculum:
  """Self-Evolving Curriculum (SEC): curriculum selection as a non-stationary K-armed bandit.

  After each step, every sampled arm k gets a reward R[k] (`sec_arm_rewards`; by default the mean
  |advantage| of its completions, which is largest where the policy still learns) and
  `Q[k] <- Q[k] + alpha (R[k] - Q[k])`. Selection draws each of the P slots' arm i.i.d. from
  `sec_probabilities(Q)` (default softmax(Q / temperature)), then prompts without replacement
  within each arm (reshuffled when an arm is exhausted).

  Reference: Chen et al. (2025), "Self-Evolving Curriculum for LLM Reasoning", arXiv:2505.14970.

  Args:
    pool: the PromptPool (or just its number of arms K).
    batch_size: P, prompts per step.
    alpha: step size in (0, 1]; default 0.5 (the paper's).
    temperature: Boltzmann temperature tau > 0; default 1.0 (the paper's value on Countdown; it
      used 0.4 on MATH and 0.2 for 2-D arms).
    unsampled: "keep" (default; arms without samples keep Q) or "decay" (treated as R = 0, as the
      authors' released code does).
    objective: "abs_advantage" (default), "unnormalized_abs_advantage" (|r - group mean r|, no
      std division), or "learning_progress" (|change of the arm's mean reward since it was last
      sampled|).
    exploration: "boltzmann" (default), "epsilon_greedy", or "ucb".
    epsilon: uniform share of epsilon-greedy, in [0, 1]; default 0.1 (our choice).
    ucb_c: UCB bonus scale c >= 0; default 1.0 (our choice).

  Returns:
    Curriculum whose state is `SECState` (field `q: f32[K]`). Metrics: q, probs, arm_reward,
    sampled, arm_counts, visits (all f32[K]).

  Example:
    pool = PromptPool.from_arms(levels)                 # levels: int[N], 0 = easiest
    cur = sec(pool, batch_size=256, temperature=0.4)
    state = cur.init(pool, jax.random.key(0))
    selection, state = jax.jit(cur.select)(state, jax.random.fold_in(key, step))
    ...                                                 # rollout, rewards, advantages
    state, metrics = jax.jit(cur.update)(state, feedback)

  Raises:
    ValueError: on an unknown objective / unsampled / exploration, or a value out of range.
  """
  num_arms = checks.num_arms(pool)
  batch_size = checks.positive("batch_size", batch_size, integer=True)
  alpha = checks.unit("alpha", alpha, closed_low=False)
  temperature = checks.positive("temperature", temperature)
  checks.choice("unsampled", unsampled, SEC_UNSAMPLED)
  checks.choice("objective", objective, SEC_OBJECTIVES)
  checks.choice("exploration", exploration, SEC_EXPLORATION)
  epsilon = checks.unit("epsilon", epsilon)
  ucb_c = checks.non_negative("ucb_c", ucb_c)

  def init_state(sampler: ArmSamplerState) -> SECState:
    return SECState(q=jnp.zeros((num_arms,), jnp.float32),
                    visits=jnp.zeros((num_arms,), jnp.int32),
                    last_mean_reward=jnp.zeros((num_arms,), jnp.float32),
                    step=jnp.zeros((), jnp.int32), sampler=sampler)

  def probs(state: SECState) -> jax.Array:
    return sec_probabilities(state.q, state.visits, state.sampler.sizes, exploration,
                             temperature, epsilon, ucb_c)

  def update_state(state: SECState, feedback: Feedback) -> tuple[SECState, dict]:
    r, sampled, mean_reward = sec_arm_rewards(feedback, num_arms, objective,
                                              state.last_mean_reward, state.visits)
    q = sec_update_q(state.q, r, sampled, alpha, unsampled)
    visits = state.visits + sampled.astype(jnp.int32)
    last = jnp.where(sampled, mean_reward, state.last_mean_reward)
    state = state._replace(q=q, visits=visits, last_mean_reward=last, step=state.step + 1)
    metrics = {"q": q, "arm_reward": r, "sampled": sampled.astype(jnp.float32),
               "visits": visits.astype(jnp.float32)}
    return state, metrics

  return arms_lib.category_curriculum(num_arms, batch_size, init_state, probs, update_state)
