"""Tests of rl_curriculum/model/attention.py: the causal slot mask and grouped-query attention."""

import jax.numpy as jnp
import numpy as np
import pytest

import test_util
from rl_curriculum.model import attention
from rl_curriculum.model import kv_cache


def _random(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _loop_reference(q, keys, values, mask):
  """float64 attention with loops over rows, queries and heads: q[B, T, Hkv, G, d]."""
  q, keys, values, mask = (np.asarray(x, np.float64) for x in (q, keys, values, mask))
  b, t, hkv, g, d = q.shape
  out = np.zeros(q.shape)
  for row in range(b):
    for i in range(t):
      valid = mask[row, i].astype(bool)
      if not valid.any():
        continue
      for k in range(hkv):
        for j in range(g):
          scores = keys[row, valid, k] @ q[row, i, k, j] / np.sqrt(d)
          probs = np.exp(scores - scores.max())
          out[row, i, k, j] = (probs / probs.sum()) @ values[row, valid, k]
  return out


def test_causal_slot_mask_by_hand():
  key_mask = jnp.asarray([[False, True, True, True]])
  got = attention.causal_slot_mask(key_mask, jnp.asarray([1, 3], jnp.int32), 4)
  np.testing.assert_array_equal(got, [[[False, True, False, False],
                                       [False, True, True, True]]])
  per_query = jnp.asarray([[[True, True, True, True], [True, False, True, True]]])
  got = attention.causal_slot_mask(per_query, jnp.asarray([0, 2], jnp.int32), 4)
  np.testing.assert_array_equal(got, [[[True, False, False, False],
                                       [True, False, True, False]]])


@test_util.JIT
def test_grouped_query_attention_matches_a_float64_reference(use_jit):
  q = _random((2, 3, 2, 2, 8), 0)
  keys, values = _random((2, 5, 2, 8), 1), _random((2, 5, 2, 8), 2)
  key_mask = jnp.asarray([[False, False, True, True, True], [True, True, True, True, True]])
  mask = attention.causal_slot_mask(key_mask, jnp.arange(2, 5, dtype=jnp.int32), 5)
  attend = test_util.maybe_jit(attention.grouped_query_attention, use_jit, dtype=jnp.float32)
  got = attend(q, keys, values, mask)
  assert got.shape == q.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(got, _loop_reference(q, keys, values, mask), **test_util.TOL)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_one_query_equals_the_decode_form_of_kv_cache(dtype):
  q = _random((2, 1, 2, 3, 8), 3).astype(dtype)
  keys, values = _random((2, 6, 2, 8), 4).astype(dtype), _random((2, 6, 2, 8), 5).astype(dtype)
  mask = jnp.asarray([[[True, True, False, True, False, False]],
                      [[False, True, True, True, True, True]]])
  got = attention.grouped_query_attention(q, keys, values, mask, dtype)[:, 0]
  want = kv_cache.one_query_attention(q[:, 0], keys, values, mask[:, 0], dtype)
  tol = test_util.TOL if dtype == jnp.float32 else dict(rtol=3e-2, atol=3e-2)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **tol)
