"""Off-policy corrections: truncated importance weights and the interpolated proximal policy.

The tokens a learn step trains on were drawn by a policy other than the one its ratio is taken
against: the sampling engine computes slightly different log-probs than the trainer for the same
weights (kernels, precision), and rollouts in flight were drawn by older weights.
`truncated_is_weights` weights each token by min(pi_old / pi_sampler, cap) (TIS);
`loglinear_proximal_logprobs` stands in for the proximal policy of decoupled PPO without a forward
pass (A-3PO). Both take per-token arrays [B, T] (B completions, T tokens), compute in float32
whatever the input dtype, and return constants of the loss (no gradient); `losses.policy_loss`
consumes what they give (weighted advantages, the proximal log-probs as its `logp_old`).
"""

import chex
import jax
import jax.numpy as jnp

from rl_curriculum.rl import surrogate

__all__ = ["truncated_is_weights", "loglinear_proximal_logprobs"]


def truncated_is_weights(
    logp_trainer_old: jax.Array,
    logp_sampler: jax.Array,
    *,
    cap: float = 2.0,
    clamp: float = 20.0,
) -> jax.Array:
  """Truncated importance weights correcting a sampler/trainer log-prob mismatch.

  w[b, t] = min(exp(clip(logp_trainer_old - logp_sampler, -clamp, clamp)), cap)   (float32)

  The sampling engine and the trainer compute slightly different log-probs for the same policy
  (kernels, precision); the trainer's `logp_old` is then off-policy for the sampled tokens.
  Multiply the per-token policy loss by w (e.g. scale the advantages) to correct for it.

  Reference: Yao et al. (2025), "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training" (truncated importance sampling, TIS), https://fengyao.notion.site/off-policy-rl.

  Args:
    logp_trainer_old: float[B, T] log-probs of the sampled tokens recomputed by the trainer, nats.
    logp_sampler: float[B, T] log-probs reported by the sampler, nats.
    cap: truncation C of the weight (dimensionless, > 0).
    clamp: bound on |log-ratio|, in nats.

  Returns:
    f32[B, T] weights in (0, cap], without gradient.
  """
  chex.assert_rank([logp_trainer_old, logp_sampler], 2)
  chex.assert_equal_shape([logp_trainer_old, logp_sampler])
  chex.assert_type([logp_trainer_old, logp_sampler], float)
  w = jnp.minimum(jnp.exp(surrogate.log_ratio(logp_trainer_old, logp_sampler, clamp)), cap)
  return jax.lax.stop_gradient(w)


def loglinear_proximal_logprobs(
    logp_behaviour: jax.Array,
    logp_current: jax.Array,
    staleness: jax.Array,
) -> jax.Array:
  """The proximal policy's log-probs approximated between the behaviour and current policies.

  Decoupled PPO clips the ratio pi_theta / pi_prox around a proximal policy (the policy the update
  starts from) and corrects for the behaviour policy mu that sampled the tokens with the weight
  pi_prox / mu. Instead of a forward pass of pi_prox, interpolate in log space by policy version:
  with the behaviour version v_mu, the proximal version v_prox = v_mu + s (s the token's
  staleness) and the current version v_theta = v_prox + 1,

    alpha = (v_prox - v_mu) / (v_theta - v_mu) = s / (s + 1)
    log pi_prox = log mu + alpha * (log pi_theta - log mu)        (float32, no gradient)

  so an on-policy token (s = 0) has pi_prox = mu, and a stale one sits between mu and pi_theta.

  References: Fu et al. (2025), "AReaL: A Large-Scale Asynchronous Reinforcement Learning System
  for Language Reasoning", arXiv:2505.24298 (the decoupled objective); Li et al. (2025), "A-3PO:
  Accelerating Asynchronous LLM Training with Staleness-aware Proximal Policy Approximation",
  arXiv:2512.06547 (the interpolation).

  Args:
    logp_behaviour: float[B, T] log-probs reported by the sampler (mu), nats.
    logp_current: float[B, T] log-probs under the policy being trained (treated as a constant).
    staleness: float or int [B, T] policy versions between the sampling policy and the
      proximal one, >= 0 (negative values count as 0).

  Returns:
    f32[B, T] approximate log pi_prox, without gradient.
  """
  chex.assert_equal_shape([logp_behaviour, logp_current, staleness])
  s = jnp.maximum(staleness.astype(jnp.float32), 0.0)
  mu = logp_behaviour.astype(jnp.float32)
  current = jax.lax.stop_gradient(logp_current).astype(jnp.float32)
  return jax.lax.stop_gradient(mu + (s / (s + 1.0)) * (current - mu))
