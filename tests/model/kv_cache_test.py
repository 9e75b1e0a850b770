"""Tests of rl_curriculum/model/kv_cache.py: slot writes and one-query attention over a cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_util
from rl_curriculum.model import kv_cache


def _random(shape, dtype, seed):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


@test_util.JIT
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_update_slice_writes_the_same_bits_as_dynamic_update_slice(dtype, use_jit):
  cache = _random((2, 6, 3, 4), dtype, 0)
  new = _random((2, 2, 3, 4), jnp.float32, 1)
  start = (0, jnp.int32(3), 0, 0)
  got = test_util.maybe_jit(kv_cache.update_slice, use_jit)(cache, new, start)
  want = jax.lax.dynamic_update_slice(cache, new.astype(dtype), start)
  assert got.dtype == dtype
  np.testing.assert_array_equal(np.asarray(kv_cache.as_bits(got)),
                                np.asarray(kv_cache.as_bits(want)))
  np.testing.assert_array_equal(np.asarray(kv_cache.from_bits(kv_cache.as_bits(got), dtype)),
                                np.asarray(got))


@test_util.JIT
def test_with_slots_select_equals_the_slice_update(use_jit):
  cache = _random((2, 5, 3, 4), jnp.bfloat16, 0)
  new = _random((2, 1, 3, 4), jnp.bfloat16, 1)
  with_slots = test_util.maybe_jit(kv_cache.with_slots, use_jit, select=True)
  for index in range(5):
    selected = with_slots(cache, new, jnp.int32(index))
    written = kv_cache.write_slots(cache, new, jnp.int32(index))
    np.testing.assert_array_equal(np.asarray(selected, np.float32),
                                  np.asarray(written, np.float32))
    np.testing.assert_array_equal(np.asarray(written[:, index], np.float32),
                                  np.asarray(new[:, 0], np.float32))


def _attention_reference(q, keys, values, mask):
  """float64 softmax(q . k / sqrt(d)) . v of q[B, Hkv, G, d] over keys/values[B, S, Hkv, d]."""
  q, keys, values = (np.asarray(x, np.float64) for x in (q, keys, values))
  scores = np.einsum("bkgd,bskd->bkgs", q, keys) / np.sqrt(q.shape[-1])
  scores = np.where(np.asarray(mask)[:, None, None, :], scores, -np.inf)
  probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
  probs /= probs.sum(axis=-1, keepdims=True)
  return np.einsum("bkgs,bskd->bkgd", probs, values)


@test_util.JIT
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_one_query_attention_matches_a_float64_reference(dtype, tol, use_jit):
  q = _random((2, 2, 3, 8), dtype, 0)
  keys = _random((2, 5, 2, 8), dtype, 1)
  values = _random((2, 5, 2, 8), dtype, 2)
  mask = jnp.asarray([[True, True, False, True, False], [False, True, True, True, True]])
  attend = test_util.maybe_jit(kv_cache.one_query_attention, use_jit, dtype=dtype)
  got = attend(q, keys, values, mask)
  assert got.shape == (2, 2, 3, 8) and got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float64),
                             _attention_reference(q, keys, values, mask), rtol=tol, atol=tol)
