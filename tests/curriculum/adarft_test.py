"""Tests of rl_curriculum/curriculum/adarft.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from rl_curriculum.curriculum.adarft import adarft, closest_to_target, target_update
from rl_curriculum.curriculum.base import PromptPool
import test_util

POOL = PromptPool.from_arms([0, 1, 1, 1, 2, 1], difficulty=[0.1, 0.5, 0.45, 0.52, 0.9, 0.5])



def test_target_update_hand_values_and_clip():
  cur = adarft(POOL, batch_size=2, eta=0.2, sensitivity=2.0, beta=0.5, initial_target=0.3)
  update = jax.jit(cur.update)
  state = cur.init(POOL, jax.random.key(0))
  assert float(state.target) == pytest.approx(0.3)
  # Valid completions: row 0 2/4, row 1 1/1 -> R = 3/5.
  fb = test_util.feedback([[1, 1, 0, 0], [1, 0, 0, 0]], valid=[[1, 1, 1, 1], [1, 0, 0, 0]])
  state, m = update(state, fb)
  assert float(m["mean_reward"]) == pytest.approx(0.6)
  assert float(state.target) == pytest.approx(0.3 + 0.2 * math.tanh(0.2), abs=1e-6)
  # From .85 with R = 1: .85 + .2 tanh(1) = 1.002 -> clipped to d_max = .9 (the pool's largest).
  state, m = update(state._replace(target=jnp.float32(0.85)), test_util.feedback([[1, 1], [1, 1]]))
  assert float(state.target) == pytest.approx(0.9)
  # R = 0 from .2: .2 - .2 tanh(1) = .0477 -> clipped to d_min = .1.
  state, _ = update(state._replace(target=jnp.float32(0.2)), test_util.feedback([[0, 0], [0, 0]]))
  assert float(state.target) == pytest.approx(0.1)
  # Nothing valid: T unchanged.
  state, _ = update(state, test_util.feedback([[1, 1], [1, 1]], valid=[[0, 0], [0, 0]]))
  assert float(state.target) == pytest.approx(0.1)


def test_target_update_function_matches_formula():
  out = jax.jit(target_update, static_argnames=("sensitivity", "beta"))(
      jnp.float32(2.0), jnp.float32(0.25), eta=jnp.float32(1.5), sensitivity=3.0, beta=0.4,
      d_min=jnp.float32(0.0), d_max=jnp.float32(10.0))
  assert float(out) == pytest.approx(2.0 + 1.5 * math.tanh(3.0 * (0.25 - 0.4)), abs=1e-6)


def test_reward_source_switch():
  fb = test_util.feedback([[1, 0], [0, 0]], rewards=[[1.1, 0.1], [0.1, 0.1]])
  cur = adarft(POOL, batch_size=2, eta=1.0, initial_target=0.5)
  _, m = jax.jit(cur.update)(cur.init(POOL, jax.random.key(0)), fb)
  assert float(m["mean_reward"]) == pytest.approx(0.25)
  cur = adarft(POOL, batch_size=2, eta=1.0, initial_target=0.5, reward_source="reward")
  _, m = jax.jit(cur.update)(cur.init(POOL, jax.random.key(0)), fb)
  assert float(m["mean_reward"]) == pytest.approx(0.35)


def test_defaults_from_the_pool():
  state = adarft(POOL, batch_size=2).init(POOL, jax.random.key(0))
  assert float(state.target) == pytest.approx(0.1)
  assert float(state.d_min) == pytest.approx(0.1) and float(state.d_max) == pytest.approx(0.9)
  assert float(state.eta) == pytest.approx(0.08)


def test_select_closest_to_target():
  cur = adarft(POOL, batch_size=3, initial_target=0.5)
  select = jax.jit(cur.select)
  state = cur.init(POOL, jax.random.key(0))
  for t in range(3):
    sel, new = select(state, jax.random.key(t))
    assert set(np.asarray(sel.prompt_ids).tolist()) == {1, 5, 3}  # distances 0, 0, .02
    np.testing.assert_array_equal(sel.arms, [1, 1, 1])
    np.testing.assert_array_equal(np.sort(new.previous), [1, 3, 5])


def test_ties_are_broken_uniformly():
  diff = jnp.array([0.0, 1.0, 1.0, 1.0, 1.0, 2.0])
  fn = jax.jit(jax.vmap(lambda k: closest_to_target(k, diff, jnp.float32(1.0), 1)))
  picks = np.asarray(fn(jax.random.split(jax.random.key(0), 2000)))[:, 0]
  counts = np.bincount(picks, minlength=6)
  assert counts[0] == counts[5] == 0
  assert sps.chisquare(counts[1:5]).pvalue > 1e-3, counts


def test_no_repeat_skips_the_previous_batch():
  pool = PromptPool.from_arms([0] * 8, difficulty=[0.0] * 8)
  cur = adarft(pool, batch_size=4, no_repeat=True)
  select = jax.jit(cur.select)
  state = cur.init(pool, jax.random.key(0))
  sel1, state = select(state, jax.random.key(1))
  sel2, state = select(state, jax.random.key(2))
  assert not set(np.asarray(sel1.prompt_ids).tolist()) & set(np.asarray(sel2.prompt_ids).tolist())


def test_bad_arguments_raise():
  for kwargs, name in [({"batch_size": 0}, "batch_size"), ({"eta": -1.0}, "eta"),
                       ({"sensitivity": 0.0}, "sensitivity"), ({"beta": 1.5}, "beta"),
                       ({"d_min": 2.0, "d_max": 1.0}, "d_min"),
                       ({"reward_source": "advantage"}, "reward_source")]:
    with pytest.raises(ValueError, match=name):
      adarft(POOL, **{"batch_size": 2, **kwargs})
  with pytest.raises(ValueError, match="no_repeat"):
    adarft(POOL, batch_size=4, no_repeat=True).init(POOL, jax.random.key(0))
