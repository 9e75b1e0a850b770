"""Policy-gradient, value and KL losses over token-level arrays.

Every function takes per-token arrays of shape [B, T] (B completions, T tokens) and a mask that is
1 on the completion tokens that count. Ratios, exponentials and KL estimates are computed in
float32 from a log-ratio clamped to [-clamp, clamp] (default 20, i.e. ratios within
[2e-9, 4.9e8]; `surrogate.log_ratio`), whatever the input dtype, so bfloat16 or float16
log-probabilities never produce an inf or NaN loss. Tokens outside the mask change neither a loss
nor its gradient. `policy_loss` is built from the per-token pieces of `surrogate`. Also here: the
CAPO advantage-sign curriculum (`advantage_sign_mask`) and the entropy bonus; the off-policy
corrections (truncated importance weights, the interpolated proximal policy) are in `off_policy`.

Aggregation of a per-token loss l[b, t] with mask m[b, t] (`aggregate`):
  token_mean               sum_{b,t} m l / sum_{b,t} m                       (DAPO; token-level)
  seq_mean_token_mean      mean_b [ sum_t m l / sum_t m ]                    (GRPO; per-sequence)
  seq_mean_token_sum_norm  mean_b [ sum_t m l ] / max_tokens                 (Dr. GRPO)
(DAPO: Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476; GRPO: Shao et al. (2024), "DeepSeekMath: Pushing the Limits of Mathematical
Reasoning in Open Language Models", arXiv:2402.03300; Dr. GRPO: Liu et al. (2025), "Understanding
R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783.)
The sequence means run over rows with at least one unmasked token (absent completion slots, whose
rows are fully masked, neither count nor dilute the mean). Every mode gives 0 for an all-masked
batch.

Each mode is a sum over the batch divided by a normaliser (tokens, or rows with a token;
`aggregation_normaliser`). Gradient accumulation over microbatches of one minibatch passes the
minibatch's normaliser as `normaliser`, so that the microbatches' losses add up to the minibatch's
loss instead of averaging per-microbatch means.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from rl_curriculum.rl import surrogate

__all__ = ["AGGREGATIONS", "KL_ESTIMATORS", "masked_mean", "aggregate", "aggregation_normaliser",
           "kl_divergence", "policy_loss", "value_loss", "advantage_sign_mask", "entropy_bonus"]

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """sum(x * m) / sum(m) along `axis` (all axes when None); 0 where sum(m) == 0.

  Args:
    x: float array.
    mask: array of x's shape, 1 on entries that count (fractional weights allowed).
    axis: axis or axes to reduce; None reduces all.

  Returns:
    f32 array with `axis` reduced.
  """
  chex.assert_equal_shape([x, mask])
  m = mask.astype(jnp.float32)
  # Multiply by the mask with `where`, so that an inf or NaN under a zero mask cannot leak in.
  num = jnp.sum(jnp.where(m != 0, x.astype(jnp.float32) * m, 0.0), axis=axis)
  return num / jnp.maximum(jnp.sum(m, axis=axis), 1e-8)


def aggregation_normaliser(mask: jax.Array, aggregation: str) -> jax.Array:
  """f32[] what `aggregate` divides by (before max_tokens): the number of masked tokens for
  "token_mean", the number of rows with at least one masked token for the sequence means (at
  least 1e-8 and 1 respectively, as in `aggregate`)."""
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
  m = mask.astype(jnp.float32)
  if aggregation == "token_mean":
    return jnp.maximum(jnp.sum(m), 1e-8)
  return jnp.maximum(jnp.sum((jnp.sum(m, axis=1) > 0).astype(jnp.float32)), 1.0)


def aggregate(
    loss: jax.Array,
    mask: jax.Array,
    aggregation: str = "token_mean",
    max_tokens: Optional[int] = None,
    normaliser: Optional[jax.Array] = None,
) -> jax.Array:
  """Reduces a per-token loss f32[B, T] to a scalar (modes in the module docstring).

  Args:
    loss: f32[B, T] per-token loss.
    mask: f32[B, T] 1 on completion tokens.
    aggregation: one of AGGREGATIONS.
    max_tokens: the constant normaliser of "seq_mean_token_sum_norm", in tokens (typically the
      maximum completion length).
    normaliser: None, or f32[] to divide by instead of this batch's own
      `aggregation_normaliser(mask, aggregation)` (a microbatch of a larger minibatch passes the
      minibatch's, so that the microbatches' results sum to the minibatch's).

  Returns:
    f32[] the aggregated loss.

  Raises:
    ValueError (at trace time): unknown aggregation, or max_tokens missing for
      "seq_mean_token_sum_norm".
  """
  chex.assert_rank([loss, mask], 2)
  chex.assert_equal_shape([loss, mask])
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
  m = mask.astype(jnp.float32)
  masked = jnp.where(m != 0, loss.astype(jnp.float32) * m, 0.0)
  if normaliser is None:
    normaliser = aggregation_normaliser(m, aggregation)
  if aggregation == "token_mean":
    return jnp.sum(masked) / normaliser
  row_count = jnp.sum(m, axis=1)
  row_sum = jnp.sum(masked, axis=1)
  if aggregation == "seq_mean_token_mean":
    return jnp.sum(row_sum / jnp.maximum(row_count, 1e-8)) / normaliser
  if max_tokens is None or max_tokens <= 0:
    raise ValueError(
        "aggregation='seq_mean_token_sum_norm' needs a positive max_tokens (the constant "
        f"normaliser, e.g. the maximum completion length); got {max_tokens!r}")
  return jnp.sum(row_sum) / (normaliser * float(max_tokens))


def kl_divergence(
    logp: jax.Array,
    logp_ref: jax.Array,
    *,
    estimator: str = "k3",
    clamp: float = 20.0,
) -> jax.Array:
  """Per-token Monte-Carlo estimate of KL(pi || pi_ref) on tokens sampled from pi.

  With x = clip(logp_ref - logp, -clamp, clamp) in float32:
    k1 = -x                       (unbiased, can be negative)
    k2 = x^2 / 2                  (biased, low variance, >= 0)
    k3 = exp(x) - x - 1           (unbiased, >= 0)

  As a VALUE, each estimates KL(pi || pi_ref) (k2 with a bias of third order in the log-ratio).
  As a LOSS, differentiated with respect to logp on tokens y ~ pi (what a KL loss term does), the
  per-token gradients are, in expectation over y:
    k1:  E[grad logp(y)] = 0: no regularisation at all (the learn step rejects k1 as a loss);
    k2:  E[(logp - logp_ref)(y) grad logp(y)] = grad KL(pi || pi_ref), the reverse KL's gradient;
    k3:  E[(1 - pi_ref / pi)(y) grad logp(y)] = -sum_y pi_ref(y) grad logp(y)
         = grad KL(pi_ref || pi), the FORWARD KL's gradient (mass-covering), not the reverse one
         its value estimates.
  Both are per-token gradients: neither accounts for a token's effect on later tokens of the
  completion; a k1 penalty folded into the rewards (as PPO-based RLHF does) penalises the reverse
  KL of whole completions.

  References: Schulman (2020), "Approximating KL Divergence",
  http://joschu.net/blog/kl-approx.html; k3 is the KL penalty of GRPO (Shao et al. (2024),
  arXiv:2402.03300); the gradients as a loss: Tang and Munos (2025), "On a few pitfalls in KL
  divergence gradient estimation for RL", arXiv:2506.09477. Beyond the clamp the estimate is
  constant and its gradient 0.

  Args:
    logp: float[B, T] log-prob of each sampled token under the policy, in nats.
    logp_ref: float[B, T] log-prob of the same tokens under the reference policy, in nats.
    estimator: "k1", "k2" or "k3".
    clamp: bound on |log-ratio|, in nats.

  Returns:
    f32[B, T] per-token KL estimate in nats (not masked; see `masked_mean`).

  Raises:
    ValueError (at trace time): unknown estimator.
  """
  chex.assert_rank([logp, logp_ref], 2)
  chex.assert_equal_shape([logp, logp_ref])
  chex.assert_type([logp, logp_ref], float)
  if estimator not in KL_ESTIMATORS:
    raise ValueError(f"estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
  x = surrogate.log_ratio(logp_ref, logp, clamp)
  if estimator == "k1":
    return -x
  if estimator == "k2":
    return 0.5 * jnp.square(x)
  return surrogate.k3(x)


def _check_policy_settings(level: str, aggregation: str, max_tokens: Optional[int],
                           dual_clip: Optional[float]) -> None:
  """Raises ValueError for the settings `policy_loss` rejects (see its docstring)."""
  if level not in surrogate.LEVELS:
    raise ValueError(f"level must be one of {surrogate.LEVELS}, got {level!r}")
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
  if aggregation == "seq_mean_token_sum_norm" and (max_tokens is None or max_tokens <= 0):
    raise ValueError(
        "aggregation='seq_mean_token_sum_norm' needs a positive max_tokens; got "
        f"{max_tokens!r}")
  if dual_clip is not None and not isinstance(dual_clip, jax.core.Tracer) and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")


def _policy_metrics(ratio: jax.Array, log_ratio: jax.Array, adv: jax.Array, m: jax.Array,
                    dual_active: jax.Array, eps_low: float,
                    eps_high: float) -> dict[str, jax.Array]:
  """The metrics of `policy_loss` (listed in its docstring), f32[] each."""
  on = m != 0
  r = jax.lax.stop_gradient(ratio)
  f32 = lambda b: b.astype(jnp.float32)
  return {
      "clipfrac_low": masked_mean(f32((adv < 0) & (r < 1.0 - eps_low)), m),
      "clipfrac_high": masked_mean(f32((adv > 0) & (r > 1.0 + eps_high)), m),
      "dual_clipfrac": masked_mean(f32(dual_active), m),
      "approx_kl": masked_mean(surrogate.k3(-jax.lax.stop_gradient(log_ratio)), m),
      "ratio_mean": masked_mean(r, m),
      "ratio_max": jnp.max(jnp.where(on, r, 0.0)),
  }


def policy_loss(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: Optional[float] = None,
    level: str = "token",
    aggregation: str = "token_mean",
    max_tokens: Optional[int] = None,
    clamp: float = 20.0,
    normaliser: Optional[jax.Array] = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped surrogate policy loss: PPO with Clip-Higher and dual clip, or GSPO at sequence level.

  Ratio (float32, from the clamped log-ratio):
    level="token":     rho[b, t] = exp(clip(logp[b, t] - logp_old[b, t], -clamp, clamp))
    level="sequence":  rho[b, t] = s[b] = exp(clip(sum_t m (logp - logp_old) / sum_t m, ...))
                       (GSPO: one ratio per completion, the geometric mean of its token ratios)
  Per-token loss:
    l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
    with dual_clip = c > 1, for A < 0:  l = min(l, -c A)
  then reduced by `aggregate` with the given `aggregation`.

  At logp == logp_old the gradient is that of vanilla policy gradient, -agg(A * grad logp).

  References: Schulman et al. (2017), "Proximal Policy Optimization Algorithms",
  arXiv:1707.06347; Clip-Higher (eps_high = 0.28) and the token-mean: Yu et al. (2025), "DAPO: An
  Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476; the dual clip: Ye et
  al. (2020), "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning",
  arXiv:1912.09729; the sequence-level ratio: Zheng et al. (2025), "Group Sequence Policy
  Optimization", arXiv:2507.18071.

  Args:
    logp: float[B, T] log-prob of each completion token under the policy being trained, in nats.
    logp_old: float[B, T] log-prob under the policy that sampled (treated as a constant), in nats.
    advantages: f32[B, T] per-token or f32[B] per-completion advantage (treated as a constant).
    mask: f32[B, T] 1 on completion tokens that count.
    eps_low: lower clip range; the ratio is clipped below at 1 - eps_low.
    eps_high: upper clip range; the ratio is clipped above at 1 + eps_high.
    dual_clip: None, or c > 1 bounding the loss of negative-advantage tokens by -c A.
    level: "token" (PPO) or "sequence" (GSPO).
    aggregation: one of AGGREGATIONS.
    max_tokens: the constant normaliser for aggregation "seq_mean_token_sum_norm", in tokens.
    clamp: bound on |log-ratio|, in nats.
    normaliser: passed to `aggregate` (None: this batch's own).

  Returns:
    (loss f32[], metrics) where metrics (all f32[], no gradient) are
      clipfrac_low   masked fraction of tokens with A < 0 and rho < 1 - eps_low (clip active)
      clipfrac_high  masked fraction of tokens with A > 0 and rho > 1 + eps_high (clip active)
      dual_clipfrac  masked fraction of tokens where the dual clip is active (0 without it)
      approx_kl      masked mean of k3 between the policy and the sampling policy (per token; at
                     level="sequence" from the sequence log-ratio log s[b])
      ratio_mean     masked mean of rho
      ratio_max      max of rho over masked tokens (0 if none)

  Raises:
    ValueError (at trace time): unknown level or aggregation, max_tokens missing for
      "seq_mean_token_sum_norm", or dual_clip <= 1.

  Example (on-policy, the loss is -mean(A) and its gradient that of vanilla policy gradient):
    >>> import jax.numpy as jnp
    >>> logp = jnp.log(jnp.array([[0.5, 0.25, 1.0]]))
    >>> mask = jnp.array([[1.0, 1.0, 0.0]])
    >>> loss, metrics = policy_loss(logp, logp, jnp.array([2.0]), mask, eps_high=0.28)
    >>> float(loss), float(metrics["ratio_mean"])
    (-2.0, 1.0)
  """
  chex.assert_rank([logp, logp_old, mask], 2)
  chex.assert_equal_shape([logp, logp_old, mask])
  chex.assert_type([logp, logp_old], float)
  chex.assert_rank(advantages, {1, 2})
  chex.assert_type(advantages, float)
  _check_policy_settings(level, aggregation, max_tokens, dual_clip)
  m = mask.astype(jnp.float32)
  lp, lp_old, adv = surrogate.masked_policy_inputs(logp, logp_old, advantages, m)
  log_ratio = surrogate.policy_log_ratio(lp, lp_old, m, level, clamp)
  ratio = jnp.exp(log_ratio)
  per_token, dual_active = surrogate.clipped_surrogate(ratio, adv, eps_low, eps_high,
                                                       dual_clip)
  loss = aggregate(per_token, m, aggregation, max_tokens, normaliser)
  metrics = _policy_metrics(ratio, log_ratio, adv, m, dual_active, eps_low, eps_high)
  return loss, jax.lax.stop_gradient(metrics)


def value_loss(
    values: jax.Array,
    values_old: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip: Optional[float] = 0.2,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped value-head loss of PPO.

  v_clip = values_old + clip(values - values_old, -clip, clip)
  l[b, t] = 0.5 * max((values - R)^2, (v_clip - R)^2)      (0.5 * (values - R)^2 if clip is None)
  loss = masked mean of l over tokens.

  References: Schulman et al. (2017), "Proximal Policy Optimization Algorithms",
  arXiv:1707.06347; the value clipping of the OpenAI baselines PPO2 implementation.

  Args:
    values: f32[B, T] value-head output of the model being trained, in reward units.
    values_old: f32[B, T] value-head output at sampling time (a constant), in reward units.
    returns: f32[B, T] value targets (e.g. the `gae` returns; a constant), in reward units.
    mask: f32[B, T] 1 on completion tokens that count.
    clip: clip range of the value change, in reward units; None disables clipping.

  Returns:
    (loss f32[], metrics) with metrics `vf_clipfrac` (masked fraction of tokens where the clipped
    error is the larger) and `value_error` (masked mean of (values - R)^2), both without gradient.
  """
  chex.assert_rank([values, values_old, returns, mask], 2)
  chex.assert_equal_shape([values, values_old, returns, mask])
  chex.assert_type([values, values_old, returns], float)
  m = mask.astype(jnp.float32)
  on = m != 0
  v = jnp.where(on, values.astype(jnp.float32), 0.0)
  v_old = jax.lax.stop_gradient(jnp.where(on, values_old.astype(jnp.float32), 0.0))
  ret = jax.lax.stop_gradient(jnp.where(on, returns.astype(jnp.float32), 0.0))
  err = jnp.square(v - ret)
  if clip is None:
    per_token = err
    clipped_active = jnp.zeros_like(on)
  else:
    v_clip = v_old + jnp.clip(v - v_old, -clip, clip)
    err_clip = jnp.square(v_clip - ret)
    per_token = jnp.maximum(err, err_clip)
    clipped_active = err_clip > err
  loss = 0.5 * masked_mean(per_token, m)
  metrics = {
      "vf_clipfrac": masked_mean(clipped_active.astype(jnp.float32), m),
      "value_error": masked_mean(err, m),
  }
  return loss, jax.lax.stop_gradient(metrics)


def advantage_sign_mask(
    advantages: jax.Array,
    step: jax.Array | int,
    *,
    positive_only_steps: int,
    ramp_steps: int = 0,
) -> jax.Array:
  """CAPO advantage-sign curriculum: weight 1 for A >= 0, and a ramped weight for A < 0.

  w_neg(step) = clip((step - positive_only_steps + 1) / max(ramp_steps, 1), 0, 1)
  w = 1 where A >= 0, w_neg(step) where A < 0.

  Steps 0 .. positive_only_steps - 1 learn from positive advantages only; negative advantages are
  then phased in over ramp_steps steps (weights 1/ramp_steps, 2/ramp_steps, ..., 1); ramp_steps 0
  or 1 is a hard switch at step positive_only_steps. Multiply the advantages (or the loss mask)
  by w.

  Reference: Yang et al. (2025), "From Imitation to Discrimination: Toward A Generalized
  Curriculum Advantage Mechanism Enhancing Cross-Domain Reasoning Tasks" (CAPO, Curriculum
  Advantage Policy Optimization), arXiv:2512.02580: positive-only advantages first, negative ones
  introduced afterwards.

  Args:
    advantages: f32[...] advantages of any shape ([P, G], [B] or [B, T]).
    step: i32[] (or int) training step, counted from 0.
    positive_only_steps: number of steps that use positive advantages only (>= 0).
    ramp_steps: number of steps over which negative advantages are phased in (>= 0).

  Returns:
    f32[...] weights in [0, 1], same shape as advantages.
  """
  chex.assert_type(advantages, float)
  traced = any(isinstance(x, jax.core.Tracer) for x in (positive_only_steps, ramp_steps))
  if not traced and (positive_only_steps < 0 or ramp_steps < 0):
    raise ValueError(
        f"positive_only_steps and ramp_steps must be >= 0, got {positive_only_steps}, {ramp_steps}")
  step = jnp.asarray(step, jnp.float32)
  w_neg = jnp.clip((step - positive_only_steps + 1.0) / jnp.maximum(ramp_steps, 1), 0.0, 1.0)
  return jnp.where(advantages < 0, w_neg, 1.0).astype(jnp.float32)


def entropy_bonus(
    entropy: jax.Array,
    mask: jax.Array,
    *,
    aggregation: str = "token_mean",
    max_tokens: Optional[int] = None,
) -> jax.Array:
  """Aggregated policy entropy, to be subtracted from the loss with a coefficient.

  bonus = aggregate(H, m)   with H from `logprobs.token_entropy`; loss -= coef * bonus.

  Args:
    entropy: f32[B, T] per-token entropy of the full-vocabulary distribution, in nats.
    mask: f32[B, T] 1 on completion tokens.
    aggregation: one of AGGREGATIONS (use the policy loss's).
    max_tokens: for "seq_mean_token_sum_norm".

  Returns:
    f32[] aggregated entropy in nats.
  """
  chex.assert_type(entropy, float)
  return aggregate(entropy, mask, aggregation, max_tokens)
