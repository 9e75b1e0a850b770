"""Tests for rl_curriculum/curriculum/dump.py."""

import math

import jax
import numpy as np

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.dump import dump
import test_util


def test_dump_hand_computed():
  cur = dump(2, batch_size=3, window=3, temperature=0.1)
  update = jax.jit(cur.update)
  state = cur.init(PromptPool.from_arms([0, 0, 1, 1]), jax.random.key(0))
  # Arm 0 receives |A| = .2 .2 .4 0 (4 values, window 3 keeps .2 .4 0); arm 1 receives 1 .5.
  state, m = update(state, test_util.feedback(rewards=[[0, 0]] * 3, ids=[0] * 3, arms=[0, 0, 1],
                                              advantages=[[0.2, -0.2], [0.4, 0.0], [1.0, -0.5]]))
  np.testing.assert_array_equal(state.counts, [2, 1])
  np.testing.assert_array_equal(state.filled, [3, 2])
  np.testing.assert_allclose(m["window_mean"], [0.2, 0.75], rtol=1e-6)
  s = np.array([0.2 + math.sqrt(2 * math.log(4) / 3), 0.75 + math.sqrt(2 * math.log(4) / 2)])
  np.testing.assert_allclose(m["score"], s, rtol=1e-6)
  e = np.exp(s / 0.1)
  np.testing.assert_allclose(m["probs"], e / e.sum(), rtol=1e-5)
  # Arm 1 receives .1 .1 .3 .3 0 0 with one invalid slot (the second .3): window keeps .3 0 0.
  valid = [[True, True], [True, False], [True, True]]
  state, m = update(state, test_util.feedback(rewards=[[0, 0]] * 3, ids=[0] * 3, arms=[1, 1, 1],
                                              advantages=[[0.1, 0.1], [0.3, 0.3], [0.0, 0.0]],
                                              valid=valid))
  np.testing.assert_array_equal(state.counts, [2, 4])
  np.testing.assert_allclose(m["window_mean"], [0.2, 0.1], rtol=1e-6)
  s = np.array([0.2 + math.sqrt(2 * math.log(7) / 3), 0.1 + math.sqrt(2 * math.log(7) / 5)])
  np.testing.assert_allclose(m["score"], s, rtol=1e-6)
  e = np.exp(s / 0.1)
  np.testing.assert_allclose(m["probs"], e / e.sum(), rtol=1e-5)
