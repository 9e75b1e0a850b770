"""Tests of rl_curriculum/curriculum/vade.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.vade import information_gain, vade
import test_util



def test_update_applies_both_decays_then_counts():
  pool = PromptPool.from_arms([0, 0, 1, 1])
  cur = vade(pool, batch_size=2)
  state = cur.init(pool, jax.random.key(0))
  stats = state.stats._replace(beta_a=jnp.array([3.0, 1.0, 1.0, 2.0]),
                               beta_b=jnp.array([1.0, 2.0, 1.0, 1.0]))
  state = state._replace(stats=stats)
  fb = test_util.feedback([[1, 1, 0, 0], [1, 0, 0, 0]], ids=[0, 2])
  state, m = jax.jit(cur.update)(state, fb)
  # Prompt 0 (batch): 1 + .9 * .99 * (3 - 1) + 2 = 4.782;  b: 1 + .891 * 0 + 2 = 3.
  # Prompt 1 (not in batch): a = 1, b = 1 + .99 * 1 = 1.99.
  # Prompt 2 (batch, at the prior): a = 1 + 1 = 2, b = 1 + 3 = 4.
  # Prompt 3: a = 1 + .99 * 1 = 1.99, b = 1.
  np.testing.assert_allclose(state.stats.beta_a, [4.782, 1.0, 2.0, 1.99], rtol=1e-6)
  np.testing.assert_allclose(state.stats.beta_b, [3.0, 1.99, 4.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(m["posterior_mean"], [4.782 / 7.782, 2.0 / 6.0], rtol=1e-6)
  assert float(m["batch_accuracy"]) == 3.0 / 8.0


def test_two_updates_compound_the_decays():
  pool = PromptPool.from_arms([0, 0])
  cur = vade(pool, batch_size=1, fast_decay=0.5, slow_decay=0.8, prior_a=2.0, prior_b=1.0)
  update = jax.jit(cur.update)
  state = cur.init(pool, jax.random.key(0))
  state, _ = update(state, test_util.feedback([[1, 1]], ids=[0]))  # a0 = 2 + 2 = 4, b0 = 1
  # Prompt 0 only slow: a = 2 + .8 * 2.
  state, _ = update(state, test_util.feedback([[0, 0]], ids=[1]))
  np.testing.assert_allclose(state.stats.beta_a, [3.6, 2.0], rtol=1e-6)
  np.testing.assert_allclose(state.stats.beta_b, [1.0, 3.0], rtol=1e-6)
  # Both: 2 + .4 * 1.6 + 1, b: 1 + 0 + 1.
  state, _ = update(state, test_util.feedback([[0, 1]], ids=[0]))
  np.testing.assert_allclose(state.stats.beta_a, [3.64, 2.0], rtol=1e-6)
  np.testing.assert_allclose(state.stats.beta_b, [2.0, 1.0 + 0.8 * 2.0], rtol=1e-6)


def test_thompson_selection_frequencies():
  # P = 2 of four prompts. Prompt 2 is sharp at .5 (score .25, never beaten): always chosen.
  # Prompt 3 is sharp near 1 (score ~0): never chosen. Prompt 0 ~ Beta(2, 2) beats prompt 1
  # (sharp at .2, score .16) when .2 < theta < .8: F(.8) - F(.2) = .896 - .104 = .792 with
  # F(x) = 3x^2 - 2x^3.
  pool = PromptPool.from_arms([0, 0, 0, 0])
  cur = vade(pool, batch_size=2)
  state = cur.init(pool, jax.random.key(0))
  state = state._replace(stats=state.stats._replace(
      beta_a=jnp.array([2.0, 2e5, 5e5, 1e6]), beta_b=jnp.array([2.0, 8e5, 5e5, 1.0])))
  n = 3000
  picks = jax.jit(jax.vmap(lambda k: cur.select(state, k)[0].prompt_ids))(
      jax.random.split(jax.random.key(1), n))
  picks = np.asarray(picks)
  assert (picks == 2).any(axis=1).all()
  assert not (picks == 3).any()
  wins = int((picks == 0).any(axis=1).sum())
  q = 0.792
  assert abs(wins - n * q) < 4.5 * np.sqrt(n * q * (1 - q)), wins


def test_information_gain():
  np.testing.assert_allclose(information_gain(jnp.array([0.0, 0.5, 0.2])), [0.0, 0.25, 0.16],
                             rtol=1e-6)


def test_bad_arguments_raise():
  for kwargs, name in [({"batch_size": 0}, "batch_size"), ({"num_candidates": 2}, "num_candidates"),
                       ({"fast_decay": 0.0}, "fast_decay"), ({"slow_decay": 1.5}, "slow_decay"),
                       ({"prior_a": 0.0}, "prior_a")]:
    with pytest.raises(ValueError, match=name):
      vade(1, **{"batch_size": 4, **kwargs})
  with pytest.raises(ValueError, match="pool"):
    pool = PromptPool.from_arms([0] * 5)
    vade(pool, batch_size=4, num_candidates=10).init(pool, jax.random.key(0))
