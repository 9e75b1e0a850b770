"""Tests of rl_curriculum/curriculum/allocation.py."""

import functools

from hypothesis import given, settings, strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum import allocation


def _reference_shares(weights, budget, g_max, g_min):
  """Water-filling by bisection in float64: x = min(cap, lam * w), sum x = B - P g_min."""
  w = np.maximum(np.asarray(weights, np.float64), 0.0)
  p = len(w)
  cap = float(g_max - g_min)
  total = budget - p * g_min
  pos = w > 0
  first = min(total, cap * pos.sum())
  lo, hi = 0.0, 1e12
  for _ in range(200):
    lam = 0.5 * (lo + hi)
    if np.minimum(cap, lam * w[pos]).sum() < first:
      lo = lam
    else:
      hi = lam
  x = np.where(pos, np.minimum(cap, hi * w), 0.0)
  rest = total - first
  if (~pos).any():
    x = x + np.where(~pos, rest / (~pos).sum(), 0.0)
  return x


def _check_allocation(alloc, weights, budget, g_max, g_min):
  counts, mask = np.asarray(alloc.counts), np.asarray(alloc.mask)
  assert counts.dtype == np.int32 and counts.sum() == budget
  assert np.all(counts >= g_min) and np.all(counts <= g_max)
  assert mask.shape == (len(counts), g_max)
  for p, c in enumerate(counts):
    np.testing.assert_array_equal(mask[p], [g < c for g in range(g_max)])
  x = _reference_shares(weights, budget, g_max, g_min)
  assert np.all(counts - g_min >= np.floor(x - 1e-4)), (counts, x)
  assert np.all(counts - g_min <= np.ceil(x + 1e-4)), (counts, x)


def test_variance_allocation_hand_computed():
  # Beta variances: (1,1) 1/12, (2,2) 1/20, (5,1) 5/252, (1,9) 9/1100. B = 20, G_max = 8, min 1:
  # R = 16; the first prompt caps at 7; 9 left over weights (.05, .0198, .0082) -> 5.75, 2.28,
  # 0.94; floors 5, 2, 0 and the two leftover units go to the fractions .94 and .75.
  alloc = jax.jit(functools.partial(allocation.allocate_by_variance, budget=20,
                                    max_per_prompt=8))(jnp.array([1.0, 2, 5, 1]),
                                                       jnp.array([1.0, 2, 1, 9]))
  np.testing.assert_array_equal(alloc.counts, [8, 7, 3, 2])
  np.testing.assert_array_equal(alloc.mask.sum(axis=1), [8, 7, 3, 2])


def test_beta_variance_formula():
  np.testing.assert_allclose(allocation.beta_variance(jnp.array([1.0, 2.0]), jnp.array([1.0, 3.0])),
                             [1 / 12, 6 / (25 * 6)], rtol=1e-6)


def test_uniform_allocation():
  alloc = allocation.allocate_uniform(4, budget=10, max_per_prompt=4)
  np.testing.assert_array_equal(alloc.counts, [3, 3, 2, 2])
  alloc = allocation.allocate_uniform(3, budget=24, max_per_prompt=8)
  np.testing.assert_array_equal(alloc.counts, [8, 8, 8])
  assert bool(alloc.mask.all())


def test_difficulty_allocation_orders_by_hardness():
  s = jnp.array([0.9, 0.1, 0.5, 1.0, 0.0])
  alloc = jax.jit(functools.partial(allocation.allocate_by_difficulty, budget=30,
                                    max_per_prompt=16, min_per_prompt=2))(s)
  c = np.asarray(alloc.counts)
  assert c.sum() == 30
  assert c[4] >= c[1] >= c[2] >= c[0] >= c[3] == 2
  assert c[4] > c[2] > c[0]
  _check_allocation(alloc, 1 - np.asarray(s), 30, 16, 2)


def test_variance_allocation_orders_by_posterior_width():
  a = jnp.array([1.0, 20.0, 3.0, 50.0])
  b = jnp.array([1.0, 20.0, 2.0, 1.0])
  c = np.asarray(allocation.allocate_by_variance(a, b, budget=24, max_per_prompt=16).counts)
  var = np.asarray(allocation.beta_variance(a, b))
  order = np.argsort(-var)
  assert np.all(np.diff(c[order]) <= 0), (c, var)
  assert c[0] > c[1]


def test_zero_weights_get_the_minimum_until_others_are_full():
  alloc = allocation.allocate_proportional(jnp.array([0.0, 2.0, 0.0, 1.0]), budget=10,
                                           max_per_prompt=4)
  np.testing.assert_array_equal(alloc.counts, [1, 4, 1, 4])
  alloc = allocation.allocate_proportional(jnp.array([0.0, 2.0, 0.0, 1.0]), budget=14,
                                           max_per_prompt=4)
  np.testing.assert_array_equal(alloc.counts, [3, 4, 3, 4])


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="budget"):
    allocation.allocate_uniform(4, budget=3, max_per_prompt=8)  # below P * min
  with pytest.raises(ValueError, match="budget"):
    allocation.allocate_uniform(4, budget=33, max_per_prompt=8)
  with pytest.raises(ValueError, match="min_per_prompt"):
    allocation.allocate_uniform(4, budget=8, max_per_prompt=2, min_per_prompt=3)
  with pytest.raises(ValueError, match="max_per_prompt"):
    allocation.allocate_uniform(4, budget=0, max_per_prompt=0)
  with pytest.raises(ValueError, match="weights"):
    allocation.allocate_proportional(jnp.ones((2, 2)), budget=4, max_per_prompt=2)


# P is fixed at 8 so the eager op cache is reused across examples.
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=8, max_size=8), st.sampled_from([1, 3, 8, 16]),
       st.integers(0, 3), st.floats(0.0, 1.0))
def test_allocation_properties(int_weights, g_max, g_min, frac):
  g_min = min(g_min, g_max)
  p = 8
  budget = int(round(p * g_min + frac * p * (g_max - g_min)))
  w = np.asarray(int_weights, np.float32)
  alloc = allocation.allocate_proportional(jnp.asarray(w), budget=budget, max_per_prompt=g_max,
                                           min_per_prompt=g_min)
  _check_allocation(alloc, w, budget, g_max, g_min)
  counts = np.asarray(alloc.counts)
  for i in range(p):
    for j in range(p):
      if w[i] > w[j]:
        assert counts[i] >= counts[j], (w, counts)
