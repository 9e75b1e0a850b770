"""Tests of rl_curriculum/curriculum/vcrl.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.vcrl import vcrl
import test_util

EMPTY = prompt_level.EMPTY
POOL = PromptPool.from_arms(np.arange(20) % 2)



def _scores(values, valid, *, var_max=0.25, score_on="correct", use_jit=True):
  """The update's normalised group variances p = Var(r) / Var_max of distinct prompts."""
  p = len(values)
  pool = PromptPool.from_arms(np.zeros(2 * p, int))
  cur = vcrl(pool, batch_size=p, var_max=var_max, score_on=score_on)
  update = jax.jit(cur.update) if use_jit else cur.update
  values = np.asarray(values, np.float32)
  fb = test_util.feedback(values > 0.5, rewards=values, valid=valid)
  return update(cur.init(pool, jax.random.key(0)), fb)[1]


@test_util.JIT
def test_update_scores_hand_values(use_jit):
  r = [[1.0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 0, 0]]
  valid = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]]
  # Var: .25, 3/16, 0, no valid slot, [1, 0] -> .25.
  np.testing.assert_allclose(_scores(r, valid, use_jit=use_jit)["scores"],
                             [1.0, 0.75, 0.0, 0.0, 1.0], rtol=1e-6)
  scores = _scores([[0.0, 2.0], [1.0, 1.0]], np.ones((2, 2)), var_max=4.0, score_on="reward",
                   use_jit=use_jit)["scores"]
  np.testing.assert_allclose(scores, [0.25, 0.0], rtol=1e-6)


def test_update_scores_match_a_loop_reference():
  rng = np.random.default_rng(3)
  r = rng.normal(size=(7, 5)).astype(np.float32)
  valid = rng.random((7, 5)) < 0.7
  want = []
  for p in range(7):
    vals = [float(r[p, g]) for g in range(5) if valid[p, g]]
    if not vals:
      want.append(0.0)
      continue
    m = sum(vals) / len(vals)
    want.append(sum((v - m) ** 2 for v in vals) / len(vals) / 0.5)
  np.testing.assert_allclose(_scores(r, valid, var_max=0.5, score_on="reward")["scores"], want,
                             rtol=1e-5, atol=1e-6)


def test_memory_insertion_eviction_and_removal():
  cur = vcrl(POOL, batch_size=4, memory_size=2, replay_fraction=0.5, threshold=0.5)
  update = jax.jit(cur.update)
  state = cur.init(POOL, jax.random.key(0))
  # Scores: 2/4 -> 1.0, 1/4 -> .75, 0/4 -> 0, 4/4 -> 0.
  fb = test_util.feedback([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]],
                          ids=[3, 5, 7, 9])
  state, m = update(state, fb)
  np.testing.assert_allclose(m["scores"], [1.0, 0.75, 0.0, 0.0])
  np.testing.assert_array_equal(m["high_variance"], [True, True, False, False])
  np.testing.assert_array_equal(state.memory.ids, [3, 5])
  np.testing.assert_allclose(state.memory.priority, [1.0, 0.75])
  # 11 scores .75 (3/4): ties with 5, which is older -> 5 is evicted.
  state, _ = update(state, test_util.feedback([[1, 1, 1, 0]] + [[0] * 4] * 3, ids=[11, 12, 13, 14]))
  np.testing.assert_array_equal(state.memory.ids, [3, 11])
  np.testing.assert_array_equal(state.memory.age, [1, 0])
  # 3 is observed again as all-wrong: it leaves the memory.
  state, m = update(state, test_util.feedback([[0] * 4] * 4, ids=[3, 15, 16, 17]))
  np.testing.assert_array_equal(state.memory.ids, [11, EMPTY])
  assert int(m["memory_fill"]) == 1


def test_duplicate_rows_are_scored_pooled():
  cur = vcrl(POOL, batch_size=3, memory_size=4)
  state = cur.init(POOL, jax.random.key(0))
  # Prompt 2 twice: all right and all wrong -> pooled 4/8, score 1, one memory entry.
  fb = test_util.feedback([[1] * 4, [0] * 4, [1, 0, 0, 0]], ids=[2, 2, 6])
  state, m = jax.jit(cur.update)(state, fb)
  np.testing.assert_allclose(m["scores"], [1.0, 1.0, 0.75])
  np.testing.assert_array_equal(state.memory.ids, [2, 6, EMPTY, EMPTY])


def test_scores_use_correctness_not_shaped_reward_by_default():
  correct = np.array([[1, 1, 1, 1], [0, 0, 0, 0]])
  shaped = correct + 0.5 * np.array([[1, 0, 1, 0], [0, 1, 1, 0]])  # a format bonus
  fb = test_util.feedback(correct, rewards=shaped, ids=[1, 2])
  cur = vcrl(POOL, batch_size=2)
  _, m = jax.jit(cur.update)(cur.init(POOL, jax.random.key(0)), fb)
  np.testing.assert_allclose(m["scores"], [0.0, 0.0])
  cur = vcrl(POOL, batch_size=2, score_on="reward", var_max=0.0625)
  _, m = jax.jit(cur.update)(cur.init(POOL, jax.random.key(0)), fb)
  np.testing.assert_allclose(m["scores"], [1.0, 1.0])


def test_select_draws_replay_share_from_memory():
  cur = vcrl(POOL, batch_size=4, memory_size=3, replay_fraction=0.5)
  state = cur.init(POOL, jax.random.key(0))
  state = state._replace(memory=prompt_level.Memory(
      ids=jnp.array([4, 8, 12], jnp.int32), priority=jnp.array([1.0, 0.75, 0.5]),
      age=jnp.zeros(3, jnp.int32)))
  select = jax.jit(cur.select)
  for t in range(4):
    sel, _ = select(state, jax.random.key(t))
    ids = np.asarray(sel.prompt_ids)
    assert set(ids[:2]) <= {4, 8, 12} and not set(ids[2:]) & set(ids[:2])
    assert len(set(ids)) == 4


def test_bad_arguments_raise():
  for kwargs, name in [({"batch_size": 0}, "batch_size"), ({"memory_size": 0}, "memory_size"),
                       ({"replay_fraction": 1.5}, "replay_fraction"),
                       ({"threshold": -0.1}, "threshold"), ({"var_max": 0.0}, "var_max"),
                       ({"score_on": "advantage"}, "score_on"), ({"max_age": -1}, "max_age")]:
    with pytest.raises(ValueError, match=name):
      vcrl(POOL, **{"batch_size": 4, **kwargs})
  with pytest.raises(ValueError, match="pool"):
    vcrl(POOL, batch_size=16, replay_fraction=0.5).init(POOL, jax.random.key(0))
