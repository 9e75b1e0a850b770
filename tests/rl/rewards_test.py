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
def test_truncated_rows_end_without_a_stop_token(use_jit):
  fn = test_util.maybe_jit(rewards.truncated_completions, use_jit, stop_ids=(2, 9))
  tokens = jnp.array([[5, 6, 7], [5, 2, 0], [5, 6, 2], [5, 6, 9], [5, 0, 0], [5, 6, 3],
                      [0, 0, 0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 1],
                    [0, 0, 0]], jnp.float32)
  # Cut at the cap; stopped early; stopped by EOS on the last slot; by another stop id; cut by
  # its own token limit after one token; cut (3 is not a stop id here); never sampled.
  np.testing.assert_array_equal(np.asarray(fn(tokens, mask)),
                                [True, False, False, False, True, True, False])


@test_util.JIT
def test_an_episode_is_judged_by_its_last_turn(use_jit):
  """Rows with turns (observations at mask 0 between them): the reward sits on the last turn's
  last drawn token, and only the last turn's ending decides truncation."""
  reward_fn = test_util.maybe_jit(rewards.outcome_token_rewards, use_jit)
  cut_fn = test_util.maybe_jit(rewards.truncated_completions, use_jit, stop_ids=(2,))
  tokens = jnp.array([[5, 6, 2, 8, 8, 5, 2, 0], [5, 6, 8, 8, 8, 5, 6, 0],
                      [5, 6, 2, 8, 8, 8, 8, 8]])
  mask = jnp.array([[1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 1, 1, 0],
                    [1, 1, 1, 0, 0, 0, 0, 0]], jnp.float32)
  got = np.asarray(reward_fn(jnp.array([1.0, 2.0, 3.0]), mask))
  want = np.zeros((3, 8), np.float32)
  want[0, 6], want[1, 6], want[2, 2] = 1.0, 2.0, 3.0
  np.testing.assert_array_equal(got, want)
  # Both turns stopped; the last turn ends on 6, no stop id (cut by its token limit); one turn
  # that stopped, an observation after it.
  np.testing.assert_array_equal(np.asarray(cut_fn(tokens, mask)), [False, True, False])
