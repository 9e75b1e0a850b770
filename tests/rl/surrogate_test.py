"""Tests for rl_curriculum.rl.surrogate: log-ratios, masked inputs and the clipped surrogate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.rl import surrogate
import test_util

MASK = np.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1]], np.float32)


def _logps(seed):
  rng = np.random.default_rng(seed)
  return (rng.uniform(-4, 0, MASK.shape).astype(np.float32),
          rng.uniform(-4, 0, MASK.shape).astype(np.float32))


@test_util.JIT
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_log_ratio_is_a_clamped_float32_difference(use_jit, dtype):
  a = jnp.asarray([[-0.5, -80.0, -3.0]], dtype)
  b = jnp.asarray([[-1.5, -1.0, -90.0]], dtype)
  got = test_util.maybe_jit(surrogate.log_ratio, use_jit, clamp=20.0)(a, b)
  want = np.clip(np.asarray(a, np.float64) - np.asarray(b, np.float64), -20.0, 20.0)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, **test_util.TOL)


@test_util.JIT
def test_k3_matches_reference_and_is_never_negative(use_jit):
  x = np.array([-3.0, -1e-7, 0.0, 3e-8, 1e-4, 2.5], np.float32)
  got = np.asarray(test_util.maybe_jit(surrogate.k3, use_jit)(x))
  x64 = x.astype(np.float64)
  # The float32 difference expm1(x) - x keeps an absolute error of about ulp(x) near 0.
  np.testing.assert_allclose(got, np.expm1(x64) - x64, rtol=1e-5, atol=1e-11)
  assert np.all(got >= 0.0)


@test_util.JIT
@pytest.mark.parametrize("level", surrogate.LEVELS)
def test_policy_log_ratio_per_token_and_per_sequence(use_jit, level):
  lp, lp_old = _logps(0)
  got = np.asarray(test_util.maybe_jit(surrogate.policy_log_ratio, use_jit, level=level,
                                       clamp=20.0)(lp, lp_old, MASK))
  diff = lp.astype(np.float64) - lp_old
  if level == "token":
    np.testing.assert_allclose(got, diff, **test_util.TOL)
    return
  for b in range(MASK.shape[0]):
    tokens = MASK[b] != 0
    want = diff[b, tokens].mean() if tokens.any() else 0.0
    np.testing.assert_allclose(got[b], np.full(MASK.shape[1], want), **test_util.TOL)


def test_masked_policy_inputs_replace_masked_entries_and_stop_gradients():
  lp, lp_old = _logps(1)
  lp[0, 2] = np.nan
  lp_old[1, 0] = np.inf
  advantages = np.array([1.5, np.nan, -2.0], np.float32)

  def total(lp, lp_old, advantages):
    outs = surrogate.masked_policy_inputs(lp, lp_old, advantages, jnp.asarray(MASK))
    return sum(jnp.sum(x) for x in outs), outs

  grads, (lp_m, lp_old_m, adv_m) = jax.grad(total, argnums=(0, 1, 2), has_aux=True)(
      jnp.asarray(lp), jnp.asarray(lp_old), jnp.asarray(advantages))
  on = MASK != 0
  np.testing.assert_array_equal(lp_m, np.where(on, lp, 0.0))
  np.testing.assert_array_equal(lp_old_m, np.where(on, lp_old, 0.0))
  np.testing.assert_array_equal(adv_m, np.where(on, advantages[:, None], 0.0))
  np.testing.assert_array_equal(grads[0], MASK)
  np.testing.assert_array_equal(grads[1], 0.0)
  np.testing.assert_array_equal(grads[2], 0.0)


@test_util.JIT
def test_clipped_surrogate_by_hand(use_jit):
  ratio = jnp.asarray([[0.5, 1.5, 1.1, 5.0, 0.9]])
  adv = jnp.asarray([[1.0, 1.0, -1.0, -1.0, 2.0]])
  clip = test_util.maybe_jit(surrogate.clipped_surrogate, use_jit, eps_low=0.2, eps_high=0.28,
                             dual_clip=None)
  per_token, dual_active = clip(ratio, adv)
  # max(-rho A, -clip(rho, 0.8, 1.28) A) per token.
  np.testing.assert_allclose(per_token, [[-0.5, -1.28, 1.1, 5.0, -1.8]], **test_util.TOL)
  assert not np.any(dual_active)
  dual = test_util.maybe_jit(surrogate.clipped_surrogate, use_jit, eps_low=0.2, eps_high=0.28,
                             dual_clip=3.0)
  per_token, dual_active = dual(ratio, adv)
  # With A < 0 the loss is bounded by -3 A = 3: only the token at rho = 5 is cut.
  np.testing.assert_allclose(per_token, [[-0.5, -1.28, 1.1, 3.0, -1.8]], **test_util.TOL)
  np.testing.assert_array_equal(dual_active, [[False, False, False, True, False]])
