"""Per-prompt statistics shared by the prompt-level curricula.

One store of arrays indexed by prompt id (N prompts in the pool). Every prompt-level curriculum
(VCRL, VADE, GRESO, PCL, hard-focus retention, AdaRFT) keeps a `PromptStats` in its state and calls
`update` with the step's feedback, so all of them read the same counts.

All counts come from the raw correctness `Feedback.correct`, never from the shaped reward, and only
completion slots with `Feedback.valid` set count (all of them when `valid` is None).

Duplicate prompt ids in one batch. When a prompt id appears in several rows of the same feedback,
the rows are pooled into ONE observation of that prompt: their valid completions are added together
(scatter-add), the accuracy is the pooled accuracy, the zero-variance test looks at the pooled
completions, and the streak advances at most once. The result does not depend on the order of the
rows. A row with no valid completion is not an observation (the prompt's entries stay unchanged).

Example:

  store = prompt_stats.init(num_prompts=1000)
  store = prompt_stats.update(store, feedback, step=0)
"""

from typing import NamedTuple, Union

import chex
import jax
import jax.numpy as jnp

from rl_curriculum.types import Feedback

# Values of `PromptStats.streak_kind`.
KIND_NONE = 0  # the last observation had mixed outcomes, or the prompt was never observed
KIND_EASY = 1  # zero-variance streak of all-correct groups
KIND_HARD = 2  # zero-variance streak of all-wrong groups


class PromptStats(NamedTuple):
  """Arrays indexed by prompt id; N prompts."""
  attempts: jax.Array       # i32[N] valid completions observed so far
  successes: jax.Array      # i32[N] correct completions observed so far
  last_accuracy: jax.Array  # f32[N] accuracy of the last observation; -1 if never observed
  last_step: jax.Array      # i32[N] step of the last observation; -1 if never observed
  streak: jax.Array         # i32[N] consecutive observations that were zero-variance (same kind)
  streak_kind: jax.Array    # i32[N] KIND_NONE / KIND_EASY (all correct) / KIND_HARD (all wrong)
  beta_a: jax.Array         # f32[N] Beta posterior a (prior_a + successes, before any decay)
  beta_b: jax.Array         # f32[N] Beta posterior b (prior_b + failures, before any decay)
  prior_a: jax.Array        # f32[] Beta prior a
  prior_b: jax.Array        # f32[] Beta prior b


def init(num_prompts: int, *, prior_a: float = 1.0, prior_b: float = 1.0) -> PromptStats:
  """An empty store for `num_prompts` prompts with a Beta(prior_a, prior_b) prior on each.

  Raises:
    ValueError: if num_prompts < 1 or a prior parameter is not positive.
  """
  if int(num_prompts) < 1:
    raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
  if not (prior_a > 0 and prior_b > 0):
    raise ValueError(f"prior_a and prior_b must be > 0, got {prior_a}, {prior_b}")
  n = int(num_prompts)
  return PromptStats(
      attempts=jnp.zeros((n,), jnp.int32),
      successes=jnp.zeros((n,), jnp.int32),
      last_accuracy=jnp.full((n,), -1.0, jnp.float32),
      last_step=jnp.full((n,), -1, jnp.int32),
      streak=jnp.zeros((n,), jnp.int32),
      streak_kind=jnp.zeros((n,), jnp.int32),
      beta_a=jnp.full((n,), prior_a, jnp.float32),
      beta_b=jnp.full((n,), prior_b, jnp.float32),
      prior_a=jnp.asarray(prior_a, jnp.float32),
      prior_b=jnp.asarray(prior_b, jnp.float32),
  )


def valid_mask(feedback: Feedback) -> jax.Array:
  """bool[P, G]: the completion slots that count (`feedback.valid`, or all when it is None)."""
  if feedback.valid is None:
    return jnp.ones(feedback.correct.shape, bool)
  return jnp.asarray(feedback.valid, bool)


def group_counts(feedback: Feedback) -> tuple[jax.Array, jax.Array]:
  """Valid and correct completions of each row: (n i32[P], s i32[P]), from raw correctness."""
  chex.assert_rank([feedback.prompt_ids, feedback.correct], [1, 2])
  chex.assert_equal_shape_prefix([feedback.prompt_ids, feedback.correct], 1)
  valid = valid_mask(feedback)
  chex.assert_equal_shape([valid, feedback.correct])
  correct = jnp.asarray(feedback.correct, bool) & valid
  return valid.sum(axis=1, dtype=jnp.int32), correct.sum(axis=1, dtype=jnp.int32)


def pooled_counts(feedback: Feedback, num_prompts: int) -> tuple[jax.Array, jax.Array]:
  """Valid and correct completions per prompt id, rows with the same id added: (i32[N], i32[N])."""
  n_row, s_row = group_counts(feedback)
  ids = jnp.asarray(feedback.prompt_ids, jnp.int32)
  n = jnp.zeros((num_prompts,), jnp.int32).at[ids].add(n_row)
  s = jnp.zeros((num_prompts,), jnp.int32).at[ids].add(s_row)
  return n, s


def update(store: PromptStats, feedback: Feedback, step: Union[int, jax.Array]) -> PromptStats:
  """Adds one step's feedback to the store (duplicate ids pooled, see the module docstring).

  For each prompt i observed in the step with n_i > 0 valid completions of which s_i are correct:
    attempts += n_i;  successes += s_i;  last_accuracy = s_i / n_i;  last_step = step
    beta_a += s_i;  beta_b += n_i - s_i
    streak, kind = (streak + 1, kind) if the group is zero-variance of the same kind as the streak,
                   (1, new kind)      if it is zero-variance of the other kind (or a new streak),
                   (0, KIND_NONE)     if its outcomes are mixed.
  Zero-variance means s_i == n_i (easy) or s_i == 0 (hard).

  Args:
    store: the store.
    feedback: prompt_ids i32[P], correct bool[P, G], optional valid bool[P, G].
    step: i32[] the training step of this feedback.
  Returns:
    The updated store; prompts not in the feedback are unchanged.
  """
  num_prompts = store.attempts.shape[0]
  n, s = pooled_counts(feedback, num_prompts)
  seen = n > 0
  easy = seen & (s == n)
  hard = seen & (s == 0)
  kind = jnp.where(easy, KIND_EASY, jnp.where(hard, KIND_HARD, KIND_NONE)).astype(jnp.int32)
  continues = (kind != KIND_NONE) & (kind == store.streak_kind)
  streak = jnp.where(continues, store.streak + 1, jnp.where(kind != KIND_NONE, 1, 0))
  accuracy = s.astype(jnp.float32) / jnp.maximum(n, 1).astype(jnp.float32)
  return store._replace(
      attempts=store.attempts + n,
      successes=store.successes + s,
      last_accuracy=jnp.where(seen, accuracy, store.last_accuracy),
      last_step=jnp.where(seen, jnp.asarray(step, jnp.int32), store.last_step),
      streak=jnp.where(seen, streak, store.streak).astype(jnp.int32),
      streak_kind=jnp.where(seen, kind, store.streak_kind),
      beta_a=store.beta_a + s.astype(jnp.float32),
      beta_b=store.beta_b + (n - s).astype(jnp.float32),
  )


def decay_beta(store: PromptStats, factor: Union[float, jax.Array]) -> PromptStats:
  """Shrinks the Beta parameters toward the prior: a <- prior_a + factor * (a - prior_a), same b.

  Args:
    store: the store.
    factor: f32[] or f32[N] in [0, 1]; 1 keeps the evidence, 0 resets to the prior.
  """
  factor = jnp.asarray(factor, jnp.float32)
  return store._replace(
      beta_a=store.prior_a + factor * (store.beta_a - store.prior_a),
      beta_b=store.prior_b + factor * (store.beta_b - store.prior_b),
  )
