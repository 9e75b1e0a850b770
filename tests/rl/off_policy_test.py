"""Tests for rl_curriculum.rl.off_policy: truncated importance weights, the proximal policy."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.rl import off_policy
import test_util


@test_util.JIT
def test_truncated_is_weights_match_reference(use_jit):
  logp_trainer, logp_sampler, _, _ = test_util.logprob_batch(spread=1.0)
  out = test_util.maybe_jit(off_policy.truncated_is_weights, use_jit, cap=1.5)(
      logp_trainer, logp_sampler)
  expected = np.zeros(logp_trainer.shape)
  for b in range(expected.shape[0]):
    for t in range(expected.shape[1]):
      expected[b, t] = min(math.exp(float(logp_trainer[b, t]) - float(logp_sampler[b, t])), 1.5)
  np.testing.assert_allclose(out, expected, **test_util.TOL)
  g = jax.grad(lambda x: jnp.sum(off_policy.truncated_is_weights(x, logp_sampler)))(logp_trainer)
  np.testing.assert_array_equal(g, 0.0)  # weights are constants of the loss


@test_util.JIT
def test_loglinear_proximal_logprobs_match_a_float64_reference(use_jit):
  """log pi_prox = log mu + s / (s + 1) (log pi - log mu) per token, in float64 by hand; s = 0
  gives the sampler's log-probs exactly, negative staleness counts as 0, and no gradient flows."""
  logp, logp_sampler, _, _ = test_util.logprob_batch(spread=1.0)
  staleness = np.tile(np.array([0, 1, 2, 3, 7, -1], np.int32), (logp.shape[0], 1))
  fn = test_util.maybe_jit(off_policy.loglinear_proximal_logprobs, use_jit)
  out = np.asarray(fn(logp_sampler, logp, staleness))
  expected = np.zeros(logp.shape)
  for b in range(expected.shape[0]):
    for t in range(expected.shape[1]):
      s = max(int(staleness[b, t]), 0)
      mu, pi = float(logp_sampler[b, t]), float(logp[b, t])
      expected[b, t] = mu + s / (s + 1) * (pi - mu)
  np.testing.assert_allclose(out, expected, **test_util.TOL)
  on_policy = staleness <= 0
  np.testing.assert_array_equal(out[on_policy], np.asarray(logp_sampler, np.float32)[on_policy])
  g = jax.grad(lambda x: jnp.sum(
      off_policy.loglinear_proximal_logprobs(logp_sampler, x, staleness)))(logp)
  np.testing.assert_array_equal(g, 0.0)
