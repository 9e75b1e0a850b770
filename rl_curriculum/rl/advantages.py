"""Advantage estimators for group-sampled RL post-training.

Every estimator maps the scalar rewards of P prompts with G completions each to one advantage per
completion. They are pure functions of arrays, safe under `jax.jit`, and compute in float32 whatever
the input floating dtype.

Shape legend (see `rl_curriculum.types`): P prompts, G completions per prompt (a group), B rows
(B = P * G), T tokens.

Variable rollout budgets (a different number of completions per prompt) allocate G slots per
prompt and mark the slots that exist with `valid: bool[P, G]`. Where an estimator takes `valid`,
group statistics are computed over valid entries only and invalid entries get advantage 0;
`valid=None` means every slot exists.

Groups whose valid rewards are all equal carry no learning signal: the group-relative estimators
(`rloo`, `grpo`, `dr_grpo`, `reinforce_pp`) give them exactly 0 rather than the rounding residue of
`r - mean(r)`, so that a constant group never receives a spurious sign.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp

__all__ = [
    "rloo",
    "grpo",
    "dr_grpo",
    "reinforce_pp",
    "counterfactual",
    "ESTIMATORS",
    "GRPO_STDS",
    "group_advantages",
    "gae",
    "broadcast_to_tokens",
]


def _prepare(rewards: jax.Array, valid: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
  """Checks shapes and returns (rewards f32[P, G], valid f32[P, G] in {0, 1})."""
  chex.assert_rank(rewards, 2)
  chex.assert_type(rewards, float)
  rewards = rewards.astype(jnp.float32)
  if valid is None:
    return rewards, jnp.ones_like(rewards)
  chex.assert_shape(valid, rewards.shape)
  return rewards, valid.astype(bool).astype(jnp.float32)


def _group_stats(rewards: jax.Array, w: jax.Array) -> tuple[jax.Array, ...]:
  """Per-group count f32[P, 1], mean f32[P, 1], centred rewards f32[P, G], constant flag b[P, 1].

  Invalid entries (w == 0) are excluded from every statistic and get centred value 0.
  """
  n = jnp.sum(w, axis=1, keepdims=True)
  mean = jnp.sum(rewards * w, axis=1, keepdims=True) / jnp.maximum(n, 1.0)
  big = jnp.finfo(jnp.float32).max
  hi = jnp.max(jnp.where(w > 0, rewards, -big), axis=1, keepdims=True)
  lo = jnp.min(jnp.where(w > 0, rewards, big), axis=1, keepdims=True)
  # Exact comparison: a group of identical rewards has no signal, whatever `mean` rounds to.
  constant = hi <= lo
  centred = jnp.where(constant, 0.0, (rewards - mean) * w)
  return n, mean, centred, constant


def rloo(rewards: jax.Array, *, valid: Optional[jax.Array] = None) -> jax.Array:
  """REINFORCE leave-one-out advantage.

  A[p, g] = r[p, g] - 1/(n_p - 1) * sum_{j != g, j valid} r[p, j]
          = n_p / (n_p - 1) * (r[p, g] - mean_{j valid} r[p, j]),

  with n_p the number of valid completions of prompt p. Groups with n_p < 2 (in particular G < 2)
  have no leave-one-out baseline and get A = 0. Per group the advantages sum to zero.

  References: Ahmadian et al. (2024), "Back to Basics: Revisiting REINFORCE Style Optimization
  for Learning from Human Feedback in LLMs", arXiv:2402.14740; Kool, van Hoof and Welling (2019),
  "Buy 4 REINFORCE Samples, Get a Baseline for Free!", ICLR 2019 workshop.

  Args:
    rewards: f32[P, G] scalar reward per completion, in reward units.
    valid: optional bool[P, G], True on completion slots that exist; None means all exist.

  Returns:
    f32[P, G] advantages in reward units; 0 on invalid slots.
  """
  rewards, w = _prepare(rewards, valid)
  n, _, centred, _ = _group_stats(rewards, w)
  scale = jnp.where(n >= 2.0, n / jnp.maximum(n - 1.0, 1.0), 0.0)
  return centred * scale


def grpo(
    rewards: jax.Array,
    *,
    eps: float = 1e-6,
    unbiased_std: bool = False,
    valid: Optional[jax.Array] = None,
) -> jax.Array:
  """Group-relative advantage of GRPO: rewards standardised within each group.

  A[p, g] = (r[p, g] - mean_g r[p]) / (std_g r[p] + eps),

  with mean and std over the valid completions of prompt p; std is the population standard
  deviation (divide by n) by default, the sample one (divide by n - 1) with `unbiased_std=True`.
  A group whose valid rewards are all equal gets A = 0 exactly.

  Reference: Shao et al. (2024), "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in
  Open Language Models", arXiv:2402.03300.

  Args:
    rewards: f32[P, G] scalar reward per completion, in reward units.
    eps: added to the std, in reward units; keeps the division finite.
    unbiased_std: divide the variance by n - 1 instead of n.
    valid: optional bool[P, G], True on completion slots that exist; None means all exist.

  Returns:
    f32[P, G] dimensionless advantages; 0 on invalid slots.

  Example:
    >>> import jax.numpy as jnp
    >>> grpo(jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]), eps=0.0).tolist()
    [[1.0, -1.0, -1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
  """
  rewards, w = _prepare(rewards, valid)
  n, _, centred, constant = _group_stats(rewards, w)
  denom = jnp.maximum(n - 1.0, 1.0) if unbiased_std else jnp.maximum(n, 1.0)
  std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=1, keepdims=True) / denom)
  return jnp.where(constant, 0.0, centred / (std + eps))


def dr_grpo(rewards: jax.Array, *, valid: Optional[jax.Array] = None) -> jax.Array:
  """Dr. GRPO advantage: group-mean centred, not divided by the std.

  A[p, g] = r[p, g] - mean_g r[p]   (mean over valid completions; sums to zero per group).

  Dr. GRPO also removes the length normalisation of the loss; use it with
  `losses.policy_loss(..., aggregation="seq_mean_token_sum_norm", max_tokens=...)`.

  Reference: Liu et al. (2025), "Understanding R1-Zero-Like Training: A Critical Perspective",
  arXiv:2503.20783.

  Args:
    rewards: f32[P, G] scalar reward per completion, in reward units.
    valid: optional bool[P, G], True on completion slots that exist; None means all exist.

  Returns:
    f32[P, G] advantages in reward units; 0 on invalid slots.
  """
  rewards, w = _prepare(rewards, valid)
  _, _, centred, _ = _group_stats(rewards, w)
  return centred


def reinforce_pp(
    rewards: jax.Array, *, eps: float = 1e-6, valid: Optional[jax.Array] = None
) -> jax.Array:
  """REINFORCE++ (baseline variant): group-mean baseline, then whitening over the whole batch.

  c[p, g] = r[p, g] - mean_g r[p]
  A[p, g] = (c[p, g] - mean_{p,g} c) / (std_{p,g} c + eps),

  both batch statistics over valid entries, std the population one. The batch mean of the
  group-centred c is zero by construction, so it is not subtracted again (subtracting its rounding
  residue would give constant groups a spurious non-zero advantage).

  Reference: Hu (2025), "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
  Models", arXiv:2501.03262.

  Args:
    rewards: f32[P, G] scalar reward per completion, in reward units.
    eps: added to the batch std, in reward units.
    valid: optional bool[P, G], True on completion slots that exist; None means all exist.

  Returns:
    f32[P, G] dimensionless advantages; 0 on invalid slots and if every group is constant.
  """
  rewards, w = _prepare(rewards, valid)
  _, _, centred, _ = _group_stats(rewards, w)
  n = jnp.maximum(jnp.sum(w), 1.0)
  std = jnp.sqrt(jnp.sum(jnp.square(centred)) / n)
  return centred / (std + eps)


def counterfactual(
    rewards: jax.Array, baseline: jax.Array, *, valid: Optional[jax.Array] = None
) -> jax.Array:
  """Advantage against an externally supplied per-prompt baseline.

  A[p, g] = r[p, g] - b[p]

  The baseline is, for example, the accuracy of a generator ensemble on prompt p; it must be in the
  same units as the rewards.

  Reference: the counterfactual critic advantage of "MADA-RL: Multi-agent debate with
  counterfactual critic advantage for parameter-efficient reasoning in compact models" (arXiv,
  cs.CL), where a critic's reward is measured against the generators' per-instance accuracy.

  Args:
    rewards: f32[P, G] scalar reward per completion, in reward units.
    baseline: f32[P] per-prompt baseline, in reward units.
    valid: optional bool[P, G], True on completion slots that exist; None means all exist.

  Returns:
    f32[P, G] advantages in reward units; 0 on invalid slots.
  """
  rewards, w = _prepare(rewards, valid)
  chex.assert_rank(baseline, 1)
  chex.assert_type(baseline, float)
  chex.assert_equal(baseline.shape[0], rewards.shape[0])
  return (rewards - baseline.astype(jnp.float32)[:, None]) * w


# The group estimators by the name a run's config gives them (`rl.algorithm`); PPO estimates per
# token instead (`gae` on a value head).
ESTIMATORS = {
    "rloo": rloo,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "reinforce_pp": reinforce_pp,
    "counterfactual": counterfactual,  # A = r - b[p]: needs a per-prompt baseline
}
GRPO_STDS = ("population", "sample")  # grpo's std: divide the variance by n or by n - 1


def group_advantages(rewards: jax.Array, valid: jax.Array, estimator: str, *,
                     grpo_std: str = "population",
                     baseline: Optional[jax.Array] = None) -> jax.Array:
  """f32[P, G] advantages of the estimator `ESTIMATORS[estimator]` of rewards f32[P, G]; 0 on
  the slots that `valid` bool[P, G] marks absent.

  `grpo_std` (one of GRPO_STDS) is the group standard deviation grpo divides by; the other
  estimators ignore it. counterfactual subtracts `baseline` f32[P] (one value per prompt, from
  outside the group) instead of a statistic of the group.

  Raises:
    ValueError: an unknown estimator, or counterfactual without a baseline.
  """
  if estimator not in ESTIMATORS:
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose from "
                     f"{sorted(ESTIMATORS)}")
  if estimator == "grpo":
    return grpo(rewards, valid=valid, unbiased_std=grpo_std == "sample") * valid
  if estimator == "counterfactual":
    if baseline is None:
      raise ValueError("the counterfactual estimator needs a per-prompt baseline f32[P]")
    return counterfactual(rewards, baseline, valid=valid) * valid
  return ESTIMATORS[estimator](rewards, valid=valid) * valid


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation over the drawn tokens of each row.

  The drawn tokens of a row (mask > 0) are its steps, in order; positions with mask 0 are not
  steps. A completion's tokens are one contiguous run; an episode's row has the environment's
  observations between its turns, and there the recursion passes over the observation positions
  to the next drawn token, carrying its value and advantage (the segment continues), so that a
  reward at the episode's end reaches every turn. With t' the next drawn position after t,
    delta[b, t] = r[b, t] + gamma * V[b, t'] - V[b, t]      (V[b, t'] = 0 when t is the last)
    A[b, t]     = delta[b, t] + gamma * lam * A[b, t']      on drawn t, 0 elsewhere
    R[b, t]     = A[b, t] + V[b, t]   (the lambda-return, the value target), 0 elsewhere.
  The step after a row's last drawn token is terminal (value 0). Rewards and values at positions
  with mask 0 are never read. In the outcome-reward setting, r is each turn's reward on its last
  drawn token (`credit.on_turn_ends`) plus, optionally, a per-token KL penalty.

  Reference: Schulman et al. (2016), "High-Dimensional Continuous Control Using Generalized
  Advantage Estimation", arXiv:1506.02438.

  Args:
    rewards: f32[B, T] per-token reward, in reward units.
    values: f32[B, T] value-head estimate at each token, in reward units.
    mask: f32[B, T] 1 on drawn tokens, 0 elsewhere.
    gamma: discount per drawn token, in [0, 1].
    lam: GAE lambda, in [0, 1].

  Returns:
    (advantages f32[B, T], returns f32[B, T]) in reward units; both 0 where mask is 0.
  """
  chex.assert_rank([rewards, values, mask], 2)
  chex.assert_equal_shape([rewards, values, mask])
  chex.assert_type([rewards, values], float)
  drawn = mask > 0
  r = rewards.astype(jnp.float32)
  v = values.astype(jnp.float32)

  def step(carry, xs):
    next_v, next_a = carry
    r_t, v_t, drawn_t = xs
    a_t = (r_t + gamma * next_v - v_t) + gamma * lam * next_a
    carry = (jnp.where(drawn_t, v_t, next_v), jnp.where(drawn_t, a_t, next_a))
    return carry, jnp.where(drawn_t, a_t, 0.0)

  zeros = jnp.zeros_like(r[:, 0])
  _, adv_rev = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, drawn.T), reverse=True)
  advantages = adv_rev.T
  return advantages, jnp.where(drawn, advantages + v, 0.0)


def broadcast_to_tokens(advantages: jax.Array, mask: jax.Array) -> jax.Array:
  """Broadcasts one advantage per completion onto its tokens.

  A_tok[b, t] = A[b] * m[b, t], with A[P, G] flattened row-major to A[B] (B = P * G, the row order
  of `types.Rollout`).

  Args:
    advantages: f32[P, G] or f32[B] per-completion advantage.
    mask: f32[B, T] 1 on completion tokens, 0 elsewhere.

  Returns:
    f32[B, T] token-level advantages, 0 where mask is 0.

  Raises:
    AssertionError (at trace time): when the number of advantages differs from B.
  """
  chex.assert_rank(mask, 2)
  chex.assert_rank(advantages, {1, 2})
  chex.assert_type(advantages, float)
  flat = advantages.reshape(-1).astype(jnp.float32)
  chex.assert_equal(flat.shape[0], mask.shape[0])
  return flat[:, None] * mask.astype(jnp.float32)
