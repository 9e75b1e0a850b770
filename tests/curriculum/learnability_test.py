"""Tests for rl_curriculum/curriculum/learnability.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.learnability import (learnability, learnability_probabilities,
                                                   learnability_update)
from rl_curriculum.types import Feedback
import test_util

SIZES = (3, 5, 2, 6)
POOL = PromptPool.from_arms(np.repeat(np.arange(4), SIZES))


def _np_probs(p, sizes, epsilon):
  """NumPy reference: eps / K' + (1 - eps) w / sum w over non-empty arms, w = p (1 - p)."""
  p = np.asarray(p, np.float64)
  nonempty = np.asarray(sizes) > 0
  unif = nonempty / nonempty.sum()
  w = np.where(nonempty, p * (1 - p), 0.0)
  greedy = w / w.sum() if w.sum() > 0 else unif
  return epsilon * unif + (1 - epsilon) * greedy


def _random_feedback(sel, key, g=3):
  r = (jax.random.uniform(key, (sel.arms.shape[0], g)) < 0.5).astype(jnp.float32)
  return Feedback(prompt_ids=sel.prompt_ids, arms=sel.arms, rewards=r, correct=r > 0,
                  advantages=r - jnp.mean(r, axis=1, keepdims=True))


@test_util.JIT
def test_learnability_update_hand_computed(use_jit):
  cur = learnability(3, batch_size=3, alpha=0.3, epsilon=0.05)
  update = test_util.maybe_jit(cur.update, use_jit)
  state = cur.init(test_util.arm_pool(3), jax.random.key(0))
  np.testing.assert_array_equal(state.success, [0.5, 0.5, 0.5])
  # Step 1: arm 0 has 3 + 1 correct of 4 + 2 valid completions (s = 2/3), arm 1 none of 4
  # (s = 0); arm 2 is not sampled. The shaped rewards (all 1) are not read.
  correct = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
  valid = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]]
  fb = test_util.feedback(correct=np.asarray(correct, bool), rewards=np.ones((3, 4)),
                          ids=[0, 1, 4], arms=[0, 0, 1], valid=valid)
  state, m = update(state, fb)
  # p0 = .5 + .3 (2/3 - .5) = .55, p1 = .5 + .3 (0 - .5) = .35, p2 = .5.
  np.testing.assert_allclose(state.success, [0.55, 0.35, 0.5], atol=1e-6)
  np.testing.assert_array_equal(m["sampled"], [1.0, 1.0, 0.0])
  np.testing.assert_array_equal(m["arm_counts"], [2.0, 1.0, 0.0])
  # Step 2: arm 1 all right (s = 1); arm 2's group has no valid completion, so it keeps p.
  fb = test_util.feedback(correct=[[1, 1, 1, 1], [1, 1, 1, 1]], ids=[5, 8], arms=[1, 2],
                          valid=[[1, 1, 1, 1], [0, 0, 0, 0]])
  state, m = update(state, fb)
  # p1 = .35 + .3 (1 - .35) = .545.
  p = np.array([0.55, 0.545, 0.5])
  np.testing.assert_allclose(state.success, p, atol=1e-6)
  np.testing.assert_allclose(m["success"], p, atol=1e-6)
  np.testing.assert_array_equal(m["sampled"], [0.0, 1.0, 0.0])
  w = np.array([0.55 * 0.45, 0.545 * 0.455, 0.25])
  np.testing.assert_allclose(m["learnability"], w, atol=1e-6)
  np.testing.assert_allclose(m["probs"], 0.05 / 3 + 0.95 * w / w.sum(), atol=1e-6)
  assert int(np.argmax(m["probs"])) == 2  # the arm at p = 1/2


def test_initial_probabilities_uniform_over_nonempty_arms():
  pool = PromptPool.from_arms([0, 0, 2, 3, 3], num_arms=4)  # arm 1 holds no prompt
  cur = learnability(pool, batch_size=8)
  state = cur.init(pool, jax.random.key(0))
  probs = learnability_probabilities(state.success, state.sampler.sizes, 0.05)
  np.testing.assert_allclose(probs, [1 / 3, 0.0, 1 / 3, 1 / 3], rtol=1e-6)
  sel, _ = jax.jit(cur.select)(state, jax.random.key(1))
  assert not np.any(np.asarray(sel.arms) == 1)


def test_probabilities_peak_nearest_half_and_sum_to_one():
  p = jnp.array([0.05, 0.3, 0.55, 0.9, 1.0])
  probs = np.asarray(learnability_probabilities(p, jnp.ones(5, jnp.int32), 0.05))
  np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)
  assert int(np.argmax(probs)) == 2
  # Scores p (1 - p) rank the arms, and so do the probabilities.
  np.testing.assert_array_equal(np.argsort(probs), np.argsort(np.asarray(p * (1 - p))))


def test_epsilon_floor_and_all_zero_scores():
  sizes = jnp.array([2, 2, 2, 2], jnp.int32)
  probs = learnability_probabilities(jnp.array([0.0, 1.0, 0.5, 0.0]), sizes, 0.2)
  np.testing.assert_allclose(probs, [0.05, 0.05, 0.85, 0.05], rtol=1e-6)
  # Every score 0: uniform whatever epsilon.
  for eps in (0.0, 0.2):
    probs = learnability_probabilities(jnp.array([0.0, 1.0, 1.0, 0.0]), sizes, eps)
    np.testing.assert_allclose(probs, [0.25] * 4, rtol=1e-6)
  # epsilon = 1 is uniform; an empty arm gets nothing.
  probs = learnability_probabilities(jnp.array([0.1, 0.5, 0.2, 0.9]),
                                     jnp.array([2, 0, 2, 2], jnp.int32), 1.0)
  np.testing.assert_allclose(probs, [1 / 3, 0.0, 1 / 3, 1 / 3], rtol=1e-6)


def test_probabilities_match_numpy_reference():
  rng = np.random.default_rng(0)
  fn = jax.jit(learnability_probabilities)
  for trial in range(20):
    k = int(rng.integers(1, 9))
    p = rng.uniform(size=k).astype(np.float32)
    p[rng.uniform(size=k) < 0.2] = rng.choice([0.0, 1.0])
    sizes = rng.integers(0, 3, size=k).astype(np.int32)
    sizes[rng.integers(k)] = 1  # at least one arm with prompts
    eps = float(rng.choice([0.0, 0.05, 0.5, 1.0]))
    np.testing.assert_allclose(fn(p, sizes, eps), _np_probs(p, sizes, eps), rtol=1e-5,
                               atol=1e-7, err_msg=f"trial {trial}")


def test_untouched_arms_keep_their_estimate():
  cur = learnability(POOL, batch_size=6, alpha=0.7)
  state = cur.init(POOL, jax.random.key(0))
  state = state._replace(success=jnp.array([0.1, 0.2, 0.3, 0.4]))
  fb = test_util.feedback(rewards=np.ones((6, 3)), ids=[0, 1, 2, 0, 1, 2],
                          arms=[0, 0, 0, 2, 2, 2])
  state, m = jax.jit(cur.update)(state, fb)
  np.testing.assert_allclose(state.success, [0.1 + 0.7 * 0.9, 0.2, 0.3 + 0.7 * 0.7, 0.4],
                             atol=1e-6)
  np.testing.assert_array_equal(m["sampled"], [1.0, 0.0, 1.0, 0.0])
  before = jnp.array([0.1, 0.2])
  got = learnability_update(before, jnp.array([9.0, 9.0]), jnp.array([False, False]), 0.5)
  np.testing.assert_array_equal(got, before)


def _run(cur, steps, use_jit):
  chex.clear_trace_counter()
  once = (lambda fn: chex.assert_max_traces(fn, n=1)) if use_jit else (lambda fn: fn)
  select = test_util.maybe_jit(once(cur.select), use_jit)
  update = test_util.maybe_jit(once(cur.update), use_jit)
  state = cur.init(POOL, jax.random.key(0))
  out = []
  for t in range(steps):
    sel, state = select(state, jax.random.key(t))
    state, m = update(state, _random_feedback(sel, jax.random.key(50 + t)))
    out.append((np.asarray(sel.prompt_ids), np.asarray(m["probs"]), np.asarray(state.success)))
  return out


def test_jit_and_nojit_agree():
  """Same selections, probabilities and estimates; under jit, select and update trace once."""
  cur = learnability(POOL, batch_size=6, alpha=0.4, epsilon=0.1)
  for (ia, pa, sa), (ib, pb, sb) in zip(_run(cur, 3, False), _run(cur, 3, True)):
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_allclose(pa, pb, rtol=1e-6)
    np.testing.assert_allclose(sa, sb, rtol=1e-6)


def test_traced_options_match_concrete_ones():
  """alpha and epsilon may be traced (builders.TRACED_OPTIONS): same update as with numbers."""
  state = learnability(POOL, batch_size=4).init(POOL, jax.random.key(0))
  fb = test_util.feedback(correct=[[1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]], ids=[0, 3, 8, 10],
                          arms=[0, 1, 2, 3])

  @jax.jit
  def traced(alpha, epsilon, state, fb):
    return learnability(POOL, batch_size=4, alpha=alpha, epsilon=epsilon).update(state, fb)

  s_traced, m_traced = traced(jnp.float32(0.6), jnp.float32(0.3), state, fb)
  s_fixed, m_fixed = learnability(POOL, batch_size=4, alpha=0.6, epsilon=0.3).update(state, fb)
  np.testing.assert_allclose(s_traced.success, s_fixed.success, rtol=1e-6)
  np.testing.assert_allclose(m_traced["probs"], m_fixed["probs"], rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(alpha=0.0), "alpha"), (dict(alpha=1.5), "alpha"),
    (dict(epsilon=-0.1), "epsilon"), (dict(epsilon=1.1), "epsilon"),
    (dict(batch_size=0), "batch_size"),
])
def test_bad_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    learnability(3, **{"batch_size": 2, **kwargs})
