"""Tests for rl_curriculum/curriculum/teachers.py."""

import jax
import numpy as np
import pytest

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.teachers import alp_teacher, mastering_rate
import test_util


def test_alp_teacher_hand_computed():
  # W = 2 steps, ring of 4 steps per arm; each step pushes (correct, valid) per sampled arm.
  cur = alp_teacher(2, batch_size=2, window=2, epsilon=0.2)
  update = jax.jit(cur.update)
  state = cur.init(PromptPool.from_arms([0, 0, 1, 1]), jax.random.key(0))
  # Arm 0 pushes (3, 4): recent .75, older window empty -> ALP 0, uniform.
  state, m = update(state, test_util.feedback(rewards=[[1, 1], [1, 0]], ids=[0, 0], arms=[0, 0]))
  np.testing.assert_allclose(m["recent"], [0.75, 0.0])
  np.testing.assert_allclose(m["alp"], [0.0, 0.0])
  np.testing.assert_allclose(m["probs"], [0.5, 0.5], rtol=1e-6)
  # Arm 0 pushes (0, 2), arm 1 (2, 2): arm 0 recent 3/6 = .5, older still empty.
  state, m = update(state, test_util.feedback(rewards=[[0, 0], [1, 1]], ids=[0, 0], arms=[0, 1]))
  np.testing.assert_allclose(m["recent"], [0.5, 1.0])
  np.testing.assert_allclose(m["alp"], [0.0, 0.0])
  np.testing.assert_array_equal(state.filled, [2, 1])
  # Arm 0 pushes (1, 3) (one invalid slot): recent (0 + 1) / (2 + 3) = .2, older 3/4 = .75,
  # ALP .55 -> pi = .1 + .8 [1, 0]. Arm 1 is not sampled and keeps its window.
  valid = [[True, True], [False, True]]
  state, m = update(state, test_util.feedback(rewards=[[0, 0], [1, 1]], ids=[0, 0], arms=[0, 0],
                                              valid=valid))
  np.testing.assert_allclose(m["recent"], [0.2, 1.0], rtol=1e-6)
  np.testing.assert_allclose(m["older"], [0.75, 0.0])
  np.testing.assert_allclose(m["alp"], [0.55, 0.0], rtol=1e-6)
  np.testing.assert_allclose(m["probs"], [0.9, 0.1], rtol=1e-6)
  # Arm 0's group has no valid completion: it pushes nothing. Arm 1 pushes (1, 2).
  valid = [[True, True], [False, False]]
  state, m = update(state, test_util.feedback(rewards=[[1, 0], [1, 1]], ids=[0, 0], arms=[1, 0],
                                              valid=valid))
  np.testing.assert_array_equal(state.filled, [3, 2])
  np.testing.assert_array_equal(m["arm_counts"], [1, 1])
  np.testing.assert_allclose(m["recent"], [0.2, 0.75], rtol=1e-6)
  np.testing.assert_allclose(m["alp"], [0.55, 0.0], rtol=1e-6)
  # Arm 0 pushes (4, 4) and fills its ring (3,4) (0,2) (1,3) (4,4):
  # recent (1 + 4) / (3 + 4) = 5/7, older (3 + 0) / (4 + 2) = .5, ALP 3/14.
  state, m = update(state, test_util.feedback(rewards=[[1, 1], [1, 1]], ids=[0, 0], arms=[0, 0]))
  np.testing.assert_allclose(m["recent"][0], 5 / 7, rtol=1e-6)
  np.testing.assert_allclose(m["older"][0], 0.5, rtol=1e-6)
  np.testing.assert_allclose(m["alp"], [3 / 14, 0.0], rtol=1e-6)
  # Arm 0 pushes (0, 2) over its oldest entry (3, 4): ring (0,2) (1,3) (4,4) (0,2), recent
  # 4/6, older 1/5, ALP 7/15. Arm 1 pushes (0, 2): (2,2) (1,2) (0,2), recent 1/4, older 1, ALP .75.
  state, m = update(state, test_util.feedback(rewards=[[0, 0], [0, 0]], ids=[0, 0], arms=[0, 1]))
  np.testing.assert_array_equal(state.filled, [4, 3])
  np.testing.assert_allclose(m["recent"], [2 / 3, 0.25], rtol=1e-6)
  np.testing.assert_allclose(m["older"], [0.2, 1.0], rtol=1e-6)
  alp = np.array([7 / 15, 0.75])
  np.testing.assert_allclose(m["alp"], alp, rtol=1e-6)
  np.testing.assert_allclose(m["probs"], 0.1 + 0.8 * alp / alp.sum(), rtol=1e-6)


@pytest.mark.parametrize("window", [1, 2, None])
def test_alp_windows_count_steps_not_completions(window):
  """256 prompts x 8 completions over 3 arms: accuracy 0 for W steps, then 1 for W steps.

  The older window holds the W zero steps and the recent one the W one steps, so ALP = 1 on every
  arm. Windows counted in completions fill both halves from one step of 256 x 8 outcomes and read
  ALP = 0. None builds the default window (8 steps).
  """
  kwargs = {} if window is None else {"window": window}
  steps = 8 if window is None else window
  cur = alp_teacher(3, batch_size=256, **kwargs)
  update = jax.jit(cur.update)
  state = cur.init(test_util.arm_pool(3), jax.random.key(0))
  arms = np.arange(256) % 3
  for t in range(2 * steps):
    fb = test_util.feedback(rewards=np.full((256, 8), float(t >= steps)), ids=np.zeros(256),
                            arms=arms)
    state, m = update(state, fb)
    if t < steps:  # the older window is still empty
      np.testing.assert_allclose(m["alp"], [0.0] * 3, err_msg=f"step {t + 1}")
  np.testing.assert_allclose(m["alp"], [1.0] * 3)
  np.testing.assert_allclose(m["recent"], [1.0] * 3)
  np.testing.assert_allclose(m["older"], [0.0] * 3)
  np.testing.assert_allclose(m["probs"], [1 / 3] * 3, rtol=1e-6)


def test_mastering_rate_chain():
  cur = mastering_rate(3, batch_size=2, unlock_threshold=0.5, mastery_threshold=0.85, rate=0.5)
  update = jax.jit(cur.update)
  state = cur.init(test_util.arm_pool(3), jax.random.key(0))
  sel, _ = jax.jit(cur.select)(state, jax.random.key(1))
  np.testing.assert_array_equal(sel.arms, [0, 0])  # only arm 0 is available at first
  five = lambda c, arm: test_util.feedback(rewards=[[1.0] * c + [0.0] * (5 - c)], ids=[0],
                                          arms=[arm])
  state, m = update(state, five(3, 0))  # success .6 -> unlocks arm 1
  np.testing.assert_allclose(m["probs"], [0.5, 0.5, 0.0])
  state, m = update(state, five(5, 0))  # .6 + .5 (1 - .6) = .8
  np.testing.assert_allclose(m["success"], [0.8, 0.0, 0.0], rtol=1e-6)
  state, m = update(state, five(5, 0))  # .9 >= .85: arm 0 mastered
  np.testing.assert_allclose(m["probs"], [0.0, 1.0, 0.0])
  state, m = update(state, five(5, 1))  # arm 1 at 1.0: mastered, unlocks 2
  np.testing.assert_allclose(m["probs"], [0.0, 0.0, 1.0])
  state, m = update(state, five(5, 2))  # all mastered: all available arms
  np.testing.assert_allclose(m["probs"], [1 / 3] * 3, rtol=1e-6)
