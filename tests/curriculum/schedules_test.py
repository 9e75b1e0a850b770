"""Tests for rl_curriculum/curriculum/schedules.py."""

import jax
import numpy as np

from rl_curriculum.curriculum.schedules import (cyclical, easy_to_hard, hard_to_easy,
                                                linear_pacing, mixed_replay)
import test_util


def _probs_sequence(cur, k, steps, correct=0.0):
  """Probabilities of the next selection after each of `steps` updates (all arms sampled)."""
  update = jax.jit(cur.update)
  state = cur.init(test_util.arm_pool(k), jax.random.key(0))
  out = []
  for _ in range(steps):
    fb = test_util.feedback(rewards=[[correct, correct]] * k, ids=[0] * k, arms=list(range(k)))
    state, m = update(state, fb)
    out.append(np.asarray(m["probs"]))
  return np.stack(out)


def test_easy_to_hard_advances_every_n_steps():
  cur = easy_to_hard(3, batch_size=2, steps_per_arm=2)
  sel, _ = jax.jit(cur.select)(cur.init(test_util.arm_pool(3), jax.random.key(0)), jax.random.key(1))
  np.testing.assert_array_equal(sel.arms, [0, 0])
  p = _probs_sequence(cur, 3, 6)
  np.testing.assert_array_equal(np.argmax(p, axis=1), [0, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(p.max(axis=1), 1.0)


def test_easy_to_hard_advances_on_accuracy():
  cur = easy_to_hard(3, batch_size=2, steps_per_arm=None, accuracy_threshold=0.7)
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 2, correct=0.0), 1), [0, 0])
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 3, correct=1.0), 1), [1, 2, 2])


def test_hard_to_easy_and_custom_order():
  cur = hard_to_easy(3, batch_size=2, steps_per_arm=1)
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 3), 1), [1, 0, 0])
  cur = easy_to_hard(3, batch_size=2, steps_per_arm=1, order=[2, 0, 1])
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 3), 1), [0, 1, 1])


def test_linear_pacing_hand_computed():
  # m(t) = 1 + floor(2 t / 4): t = 1..5 -> 1, 2, 2, 3, 3.
  p = _probs_sequence(linear_pacing(3, batch_size=2, steps_to_full=4), 3, 5)
  expected = [[1, 0, 0], [.5, .5, 0], [.5, .5, 0], [1 / 3] * 3, [1 / 3] * 3]
  np.testing.assert_allclose(p, expected, rtol=1e-6)


def test_cyclical_hand_computed():
  # Period 4: tri = 0, .5, 1, .5, 0 at t = 0..4; m = 1 + round(2 tri) = 1, 2, 3, 2, 1.
  p = _probs_sequence(cyclical(3, batch_size=2, period=4), 3, 4)
  expected = [[.5, .5, 0], [1 / 3] * 3, [.5, .5, 0], [1, 0, 0]]
  np.testing.assert_allclose(p, expected, rtol=1e-6)


def test_mixed_replay_hand_computed():
  p = _probs_sequence(mixed_replay(3, batch_size=2, steps_per_arm=1, replay_prob=0.2), 3, 3)
  np.testing.assert_allclose(p, [[.2, .8, 0], [.1, .1, .8], [.1, .1, .8]], rtol=1e-6)
