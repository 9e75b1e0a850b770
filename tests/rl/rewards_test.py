"""Tests of rl_curriculum/rl/rewards.py."""

import jax.numpy as jnp
import numpy as np

from rl_curriculum.rl import rewards
import test_util


@test_util.JIT
def test_outcome_token_rewards_sit_on_the_last_counted_token(use_jit):
  fn = test_util.maybe_jit(rewards.outcome_token_rewards, use_jit)
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], jnp.float32)
  got = fn(jnp.array([2.0, -1.0, 5.0]), mask)
  np.testing.assert_array_equal(np.asarray(got), [[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0]])


@test_util.JIT
def test_overlong_penalty_matches_dapo_by_hand(use_jit):
  # L_max = 8, L_cache = 3: no penalty up to 5 tokens, then -1/3 per token, -1 from 8 on.
  fn = test_util.maybe_jit(rewards.overlong_penalty, use_jit, max_tokens=8, cache=3)
  expected = [0, 0, 0, 0, 0, 0, -1 / 3, -2 / 3, -1, -1, -1]
  np.testing.assert_allclose(np.asarray(fn(jnp.arange(11))), expected, rtol=1e-5)
  # L_cache = 1: only a completion that reaches the cap loses 1.
  got = rewards.overlong_penalty(jnp.arange(1, 5), 4, 1)
  np.testing.assert_array_equal(np.asarray(got), [0, 0, 0, -1])


@test_util.JIT
def test_kl_penalty_is_k1_on_counted_tokens(use_jit):
  rng = np.random.default_rng(0)
  logp_old = rng.normal(size=(3, 5)).astype(np.float32)
  logp_ref = rng.normal(size=(3, 5)).astype(np.float32)
  mask = (rng.random((3, 5)) < 0.6).astype(np.float32)
  want = np.where(mask > 0, logp_old.astype(np.float64) - logp_ref, 0.0)
  per_token = test_util.maybe_jit(rewards.kl_penalty, use_jit, per_token=True)
  summed = test_util.maybe_jit(rewards.kl_penalty, use_jit)
  np.testing.assert_allclose(per_token(logp_old, logp_ref, mask), want, **test_util.TOL)
  np.testing.assert_allclose(summed(logp_old, logp_ref, mask), want.sum(axis=1), **test_util.TOL)


@test_util.JIT
def test_truncated_completions_fill_the_row_without_a_stop_token(use_jit):
  fn = test_util.maybe_jit(rewards.truncated_completions, use_jit, stop_ids=(2, 9))
  tokens = jnp.array([[5, 6, 7], [5, 2, 0], [5, 6, 2], [5, 6, 9], [5, 0, 0], [5, 6, 3]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 1]],
                   jnp.float32)
  # Cut; stopped early; stopped by EOS on the last slot; by another stop id; short; cut (3 is
  # not a stop id here).
  np.testing.assert_array_equal(np.asarray(fn(tokens, mask)),
                                [True, False, False, False, False, True])
