"""Tests of rl_curriculum/sampling/strategies.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rl_curriculum.sampling import strategies


def _logits(seed, shape=(4, 12), scale=2.0):
  return np.asarray(scale * jax.random.normal(jax.random.key(seed), shape), np.float32)


def _np_top_k_keep(row, k):
  order = sorted(range(len(row)), key=lambda i: -row[i])
  return set(order[:k])


def _np_top_p_keep(row, p):
  probs = np.exp(row.astype(np.float64) - row.max())
  probs /= probs.sum()
  keep, mass = set(), 0.0
  for i in sorted(range(len(row)), key=lambda i: -row[i]):
    if mass < p:
      keep.add(i)
    mass += probs[i]
  return keep


@pytest.mark.parametrize("jit", [False, True])
def test_argmax_is_row_argmax(jit):
  logits = _logits(0)
  fn = jax.jit(strategies.argmax) if jit else strategies.argmax
  expected = [max(range(logits.shape[1]), key=lambda v: row[v]) for row in logits]
  np.testing.assert_array_equal(fn(logits), expected)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("k", [1, 3, 11])
def test_top_k_filter_matches_reference(k, jit):
  logits = _logits(1)
  fn = jax.jit(strategies.top_k_filter, static_argnums=1) if jit else strategies.top_k_filter
  out = np.asarray(fn(logits, k))
  for row_in, row_out in zip(logits, out):
    keep = _np_top_k_keep(row_in, k)
    for v in range(len(row_in)):
      assert row_out[v] == (row_in[v] if v in keep else -np.inf)


def test_top_k_off_leaves_logits_unchanged():
  logits = _logits(2)
  np.testing.assert_array_equal(strategies.top_k_filter(logits, 0), logits)
  np.testing.assert_array_equal(strategies.top_k_filter(logits, 12), logits)


@settings(max_examples=25, deadline=None)
@given(p=st.floats(0.01, 0.99), seed=st.integers(0, 1000))
def test_top_p_filter_matches_reference(p, seed):
  logits = _logits(seed)
  out = np.asarray(_top_p_jit(logits, p))
  for row_in, row_out in zip(logits, out):
    keep = _np_top_p_keep(row_in, p)
    assert keep == {v for v in range(len(row_in)) if np.isfinite(row_out[v])}
    np.testing.assert_array_equal(row_out[sorted(keep)], row_in[sorted(keep)])


_top_p_jit = jax.jit(strategies.top_p_filter)


def test_top_p_jit_and_no_jit_agree():
  logits = _logits(3)
  np.testing.assert_array_equal(strategies.top_p_filter(logits, 0.7), _top_p_jit(logits, 0.7))


def test_top_p_one_is_exactly_plain_sampling():
  # A near-one-hot row has tail probabilities below float32 resolution, where a cumulative-sum
  # test alone would drop tokens.
  logits = np.concatenate([_logits(4), np.array([[60.0] + [0.0] * 11], np.float32)])
  filtered = _top_p_jit(logits, 1.0)
  np.testing.assert_array_equal(filtered, logits)
  for seed in range(20):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(jax.random.categorical(key, filtered),
                                  jax.random.categorical(key, logits))


def test_top_k_one_and_tiny_temperature_sample_the_argmax():
  logits = _logits(5)
  expected = strategies.argmax(logits)
  for seed in range(20):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(strategies.sample_token(logits, key, top_k=1), expected)
    np.testing.assert_array_equal(
        strategies.sample_token(logits, key, temperature=1e-6), expected)


def test_samples_stay_inside_the_kept_set():
  logits = _logits(6, scale=0.5)
  draw = jax.jit(jax.vmap(lambda key: strategies.sample_token(logits, key, top_k=4, top_p=0.6)))
  samples = np.asarray(draw(jax.random.split(jax.random.key(0), 200)))  # [200, B]
  for b, row in enumerate(logits):
    allowed = _np_top_k_keep(row, 4) & _np_top_p_keep(
        np.where([v in _np_top_k_keep(row, 4) for v in range(len(row))], row, -np.inf), 0.6)
    assert set(samples[:, b].tolist()) <= allowed


def test_temperature_divides_logits():
  logits = _logits(7)
  np.testing.assert_allclose(strategies.apply_temperature(logits, 0.5), 2.0 * logits, rtol=1e-7)
  np.testing.assert_allclose(jax.jit(strategies.apply_temperature)(logits, jnp.float32(4.0)),
                             logits / 4.0, rtol=1e-7)


def test_inverse_cdf_draw_follows_the_distribution_and_never_draws_filtered_tokens():
  probs = np.array([0.1, 0.25, 0.0, 0.05, 0.6])
  logits = jnp.log(jnp.asarray(np.tile(probs, (4000, 1)), jnp.float32))
  keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.PRNGKey(3), r))(jnp.arange(4000))
  draws = np.asarray(strategies.inverse_cdf_draw(logits, keys))
  freq = np.bincount(draws, minlength=5) / len(draws)
  assert freq[2] == 0.0
  # 4000 draws: a binomial standard error of at most 0.008; 4 of them is far outside chance.
  np.testing.assert_allclose(freq, probs, atol=0.032)
  # The same key gives the same token whatever the other rows are.
  one = strategies.inverse_cdf_draw(logits[:1], keys[7:8])
  assert int(one[0]) == int(draws[7])
