"""Category-level curricula: a distribution over K arms, then prompts drawn within the arms.

Every curriculum here is a `Curriculum(init, select, update)` of pure, jittable functions
(`rl_curriculum.curriculum.base`). The batch size P is fixed when the curriculum is built. Each
`select` computes arm probabilities `pi: f32[K]` from its state, draws P arms i.i.d. from pi and
then prompts without replacement within each arm (`arm_sampling.sample_selection`). Each `update`
reads a `Feedback` and returns `(state, metrics)`; every metrics dict holds at least

  probs:      f32[K] arm probabilities of the next `select`
  arm_counts: f32[K] prompts of each arm in the feedback

Contents (METHODS.md sections 1 and 2):
  sec                 Self-Evolving Curriculum: non-stationary bandit over arms (Q: f32[K]).
  product_arms        2-D arms (difficulty x task) as a product of two labels; split_arms inverts.
  uniform             pi proportional to pool size, or uniform over arms.
  easy_to_hard, hard_to_easy, linear_pacing, cyclical, mixed_replay   fixed schedules.
  dump                distribution-level UCB over windows of |advantage|.
  alp_teacher         absolute learning progress between a recent and an older window.
  mastering_rate      prerequisite graph; sample available, not yet mastered arms.

Arms without prompts in the pool always get probability 0. Bad construction arguments raise
ValueError naming the argument and its allowed values.
"""

from typing import Iterable, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.curriculum import arm_sampling
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import Curriculum, PromptPool
from rl_curriculum.types import Feedback, Selection

__all__ = [
    "SECState", "sec", "sec_arm_rewards", "sec_update_q", "sec_probabilities",
    "product_arms", "split_arms",
    "UniformState", "uniform",
    "ScheduleState", "easy_to_hard", "hard_to_easy", "linear_pacing", "cyclical", "mixed_replay",
    "DUMPState", "dump", "dump_scores",
    "ALPState", "alp_teacher", "alp_values",
    "MasteringState", "mastering_rate",
    "arm_mean",
]

PoolOrNumArms = Union[PromptPool, int]

SEC_OBJECTIVES = ("abs_advantage", "unnormalized_abs_advantage", "learning_progress")
SEC_UNSAMPLED = ("keep", "decay")
SEC_EXPLORATION = ("boltzmann", "epsilon_greedy", "ucb")
UNIFORM_BY = ("prompt", "arm")


# ------------------------------------------------------------------------------------------------
# Argument checks (construction time, outside jit).
# ------------------------------------------------------------------------------------------------

def _num_arms(pool_or_num_arms: PoolOrNumArms) -> int:
  if isinstance(pool_or_num_arms, PromptPool):
    return int(pool_or_num_arms.num_arms)
  if isinstance(pool_or_num_arms, (int, np.integer)) and not isinstance(pool_or_num_arms, bool):
    if pool_or_num_arms < 1:
      raise ValueError(f"pool_or_num_arms must be a PromptPool or an int >= 1, got "
                       f"{pool_or_num_arms}")
    return int(pool_or_num_arms)
  raise ValueError(f"pool_or_num_arms must be a PromptPool or an int >= 1, got "
                   f"{type(pool_or_num_arms).__name__}")


def _choice(name: str, value: str, allowed: Sequence[str]) -> str:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
  return value


def _positive(name: str, value, *, integer: bool = False):
  ok = value > 0 and (not integer or float(value).is_integer())
  if not ok:
    kind = "a positive integer" if integer else "> 0"
    raise ValueError(f"{name} must be {kind}, got {value!r}")
  return int(value) if integer else float(value)


def _unit(name: str, value, *, closed_low: bool = True, closed_high: bool = True) -> float:
  lo_ok = value >= 0 if closed_low else value > 0
  hi_ok = value <= 1 if closed_high else value < 1
  if not (lo_ok and hi_ok):
    lo = "[" if closed_low else "("
    hi = "]" if closed_high else ")"
    raise ValueError(f"{name} must lie in {lo}0, 1{hi}, got {value!r}")
  return float(value)


def _order(order: Optional[Sequence[int]], pool_or_num_arms: PoolOrNumArms) -> np.ndarray:
  """Arm order, easiest first.

  Default: with a PromptPool, the arms sorted by the mean difficulty of their prompts
  (`PromptPool.difficulty`; ties and empty arms keep index order), so a pool whose arms are
  listed in any order of difficulty still starts easy; with a number of arms, 0, 1, ..., K-1.
  """
  num_arms = _num_arms(pool_or_num_arms)
  if order is None:
    if not isinstance(pool_or_num_arms, PromptPool):
      return np.arange(num_arms, dtype=np.int32)
    arms = np.asarray(pool_or_num_arms.arms)
    diff = np.asarray(pool_or_num_arms.difficulty, np.float64)
    count = np.bincount(arms, minlength=num_arms)
    total = np.bincount(arms, weights=diff, minlength=num_arms)
    mean = np.where(count > 0, total / np.maximum(count, 1), np.inf)
    return np.argsort(mean, kind="stable").astype(np.int32)
  arr = np.asarray(order, np.int32)
  if arr.shape != (num_arms,) or sorted(arr.tolist()) != list(range(num_arms)):
    raise ValueError(f"order must be a permutation of range({num_arms}), got {list(order)}")
  return arr


def _check_init_pool(pool: PromptPool, num_arms: int) -> None:
  if pool.num_arms != num_arms:
    raise ValueError(f"the curriculum was built for {num_arms} arms but the pool has "
                     f"{pool.num_arms}; build it from this pool")


# ------------------------------------------------------------------------------------------------
# Per-arm statistics of a feedback.
# ------------------------------------------------------------------------------------------------

def _check_feedback(feedback: Feedback) -> None:
  """Checks static shapes at trace time: rewards, correct, advantages (and valid) f32[P, G]."""
  shape = feedback.rewards.shape
  if len(shape) != 2:
    raise ValueError(f"Feedback.rewards must be [P, G], got shape {shape}")
  others = [("correct", feedback.correct), ("advantages", feedback.advantages)]
  if feedback.valid is not None:
    others.append(("valid", feedback.valid))
  for name, x in others:
    if x.shape != shape:
      raise ValueError(f"Feedback.{name} has shape {x.shape}, expected {shape} like rewards")
  for name, x in [("arms", feedback.arms), ("prompt_ids", feedback.prompt_ids)]:
    if x.shape != shape[:1]:
      raise ValueError(f"Feedback.{name} has shape {x.shape}, expected ({shape[0]},)")


def _valid(feedback: Feedback) -> jax.Array:
  """f32[P, G] weight 1 on completion slots that exist."""
  if feedback.valid is None:
    return jnp.ones(feedback.rewards.shape, jnp.float32)
  return feedback.valid.astype(jnp.float32)


def arm_mean(values: jax.Array, arms: jax.Array, weights: jax.Array,
             num_arms: int) -> tuple[jax.Array, jax.Array]:
  """Weighted mean of per-completion values over the completions of each arm.

  mean[k] = sum_{p: arms[p] = k} sum_g w[p, g] x[p, g] / n[k],  n[k] = sum_{p: arms[p] = k} sum_g w

  Args:
    values: f32[P, G] per-completion values.
    arms: i32[P] arm of each prompt.
    weights: f32[P, G] non-negative weights (the validity mask).
    num_arms: K.

  Returns:
    (mean f32[K], 0 where n[k] = 0; n f32[K]).
  """
  if values.ndim != 2 or weights.shape != values.shape or arms.shape != values.shape[:1]:
    raise ValueError(f"expected values [P, G], weights [P, G], arms [P]; got {values.shape}, "
                     f"{weights.shape}, {arms.shape}")
  total = jax.ops.segment_sum(jnp.sum(values * weights, axis=1), arms, num_segments=num_arms)
  n = jax.ops.segment_sum(jnp.sum(weights, axis=1), arms, num_segments=num_arms)
  return jnp.where(n > 0, total / jnp.where(n > 0, n, 1.0), 0.0), n


def _arm_counts(arms: jax.Array, num_arms: int) -> jax.Array:
  """f32[K] number of prompts of each arm."""
  return jax.ops.segment_sum(jnp.ones(arms.shape, jnp.float32), arms, num_segments=num_arms)


def _ema_update(est: jax.Array, seen: jax.Array, obs: jax.Array, sampled: jax.Array,
                rate: float) -> tuple[jax.Array, jax.Array]:
  """Running average with constant rate; the first observation of an arm replaces the estimate."""
  new = jnp.where(seen, est + rate * (obs - est), obs)
  return jnp.where(sampled, new, est), seen | sampled


def _ring_push(buffer: jax.Array, head: jax.Array, filled: jax.Array, values: jax.Array,
               arms: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Appends values to per-arm ring buffers, oldest first overwritten.

  Args:
    buffer: f32[K, W] ring buffer per arm.
    head: i32[K] next write position of each arm.
    filled: i32[K] stored values of each arm (<= W).
    values: f32[M] new values, in order.
    arms: i32[M] arm of each value.
    keep: bool[M] which values to append.

  Returns:
    (buffer, head, filled) after appending. If an arm receives more than W values, only its last
    W are kept.
  """
  num_arms, width = buffer.shape
  onehot = (arms[:, None] == jnp.arange(num_arms)[None, :]) & keep[:, None]   # bool[M, K]
  csum = jnp.cumsum(onehot.astype(jnp.int32), axis=0)
  rank = jnp.take_along_axis(csum, arms[:, None], axis=1)[:, 0] - 1            # i32[M]
  n = csum[-1]                                                                 # i32[K]
  write = keep & (rank >= n[arms] - width)
  pos = jnp.mod(head[arms] + rank, width)
  rows = jnp.where(write, arms, num_arms)  # out-of-range rows are dropped
  buffer = buffer.at[rows, pos].set(values, mode="drop")
  head = jnp.mod(head + n, width).astype(jnp.int32)
  filled = jnp.minimum(filled + n, width).astype(jnp.int32)
  return buffer, head, filled


def _ring_ages(head: jax.Array, width: int) -> jax.Array:
  """i32[K, W] age of each buffer entry: 0 = newest, W-1 = oldest."""
  idx = jnp.arange(width, dtype=jnp.int32)[None, :]
  return jnp.mod(head[:, None] - 1 - idx, width)


def _masked_row_mean(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  n = jnp.sum(mask, axis=1)
  s = jnp.sum(jnp.where(mask, x, 0.0), axis=1)
  return jnp.where(n > 0, s / jnp.maximum(n, 1), 0.0), n


# ------------------------------------------------------------------------------------------------
# SEC: Self-Evolving Curriculum.
# ------------------------------------------------------------------------------------------------

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
  """SEC's per-arm reward R[k] for one step (METHODS.md section 1).

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
  w = _valid(feedback)
  rewards = feedback.rewards.astype(jnp.float32)
  mean_reward, n = arm_mean(rewards, feedback.arms, w, num_arms)
  sampled = n > 0
  if objective == "abs_advantage":
    r, _ = arm_mean(jnp.abs(feedback.advantages.astype(jnp.float32)), feedback.arms, w, num_arms)
  elif objective == "unnormalized_abs_advantage":
    gn = jnp.sum(w, axis=1, keepdims=True)
    gmean = jnp.sum(rewards * w, axis=1, keepdims=True) / jnp.maximum(gn, 1.0)
    r, _ = arm_mean(jnp.abs(rewards - gmean), feedback.arms, w, num_arms)
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


def sec(pool_or_num_arms: PoolOrNumArms, *, batch_size: int, alpha: float = 0.5,
        temperature: float = 1.0, unsampled: str = "keep", objective: str = "abs_advantage",
        exploration: str = "boltzmann", epsilon: float = 0.1, ucb_c: float = 1.0) -> Curriculum:
  """Self-Evolving Curriculum (SEC): curriculum selection as a non-stationary K-armed bandit.

  After each step, every sampled arm k gets a reward R[k] (`sec_arm_rewards`; by default the mean
  |advantage| of its completions, which is largest where the policy still learns) and
  `Q[k] <- Q[k] + alpha (R[k] - Q[k])`. Selection draws each of the P slots' arm i.i.d. from
  `sec_probabilities(Q)` (default softmax(Q / temperature)), then prompts without replacement
  within each arm (reshuffled when an arm is exhausted).

  Reference: Chen et al. 2025, "Self-Evolving Curriculum for LLM Reasoning" (arXiv:2505.14970).

  Args:
    pool_or_num_arms: the PromptPool (or just its number of arms K).
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
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  alpha = _unit("alpha", alpha, closed_low=False)
  temperature = _positive("temperature", temperature)
  _choice("unsampled", unsampled, SEC_UNSAMPLED)
  _choice("objective", objective, SEC_OBJECTIVES)
  _choice("exploration", exploration, SEC_EXPLORATION)
  epsilon = _unit("epsilon", epsilon)
  if ucb_c < 0:
    raise ValueError(f"ucb_c must be >= 0, got {ucb_c!r}")
  ucb_c = float(ucb_c)

  def probs_of(state: SECState) -> jax.Array:
    return sec_probabilities(state.q, state.visits, state.sampler.sizes, exploration,
                             temperature, epsilon, ucb_c)

  def init(pool: PromptPool, key: jax.Array) -> SECState:
    _check_init_pool(pool, num_arms)
    return SECState(q=jnp.zeros((num_arms,), jnp.float32),
                    visits=jnp.zeros((num_arms,), jnp.int32),
                    last_mean_reward=jnp.zeros((num_arms,), jnp.float32),
                    step=jnp.zeros((), jnp.int32),
                    sampler=arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: SECState, key: jax.Array) -> tuple[Selection, SECState]:
    sel, sampler = arm_sampling.sample_selection(state.sampler, probs_of(state), key, batch_size)
    return sel, state._replace(sampler=sampler)

  def update(state: SECState, feedback: Feedback) -> tuple[SECState, dict]:
    _check_feedback(feedback)
    r, sampled, mean_reward = sec_arm_rewards(feedback, num_arms, objective,
                                              state.last_mean_reward, state.visits)
    q = sec_update_q(state.q, r, sampled, alpha, unsampled)
    visits = state.visits + sampled.astype(jnp.int32)
    last = jnp.where(sampled, mean_reward, state.last_mean_reward)
    state = state._replace(q=q, visits=visits, last_mean_reward=last, step=state.step + 1)
    metrics = {"q": q, "probs": probs_of(state), "arm_reward": r,
               "sampled": sampled.astype(jnp.float32),
               "arm_counts": _arm_counts(feedback.arms, num_arms),
               "visits": visits.astype(jnp.float32)}
    return state, metrics

  return Curriculum(init=init, select=select, update=update)


def product_arms(labels_a, labels_b, num_a: Optional[int] = None,
                 num_b: Optional[int] = None) -> tuple[np.ndarray, int]:
  """Arms of 2-D SEC as the product of two labels: arm = a * num_b + b.

  Args:
    labels_a: int[N] first label (for example difficulty), in [0, num_a).
    labels_b: int[N] second label (for example task), in [0, num_b).
    num_a, num_b: label counts; default max + 1.

  Returns:
    (arms i32[N], K = num_a * num_b).

  Raises:
    ValueError: on mismatched shapes or labels out of range.
  """
  a = np.asarray(labels_a, np.int64)
  b = np.asarray(labels_b, np.int64)
  if a.ndim != 1 or a.shape != b.shape or a.size == 0:
    raise ValueError(f"labels_a and labels_b must be non-empty 1-D arrays of one shape, got "
                     f"{a.shape} and {b.shape}")
  num_a = int(a.max()) + 1 if num_a is None else int(num_a)
  num_b = int(b.max()) + 1 if num_b is None else int(num_b)
  if a.min() < 0 or a.max() >= num_a:
    raise ValueError(f"labels_a must lie in [0, {num_a}), got [{a.min()}, {a.max()}]")
  if b.min() < 0 or b.max() >= num_b:
    raise ValueError(f"labels_b must lie in [0, {num_b}), got [{b.min()}, {b.max()}]")
  return (a * num_b + b).astype(np.int32), num_a * num_b


def split_arms(arms, num_b: int) -> tuple:
  """Inverse of `product_arms`: (a, b) = (arms // num_b, arms % num_b); works on NumPy or JAX."""
  return arms // num_b, arms % num_b


# ------------------------------------------------------------------------------------------------
# Uniform baseline.
# ------------------------------------------------------------------------------------------------

class UniformState(NamedTuple):
  """State of `uniform`."""
  sampler: ArmSamplerState  # per-arm permutations and cursors


def uniform(pool_or_num_arms: PoolOrNumArms, *, batch_size: int,
            by: str = "prompt") -> Curriculum:
  """Uniform baseline: pi(k) = N_k / N (by="prompt", default) or 1 / K' (by="arm").

  N_k is the number of prompts of arm k and K' the number of non-empty arms. Prompts are drawn
  without replacement within each arm, as for every category-level curriculum.

  Raises:
    ValueError: if `by` is not "prompt" or "arm", or batch_size < 1.
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  _choice("by", by, UNIFORM_BY)

  def probs_of(state: UniformState) -> jax.Array:
    sizes = state.sampler.sizes
    w = sizes.astype(jnp.float32) if by == "prompt" else (sizes > 0).astype(jnp.float32)
    return w / jnp.sum(w)

  def init(pool: PromptPool, key: jax.Array) -> UniformState:
    _check_init_pool(pool, num_arms)
    return UniformState(sampler=arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: UniformState, key: jax.Array) -> tuple[Selection, UniformState]:
    sel, sampler = arm_sampling.sample_selection(state.sampler, probs_of(state), key, batch_size)
    return sel, UniformState(sampler=sampler)

  def update(state: UniformState, feedback: Feedback) -> tuple[UniformState, dict]:
    _check_feedback(feedback)
    return state, {"probs": probs_of(state),
                   "arm_counts": _arm_counts(feedback.arms, num_arms)}

  return Curriculum(init=init, select=select, update=update)


# ------------------------------------------------------------------------------------------------
# Fixed schedules.
# ------------------------------------------------------------------------------------------------

class ScheduleState(NamedTuple):
  """State shared by the fixed schedules."""
  step: jax.Array         # i32[] updates so far
  stage: jax.Array        # i32[] position in `order` of the current arm (progressive schedules)
  stage_start: jax.Array  # i32[] step at which the current stage began
  accuracy: jax.Array     # f32[K] running accuracy (constant-rate average of correctness)
  seen: jax.Array         # bool[K] arm has been sampled at least once
  sampler: ArmSamplerState


def _allowed_prefix(order: jax.Array, m: jax.Array) -> jax.Array:
  """bool[K]: arm k is among the first m arms of `order`."""
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  return rank < m


def _schedule(num_arms, batch_size, order, probs_fn, steps_per_arm, accuracy_threshold,
              accuracy_rate) -> Curriculum:
  """Builds a schedule from `probs_fn(state, order) -> f32[K]` (before masking empty arms)."""
  order_np = order

  def probs_of(state: ScheduleState) -> jax.Array:
    order_j = jnp.asarray(order_np)
    return arm_sampling.mask_empty_arms(probs_fn(state, order_j), state.sampler.sizes)

  def init(pool: PromptPool, key: jax.Array) -> ScheduleState:
    _check_init_pool(pool, num_arms)
    zero = jnp.zeros((), jnp.int32)
    return ScheduleState(step=zero, stage=zero, stage_start=zero,
                         accuracy=jnp.zeros((num_arms,), jnp.float32),
                         seen=jnp.zeros((num_arms,), bool),
                         sampler=arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: ScheduleState, key: jax.Array) -> tuple[Selection, ScheduleState]:
    sel, sampler = arm_sampling.sample_selection(state.sampler, probs_of(state), key, batch_size)
    return sel, state._replace(sampler=sampler)

  def update(state: ScheduleState, feedback: Feedback) -> tuple[ScheduleState, dict]:
    _check_feedback(feedback)
    acc_obs, n = arm_mean(feedback.correct.astype(jnp.float32), feedback.arms, _valid(feedback),
                          num_arms)
    accuracy, seen = _ema_update(state.accuracy, state.seen, acc_obs, n > 0, accuracy_rate)
    step = state.step + 1
    current = jnp.asarray(order_np)[state.stage]
    advance = jnp.zeros((), bool)
    if steps_per_arm is not None:
      advance = advance | (step - state.stage_start >= steps_per_arm)
    if accuracy_threshold is not None:
      advance = advance | (seen[current] & (accuracy[current] > accuracy_threshold))
    advance = advance & (state.stage < num_arms - 1)
    state = state._replace(step=step, stage=state.stage + advance.astype(jnp.int32),
                           stage_start=jnp.where(advance, step, state.stage_start),
                           accuracy=accuracy, seen=seen)
    metrics = {"probs": probs_of(state), "arm_counts": _arm_counts(feedback.arms, num_arms),
               "accuracy": accuracy, "stage": state.stage.astype(jnp.float32)}
    return state, metrics

  return Curriculum(init=init, select=select, update=update)


def _progress_args(steps_per_arm, accuracy_threshold, accuracy_rate):
  if steps_per_arm is None and accuracy_threshold is None:
    raise ValueError("steps_per_arm and accuracy_threshold cannot both be None: the schedule "
                     "would never advance")
  if steps_per_arm is not None:
    steps_per_arm = _positive("steps_per_arm", steps_per_arm, integer=True)
  if accuracy_threshold is not None:
    accuracy_threshold = _unit("accuracy_threshold", accuracy_threshold)
  accuracy_rate = _unit("accuracy_rate", accuracy_rate, closed_low=False)
  return steps_per_arm, accuracy_threshold, accuracy_rate


def easy_to_hard(pool_or_num_arms: PoolOrNumArms, *, batch_size: int,
                 order: Optional[Sequence[int]] = None, steps_per_arm: Optional[int] = 50,
                 accuracy_threshold: Optional[float] = None,
                 accuracy_rate: float = 0.2) -> Curriculum:
  """Fixed easy-to-hard schedule: all P slots on the current arm, then the next one.

  The current arm is `order[stage]` (default: the pool's arms by increasing mean difficulty, or
  0, 1, ..., K-1 when built from a number of arms; see `_order`). The stage
  advances after `steps_per_arm` updates on it (default 50, our choice; None disables), or when
  the arm's running accuracy exceeds `accuracy_threshold` (default None = off), whichever comes
  first; it stays on the last arm. Running accuracy: `acc <- acc + accuracy_rate (mean correct -
  acc)` per step that samples the arm (default rate 0.2), starting from the first observation.

  Raises:
    ValueError: bad order, both criteria None, or values out of range.
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  order = _order(order, pool_or_num_arms)
  args = _progress_args(steps_per_arm, accuracy_threshold, accuracy_rate)

  def probs_fn(state, order_j):
    return jax.nn.one_hot(order_j[state.stage], num_arms, dtype=jnp.float32)

  return _schedule(num_arms, batch_size, order, probs_fn, *args)


def hard_to_easy(pool_or_num_arms: PoolOrNumArms, *, batch_size: int,
                 order: Optional[Sequence[int]] = None, steps_per_arm: Optional[int] = 50,
                 accuracy_threshold: Optional[float] = None,
                 accuracy_rate: float = 0.2) -> Curriculum:
  """Reverse schedule: `easy_to_hard` walking `order` (default easiest first, as there)
  backwards."""
  num_arms = _num_arms(pool_or_num_arms)
  order = _order(order, pool_or_num_arms)[::-1].copy()
  return easy_to_hard(num_arms, batch_size=batch_size, order=order, steps_per_arm=steps_per_arm,
                      accuracy_threshold=accuracy_threshold, accuracy_rate=accuracy_rate)


def linear_pacing(pool_or_num_arms: PoolOrNumArms, *, batch_size: int,
                  order: Optional[Sequence[int]] = None, steps_to_full: int = 100,
                  start_arms: int = 1) -> Curriculum:
  """Linear pacing: uniform over the first m(t) arms of `order`, a set that grows over training.

  m(t) = min(K, start_arms + floor((K - start_arms) t / steps_to_full)), t = updates so far;
  defaults steps_to_full = 100 and start_arms = 1 (our choices).

  Raises:
    ValueError: bad order, steps_to_full < 1, or start_arms outside [1, K].
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  order = _order(order, pool_or_num_arms)
  steps_to_full = _positive("steps_to_full", steps_to_full, integer=True)
  if not 1 <= start_arms <= num_arms:
    raise ValueError(f"start_arms must lie in [1, {num_arms}], got {start_arms!r}")

  def probs_fn(state, order_j):
    m = start_arms + ((num_arms - start_arms) * state.step) // steps_to_full
    m = jnp.minimum(m, num_arms)
    return _allowed_prefix(order_j, m).astype(jnp.float32)

  return _schedule(num_arms, batch_size, order, probs_fn, None, None, 1.0)


def cyclical(pool_or_num_arms: PoolOrNumArms, *, batch_size: int,
             order: Optional[Sequence[int]] = None, period: int = 100,
             start_arms: int = 1) -> Curriculum:
  """Cyclical pacing: uniform over the first m(t) arms of `order`, growing then shrinking.

  With phase = (t mod period) / period and a triangle wave tri = 1 - |2 phase - 1| (0 at the start
  of a period, 1 half-way), m(t) = start_arms + round((K - start_arms) tri). Defaults period = 100
  and start_arms = 1 (our choices).

  Raises:
    ValueError: bad order, period < 1, or start_arms outside [1, K].
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  order = _order(order, pool_or_num_arms)
  period = _positive("period", period, integer=True)
  if not 1 <= start_arms <= num_arms:
    raise ValueError(f"start_arms must lie in [1, {num_arms}], got {start_arms!r}")

  def probs_fn(state, order_j):
    phase = jnp.mod(state.step, period).astype(jnp.float32) / period
    tri = 1.0 - jnp.abs(2.0 * phase - 1.0)
    m = start_arms + jnp.round((num_arms - start_arms) * tri).astype(jnp.int32)
    return _allowed_prefix(order_j, m).astype(jnp.float32)

  return _schedule(num_arms, batch_size, order, probs_fn, None, None, 1.0)


def mixed_replay(pool_or_num_arms: PoolOrNumArms, *, batch_size: int,
                 order: Optional[Sequence[int]] = None, replay_prob: float = 0.2,
                 steps_per_arm: Optional[int] = 50, accuracy_threshold: Optional[float] = None,
                 accuracy_rate: float = 0.2) -> Curriculum:
  """Progressive schedule with replay: pi = (1 - rho) 1[current] + rho uniform(earlier arms).

  The current arm advances as in `easy_to_hard`; rho = `replay_prob` (default 0.2, our choice)
  of the mass goes uniformly to the arms before the current one in `order` (none at stage 0, when
  all mass stays on the current arm).

  Raises:
    ValueError: bad order, replay_prob outside [0, 1], or bad advance criteria.
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  order = _order(order, pool_or_num_arms)
  rho = _unit("replay_prob", replay_prob)
  args = _progress_args(steps_per_arm, accuracy_threshold, accuracy_rate)

  def probs_fn(state, order_j):
    current = jax.nn.one_hot(order_j[state.stage], num_arms, dtype=jnp.float32)
    earlier = _allowed_prefix(order_j, state.stage).astype(jnp.float32)
    n_earlier = jnp.sum(earlier)
    replay = earlier / jnp.maximum(n_earlier, 1.0)
    return jnp.where(n_earlier > 0, (1.0 - rho) * current + rho * replay, current)

  return _schedule(num_arms, batch_size, order, probs_fn, *args)


# ------------------------------------------------------------------------------------------------
# DUMP: distribution-level UCB over windows of |advantage|.
# ------------------------------------------------------------------------------------------------

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
      which is how `_ring_push` fills it from position 0); counts: i32[K].

  Returns:
    f32[K]; an empty window has mean 0.
  """
  width = window.shape[1]
  mask = jnp.arange(width)[None, :] < filled[:, None]
  mean, _ = _masked_row_mean(window, mask)
  n = counts.astype(jnp.float32)
  return mean + jnp.sqrt(2.0 * jnp.log(jnp.sum(n) + 1.0) / (n + 1.0))


def dump(pool_or_num_arms: PoolOrNumArms, *, batch_size: int, window: int = 300,
         temperature: float = 0.1) -> Curriculum:
  """DUMP: distribution-level curriculum by UCB over the recent mean |advantage| of each arm.

  Each arm keeps its last W per-completion |A| (valid completions only) and a count n_k of its
  prompts trained so far (our reading of "times the arm was sampled": one per prompt). Arms are
  drawn from softmax(s / T) with s = `dump_scores`. Validation rewards are never used as
  advantages (the released code did; METHODS.md says not to).

  Reference: Wang et al. 2025, "DUMP: Automated Distribution-Level Curriculum Learning for
  RL-based LLM Post-training" (arXiv:2504.09710).

  Args:
    pool_or_num_arms: the PromptPool or K.
    batch_size: P.
    window: W, default 300.
    temperature: T > 0, default 0.1.

  Returns:
    Curriculum with `DUMPState`; metrics: probs, score, window_mean, counts, arm_counts.

  Raises:
    ValueError: window < 1 or temperature <= 0.
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  width = _positive("window", window, integer=True)
  temperature = _positive("temperature", temperature)

  def probs_of(state: DUMPState) -> jax.Array:
    s = dump_scores(state.window, state.filled, state.counts)
    logits = jnp.where(state.sampler.sizes > 0, s / temperature, -jnp.inf)
    return jax.nn.softmax(logits)

  def init(pool: PromptPool, key: jax.Array) -> DUMPState:
    _check_init_pool(pool, num_arms)
    zeros = jnp.zeros((num_arms,), jnp.int32)
    return DUMPState(window=jnp.zeros((num_arms, width), jnp.float32), filled=zeros, head=zeros,
                     counts=zeros,
                     sampler=arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: DUMPState, key: jax.Array) -> tuple[Selection, DUMPState]:
    sel, sampler = arm_sampling.sample_selection(state.sampler, probs_of(state), key, batch_size)
    return sel, state._replace(sampler=sampler)

  def update(state: DUMPState, feedback: Feedback) -> tuple[DUMPState, dict]:
    _check_feedback(feedback)
    p, g = feedback.advantages.shape
    valid = _valid(feedback) > 0
    values = jnp.abs(feedback.advantages.astype(jnp.float32)).reshape(p * g)
    arms = jnp.broadcast_to(feedback.arms[:, None], (p, g)).reshape(p * g)
    buf, head, filled = _ring_push(state.window, state.head, state.filled, values, arms,
                                   valid.reshape(p * g))
    arm_counts = _arm_counts(feedback.arms, num_arms)
    counts = state.counts + arm_counts.astype(jnp.int32)
    state = state._replace(window=buf, head=head, filled=filled, counts=counts)
    mask = jnp.arange(width)[None, :] < filled[:, None]
    metrics = {"probs": probs_of(state), "score": dump_scores(buf, filled, counts),
               "window_mean": _masked_row_mean(buf, mask)[0],
               "counts": counts.astype(jnp.float32), "arm_counts": arm_counts}
    return state, metrics

  return Curriculum(init=init, select=select, update=update)


# ------------------------------------------------------------------------------------------------
# Absolute learning progress teacher.
# ------------------------------------------------------------------------------------------------

class ALPState(NamedTuple):
  """State of `alp_teacher`: per-arm ring buffers of the last 2W steps that sampled the arm."""
  sums: jax.Array     # f32[K, 2W] correct completions of arm k in each stored step
  counts: jax.Array   # f32[K, 2W] valid completions of arm k in each stored step (> 0 if stored)
  filled: jax.Array   # i32[K] steps stored (<= 2W)
  head: jax.Array     # i32[K] next write position
  sampler: ArmSamplerState


def alp_values(sums: jax.Array, counts: jax.Array, filled: jax.Array,
               head: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Absolute learning progress per arm from ring buffers of the arm's last 2W steps.

  Entry j of arm k holds one step: s[k, j] correct out of n[k, j] valid completions. With R the W
  newest stored steps of arm k and O the (up to) W stored before them,
    recent[k] = sum_{j in R} s[k, j] / sum_{j in R} n[k, j]   (0 while R is empty),
    older[k]  = sum_{j in O} s[k, j] / sum_{j in O} n[k, j]   (0 while O is empty),
    ALP[k]    = |recent[k] - older[k]|, and 0 while O is empty.
  The means are weighted by completions, so a step with few valid completions counts little.

  Args:
    sums: f32[K, 2W]; counts: f32[K, 2W]; filled: i32[K]; head: i32[K] (see `ALPState`).

  Returns:
    (alp f32[K], recent f32[K], older f32[K]).
  """
  width2 = sums.shape[1]
  w = width2 // 2
  age = _ring_ages(head, width2)
  stored = age < filled[:, None]

  def window_mean(mask):
    n = jnp.sum(jnp.where(mask, counts, 0.0), axis=1)
    s = jnp.sum(jnp.where(mask, sums, 0.0), axis=1)
    return jnp.where(n > 0, s / jnp.where(n > 0, n, 1.0), 0.0), n

  recent, _ = window_mean(stored & (age < w))
  older, n_old = window_mean(stored & (age >= w))
  alp = jnp.where(n_old > 0, jnp.abs(recent - older), 0.0)
  return alp, recent, older


def alp_teacher(pool_or_num_arms: PoolOrNumArms, *, batch_size: int, window: int = 8,
                epsilon: float = 0.2) -> Curriculum:
  """Absolute-learning-progress teacher over arms (the bin version of ALP-GMM).

  Windows count STEPS in which the arm was sampled, not completions: every update pushes, for
  each arm with at least one valid completion, one entry (correct completions, valid
  completions) of that step. ALP = |success rate over the arm's W newest steps - success rate
  over the W steps before| (`alp_values`), so progress is measured between updates of the policy
  and not between two halves of one batch (a window of W completions would fill both halves from
  a single step of P x G outcomes). Arms not sampled in a step keep their windows.

  pi = epsilon / K' + (1 - epsilon) ALP / sum ALP over the K' non-empty arms, and uniform over
  them while every ALP is 0 (in particular until some arm has been sampled in W + 1 steps).
  Defaults W = 8 steps and epsilon = 0.2 are our choices: the progress between the two windows
  grows with W while their sampling noise shrinks as 1 / sqrt(W) (a step gives a sampled arm tens
  to hundreds of outcomes), and ALP still reacts within 2W = 16 steps of the arm. Success is read
  from `Feedback.correct`, never from the shaped reward.

  Reference: Portelas et al. 2019, "Teacher algorithms for curriculum learning of Deep RL in
  continuously parameterized environments" (arXiv:1910.07224).

  Args:
    pool_or_num_arms: the PromptPool or K.
    batch_size: P.
    window: W, steps per window, default 8.
    epsilon: share of uniform exploration, default 0.2.

  Returns:
    Curriculum with `ALPState`; metrics: probs, alp, recent, older, arm_counts.

  Raises:
    ValueError: window < 1 or epsilon outside [0, 1].
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  width = _positive("window", window, integer=True)
  epsilon = _unit("epsilon", epsilon)

  def probs_of(state: ALPState) -> jax.Array:
    alp, _, _ = alp_values(state.sums, state.counts, state.filled, state.head)
    nonempty = state.sampler.sizes > 0
    unif = nonempty.astype(jnp.float32) / jnp.maximum(jnp.sum(nonempty), 1)
    alp = jnp.where(nonempty, alp, 0.0)
    total = jnp.sum(alp)
    greedy = jnp.where(total > 0, alp / jnp.where(total > 0, total, 1.0), unif)
    return epsilon * unif + (1.0 - epsilon) * greedy

  def init(pool: PromptPool, key: jax.Array) -> ALPState:
    _check_init_pool(pool, num_arms)
    zeros = jnp.zeros((num_arms,), jnp.int32)
    ring = jnp.zeros((num_arms, 2 * width), jnp.float32)
    return ALPState(sums=ring, counts=ring, filled=zeros, head=zeros,
                    sampler=arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: ALPState, key: jax.Array) -> tuple[Selection, ALPState]:
    sel, sampler = arm_sampling.sample_selection(state.sampler, probs_of(state), key, batch_size)
    return sel, state._replace(sampler=sampler)

  def update(state: ALPState, feedback: Feedback) -> tuple[ALPState, dict]:
    _check_feedback(feedback)
    valid = _valid(feedback)
    correct = jnp.sum(feedback.correct.astype(jnp.float32) * valid, axis=1)      # f32[P]
    s = jax.ops.segment_sum(correct, feedback.arms, num_segments=num_arms)      # f32[K]
    n = jax.ops.segment_sum(jnp.sum(valid, axis=1), feedback.arms, num_segments=num_arms)
    sampled = n > 0                                                               # bool[K]
    # Arms without a valid completion push nothing: windows count the steps that sampled them.
    write = sampled[:, None] & (jnp.arange(2 * width)[None, :] == state.head[:, None])
    sums = jnp.where(write, s[:, None], state.sums)
    counts = jnp.where(write, n[:, None], state.counts)
    step = sampled.astype(jnp.int32)
    head = jnp.mod(state.head + step, 2 * width).astype(jnp.int32)
    filled = jnp.minimum(state.filled + step, 2 * width).astype(jnp.int32)
    state = state._replace(sums=sums, counts=counts, filled=filled, head=head)
    alp, recent, older = alp_values(sums, counts, filled, head)
    metrics = {"probs": probs_of(state), "alp": alp, "recent": recent, "older": older,
               "arm_counts": _arm_counts(feedback.arms, num_arms)}
    return state, metrics

  return Curriculum(init=init, select=select, update=update)


# ------------------------------------------------------------------------------------------------
# Mastering-rate teacher.
# ------------------------------------------------------------------------------------------------

class MasteringState(NamedTuple):
  """State of `mastering_rate`."""
  success: jax.Array  # f32[K] running success rate of each arm (0 before its first sample)
  seen: jax.Array     # bool[K] arm has been sampled at least once
  step: jax.Array     # i32[] updates so far
  sampler: ArmSamplerState


def _prerequisite_matrix(prerequisites: Optional[Iterable[tuple[int, int]]], order: np.ndarray,
                         num_arms: int) -> np.ndarray:
  """bool[K, K]: m[j, k] = arm j is a prerequisite of arm k."""
  m = np.zeros((num_arms, num_arms), bool)
  if prerequisites is None:
    for before, after in zip(order[:-1], order[1:]):
      m[before, after] = True
    return m
  for pair in prerequisites:
    if len(pair) != 2:
      raise ValueError(f"prerequisites must be (before, after) pairs, got {pair!r}")
    before, after = int(pair[0]), int(pair[1])
    if not (0 <= before < num_arms and 0 <= after < num_arms) or before == after:
      raise ValueError(f"prerequisites must be pairs of distinct arms in [0, {num_arms}), got "
                       f"{pair!r}")
    m[before, after] = True
  return m


def mastering_rate(pool_or_num_arms: PoolOrNumArms, *, batch_size: int,
                   order: Optional[Sequence[int]] = None,
                   prerequisites: Optional[Iterable[tuple[int, int]]] = None,
                   unlock_threshold: float = 0.5, mastery_threshold: float = 0.9,
                   rate: float = 0.2) -> Curriculum:
  """Mastering-rate teacher: practise the arms that are available and not yet mastered.

  Arm k is available when every prerequisite j of k has running success >= unlock_threshold
  (default 0.5); it is mastered when its own running success >= mastery_threshold (default 0.9).
  pi is uniform over available, non-mastered, non-empty arms (over available arms once all of
  them are mastered). Prerequisites are (before, after) pairs; default a chain along `order`
  (easiest first, the default `order` of `easy_to_hard`). Running success: `s <- s + rate (mean
  correct - s)` per step that samples the arm (default rate 0.2), starting from the first
  observation. Defaults are ours.

  Reference: Willems et al. 2020, "Mastering Rate based Curriculum Learning" (arXiv:2008.06456).

  Raises:
    ValueError: bad order or prerequisites, thresholds or rate outside [0, 1].
  """
  num_arms = _num_arms(pool_or_num_arms)
  batch_size = _positive("batch_size", batch_size, integer=True)
  order = _order(order, pool_or_num_arms)
  prereq_np = _prerequisite_matrix(prerequisites, order, num_arms)
  unlock = _unit("unlock_threshold", unlock_threshold)
  mastery = _unit("mastery_threshold", mastery_threshold)
  rate = _unit("rate", rate, closed_low=False)

  def sets_of(state: MasteringState) -> tuple[jax.Array, jax.Array]:
    prereq = jnp.asarray(prereq_np)
    ok = state.success[:, None] >= unlock                        # bool[K, 1] over j
    available = jnp.all(~prereq | ok, axis=0)                     # bool[K] over k
    mastered = state.success >= mastery
    return available, mastered

  def probs_of(state: MasteringState) -> jax.Array:
    available, mastered = sets_of(state)
    nonempty = state.sampler.sizes > 0
    cand = available & ~mastered & nonempty
    fallback = available & nonempty
    w = jnp.where(jnp.any(cand), cand, fallback).astype(jnp.float32)
    return arm_sampling.mask_empty_arms(w, state.sampler.sizes)

  def init(pool: PromptPool, key: jax.Array) -> MasteringState:
    _check_init_pool(pool, num_arms)
    return MasteringState(success=jnp.zeros((num_arms,), jnp.float32),
                          seen=jnp.zeros((num_arms,), bool), step=jnp.zeros((), jnp.int32),
                          sampler=arm_sampling.init_arm_sampler(pool.arms, num_arms, key))

  def select(state: MasteringState, key: jax.Array) -> tuple[Selection, MasteringState]:
    sel, sampler = arm_sampling.sample_selection(state.sampler, probs_of(state), key, batch_size)
    return sel, state._replace(sampler=sampler)

  def update(state: MasteringState, feedback: Feedback) -> tuple[MasteringState, dict]:
    _check_feedback(feedback)
    obs, n = arm_mean(feedback.correct.astype(jnp.float32), feedback.arms, _valid(feedback),
                      num_arms)
    success, seen = _ema_update(state.success, state.seen, obs, n > 0, rate)
    state = state._replace(success=success, seen=seen, step=state.step + 1)
    available, mastered = sets_of(state)
    metrics = {"probs": probs_of(state), "success": success,
               "available": available.astype(jnp.float32),
               "mastered": mastered.astype(jnp.float32),
               "arm_counts": _arm_counts(feedback.arms, num_arms)}
    return state, metrics

  return Curriculum(init=init, select=select, update=update)
