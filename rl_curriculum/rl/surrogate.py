"""The per-token clipped surrogate of PPO-style policy losses, and the log-ratios it is built from.

`losses.policy_loss` composes these: masked inputs, the log-ratio (per token, or per sequence as
in GSPO), the ratio rho = exp(log-ratio), then the clipped surrogate per token

  l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A),  with dual clip c: l = min(l, -c A)
                                                             for A < 0,

which `losses.aggregate` reduces. Log-ratios are computed in float32 and clamped to
[-clamp, clamp], whatever the input dtype, so low-precision log-probs never overflow a ratio.

References: Schulman et al. (2017), "Proximal Policy Optimization Algorithms", arXiv:1707.06347;
Clip-Higher (eps_high > eps_low): Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", arXiv:2503.14476; the dual clip: Ye et al. (2020), "Mastering Complex
Control in MOBA Games with Deep Reinforcement Learning", arXiv:1912.09729; the sequence-level
ratio: Zheng et al. (2025), "Group Sequence Policy Optimization", arXiv:2507.18071.

Shapes: B completions, T tokens; m f32[B, T] is 1 on the tokens that count.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp

# Where the ratio lives: one per token (PPO), or one per completion (GSPO).
LEVELS = ("token", "sequence")


def log_ratio(logp: jax.Array, logp_base: jax.Array, clamp: float) -> jax.Array:
  """clip(logp - logp_base, -clamp, clamp) in float32 (any shape; clamp in nats)."""
  return jnp.clip(logp.astype(jnp.float32) - logp_base.astype(jnp.float32), -clamp, clamp)


def k3(log_ratio_ref: jax.Array) -> jax.Array:
  """exp(x) - x - 1 >= 0 of a log-ratio x = log(pi_ref / pi) (the k3 KL estimate), as
  expm1(x) - x: exact near 0 and never negative after rounding."""
  return jnp.expm1(log_ratio_ref) - log_ratio_ref


def masked_policy_inputs(
    logp: jax.Array, logp_old: jax.Array, advantages: jax.Array, m: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(logp, logp_old, advantages), each f32[B, T] and 0 where m == 0; only logp keeps a gradient.

  Per-completion advantages f32[B] are broadcast over the tokens. Masked entries are replaced, not
  multiplied, so that an inf or NaN there cannot reach the loss or its gradient.
  """
  on = m != 0
  if advantages.ndim == 1:
    chex.assert_equal(advantages.shape[0], logp.shape[0])
    adv = jnp.broadcast_to(advantages[:, None], logp.shape)
  else:
    chex.assert_equal_shape([advantages, logp])
    adv = advantages
  adv = jax.lax.stop_gradient(jnp.where(on, adv.astype(jnp.float32), 0.0))
  lp = jnp.where(on, logp.astype(jnp.float32), 0.0)
  lp_old = jax.lax.stop_gradient(jnp.where(on, logp_old.astype(jnp.float32), 0.0))
  return lp, lp_old, adv


def policy_log_ratio(lp: jax.Array, lp_old: jax.Array, m: jax.Array, level: str,
                     clamp: float) -> jax.Array:
  """f32[B, T] clamped log-ratio of lp f32[B, T] to lp_old f32[B, T]: per token (level "token"),
  or the masked token mean of each row broadcast over its tokens (level "sequence", GSPO)."""
  if level == "token":
    return log_ratio(lp, lp_old, clamp)
  seq_log_ratio = jnp.sum((lp - lp_old) * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-8)
  seq_log_ratio = jnp.clip(seq_log_ratio, -clamp, clamp)
  return jnp.broadcast_to(seq_log_ratio[:, None], lp.shape)


def clipped_surrogate(
    ratio: jax.Array, adv: jax.Array, eps_low: float, eps_high: float,
    dual_clip: Optional[float]
) -> tuple[jax.Array, jax.Array]:
  """(per-token loss f32[B, T], dual clip active bool[B, T]) of the clipped surrogate (formula in
  the module docstring) for ratios rho f32[B, T] and advantages A f32[B, T]."""
  clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss_unclipped = -ratio * adv
  loss_clipped = -clipped_ratio * adv
  per_token = jnp.maximum(loss_unclipped, loss_clipped)
  if dual_clip is None:
    return per_token, jnp.zeros(adv.shape, bool)
  bound = -dual_clip * adv
  dual_active = (adv < 0) & (per_token > bound)
  per_token = jnp.where(adv < 0, jnp.minimum(per_token, bound), per_token)
  return per_token, dual_active
