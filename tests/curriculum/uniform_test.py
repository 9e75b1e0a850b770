"""Tests for rl_curriculum/curriculum/uniform.py."""

import jax
import numpy as np

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.uniform import uniform
import test_util

SIZES = (3, 5, 2, 6)
POOL = PromptPool.from_arms(np.repeat(np.arange(4), SIZES))


def test_uniform_probabilities():
  fb = test_util.feedback(rewards=[[1.0]] * 4, ids=[0] * 4, arms=[0, 1, 2, 3])
  for by, expected in [("prompt", np.array(SIZES) / sum(SIZES)), ("arm", [0.25] * 4)]:
    cur = uniform(POOL, batch_size=4, by=by)
    _, m = cur.update(cur.init(POOL, jax.random.key(0)), fb)
    np.testing.assert_allclose(m["probs"], expected, rtol=1e-6)
