"""Tests of the horizon curriculum (rl_curriculum/curriculum/horizon.py) against hand-computed
values: TTI's linear schedule, the bandit's TD(0) update and reward, Boltzmann selection."""

import jax
import numpy as np
import pytest

from rl_curriculum.curriculum import horizon


def test_linear_schedule_runs_from_start_to_the_largest_horizon():
  assert [horizon.linear(t, 5, 1, 5) for t in range(1, 6)] == [1, 2, 3, 4, 5]
  assert [horizon.linear(t, 4, 2, 5) for t in range(1, 5)] == [2, 3, 4, 5]
  assert horizon.linear(1, 1, 2, 5) == 5
  state = horizon.init(5)
  key = jax.random.PRNGKey(0)
  assert horizon.select("fixed", state, key, step=1, steps=9, start=1, temperature=1.0) == 5
  assert horizon.select("linear", state, key, step=5, steps=9, start=1, temperature=1.0) == 3
  with pytest.raises(ValueError, match="unknown horizon mode"):
    horizon.select("random", state, key, step=1, steps=9, start=1, temperature=1.0)


def test_spread_is_the_mean_distance_of_returns_from_their_group_mean():
  rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
  valid = np.array([[True] * 4, [True, True, True, False], [True] * 4])
  # Group 1: mean 0.5, |r - 0.5| = 0.5 x 4; group 2 (three valid): mean 1, 0 x 3; group 3: 0 x 4.
  assert horizon.spread(rewards, valid) == pytest.approx(2.0 / 11.0)
  assert horizon.spread(rewards, np.eye(3, 4, dtype=bool)) == 0.0  # no group of two


def test_bandit_update_is_td0_on_the_horizon_used():
  state = horizon.update(horizon.init(3), 2, 0.4, 0.5)
  np.testing.assert_allclose(state.q, [0.0, 0.2, 0.0])
  state = horizon.update(state, 2, 0.0, 0.5)
  np.testing.assert_allclose(state.q, [0.0, 0.1, 0.0])
  np.testing.assert_array_equal(state.visits, [0, 2, 0])


def test_bandit_selects_horizons_by_boltzmann_probabilities():
  state = horizon.HorizonState(q=np.array([0.0, 0.2, 0.1], np.float32),
                               visits=np.zeros(3, np.int32))
  draws = [horizon.select("bandit", state, jax.random.PRNGKey(i), step=1, steps=1, start=1,
                          temperature=0.1) for i in range(3000)]
  want = np.exp(np.array([0.0, 2.0, 1.0]))
  want /= want.sum()
  got = np.bincount(draws, minlength=4)[1:] / len(draws)
  np.testing.assert_allclose(got, want, atol=0.03)  # 3,000 draws: a standard error under 0.01
