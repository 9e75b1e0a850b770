"""Tests of rl_curriculum/curriculum/hard_focus.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.hard_focus import hard_focus
import test_util

EMPTY = prompt_level.EMPTY
POOL = PromptPool.from_arms(np.arange(24) % 3)



def test_retains_the_lowest_accuracy_prompts():
  cur = hard_focus(POOL, batch_size=4, retained_size=2)
  update = jax.jit(cur.update)
  state = cur.init(POOL, jax.random.key(0))
  # Accuracies 0, .25, .75, .5: .75 is above max_accuracy; of the rest, 0 and .25 are lowest.
  state, m = update(state, test_util.feedback([[0] * 4, [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]],
                                              ids=[10, 11, 12, 13]))
  np.testing.assert_array_equal(state.retained.ids, [10, 11])
  np.testing.assert_allclose(state.retained.priority, [1.0, 0.75])
  assert float(m["retained_mean_accuracy"]) == pytest.approx(0.125)
  # 10 is solved now -> leaves; 14 at .5 enters.
  state, m = update(state, test_util.feedback([[1] * 4, [1, 1, 0, 0], [1] * 4, [1] * 4],
                                              ids=[10, 14, 15, 16]))
  np.testing.assert_array_equal(state.retained.ids, [11, 14])
  assert int(m["retained_fill"]) == 2


def test_min_accuracy_leaves_out_all_wrong_groups():
  cur = hard_focus(POOL, batch_size=2, retained_size=3, min_accuracy=0.1)
  state, _ = jax.jit(cur.update)(cur.init(POOL, jax.random.key(0)),
                                 test_util.feedback([[0] * 4, [1, 0, 0, 0]], ids=[1, 2]))
  np.testing.assert_array_equal(state.retained.ids, [2, EMPTY, EMPTY])


def test_select_draws_the_retained_share():
  cur = hard_focus(POOL, batch_size=4, retained_size=3, retain_fraction=0.5)
  state = cur.init(POOL, jax.random.key(0))
  state = state._replace(retained=prompt_level.Memory(
      ids=jnp.array([5, 7, 9], jnp.int32), priority=jnp.array([1.0, 0.9, 0.6]),
      age=jnp.zeros(3, jnp.int32)))
  select = jax.jit(cur.select)
  for t in range(4):
    ids = np.asarray(select(state, jax.random.key(t))[0].prompt_ids)
    assert set(ids[:2]) <= {5, 7, 9} and len(set(ids)) == 4 and not set(ids[2:]) & set(ids[:2])


def test_bad_arguments_raise():
  for kwargs, name in [({"batch_size": 0}, "batch_size"), ({"retained_size": 0}, "retained_size"),
                       ({"retain_fraction": 2.0}, "retain_fraction"),
                       ({"min_accuracy": 0.6}, "min_accuracy"), ({"max_age": -2}, "max_age")]:
    with pytest.raises(ValueError, match=name):
      hard_focus(POOL, **{"batch_size": 4, **kwargs})
  with pytest.raises(ValueError, match="pool"):
    hard_focus(POOL, batch_size=20, retain_fraction=0.5).init(POOL, jax.random.key(0))
