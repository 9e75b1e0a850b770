"""Tests of rl_curriculum/model/blockwise_attention.py: blockwise and splash attention against
`attention.grouped_query_attention` (forward and gradients), memory linear in T, the splash
kernel in Pallas' TPU interpreter and compiled for a v5e, and the dispatcher's errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import test_util
from rl_curriculum.model import attention
from rl_curriculum.model import blockwise_attention as bw

# Module-level float32 comparisons (forward and gradients), against the dense function.
TOL = 1e-4
F32 = jnp.float32


def _inputs(b, t, s, hkv, g, d, pads, seed=0):
  """q [B, T, Hkv, G, d], keys/values [B, S, Hkv, d], and a key mask left-padded by `pads`."""
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, hkv, g, d)), F32)
  keys = jnp.asarray(rng.normal(size=(b, s, hkv, d)), F32)
  values = jnp.asarray(rng.normal(size=(b, s, hkv, d)), F32)
  key_mask = jnp.asarray(np.arange(s)[None, :] >= np.asarray(pads)[:, None])
  return q, keys, values, key_mask


def _seen(key_mask, q_offset, t):
  """bool[B, T, 1, 1, 1]: the queries with at least one valid key (computed in NumPy)."""
  km = np.asarray(key_mask)
  slots = q_offset + np.arange(t)
  seen = np.array([[km[row, :slot + 1].any() for slot in slots] for row in range(km.shape[0])])
  return jnp.asarray(seen)[:, :, None, None, None]


def _dense(q, keys, values, key_mask, q_offset):
  mask = attention.causal_slot_mask(key_mask, q_offset + jnp.arange(q.shape[1], dtype=jnp.int32),
                                    keys.shape[1])
  return attention.grouped_query_attention(q, keys, values, mask, F32)


def _max_err(a, b, where=None):
  diff = jnp.abs(a - b)
  return float(jnp.max(diff if where is None else jnp.where(where, diff, 0.0)))


# (T, S, q_offset, block, pads): self-attention (S = T) and queries after a prefix (S = q_offset
# + T, the learn step's shared-prompt path); S is never a multiple of the block; rows 1 and 2 are
# padded past the first block (and the prefix), so some queries see no valid key.
CASES = {"self": (40, 40, 0, 16, [0, 21, 35]),
         "prefix": (20, 44, 24, 16, [3, 30, 27])}


@pytest.mark.parametrize("case", CASES)
@test_util.JIT
def test_blockwise_forward_equals_dense(case, use_jit):
  t, s, q_offset, block, pads = CASES[case]
  q, keys, values, key_mask = _inputs(3, t, s, 2, 2, 8, pads)
  fn = test_util.maybe_jit(bw.blockwise_attention, use_jit, dtype=F32, block=block)
  out = fn(q, keys, values, key_mask, q_offset)
  seen = _seen(key_mask, q_offset, t)
  assert not bool(seen.all())  # the cases include queries with no valid key
  assert out.shape == q.shape and out.dtype == F32
  assert bool(jnp.isfinite(out).all())
  assert _max_err(out, _dense(q, keys, values, key_mask, q_offset), seen) < TOL
  # A traced q_offset (i32[]) under jit gives the same numbers.
  traced = jax.jit(lambda *a: bw.blockwise_attention(*a, dtype=F32, block=block))(
      q, keys, values, key_mask, jnp.int32(q_offset))
  assert _max_err(traced, out) < TOL


@pytest.mark.parametrize("case", CASES)
def test_blockwise_gradients_equal_dense(case):
  t, s, q_offset, block, pads = CASES[case]
  q, keys, values, key_mask = _inputs(3, t, s, 2, 2, 8, pads, seed=1)
  seen = _seen(key_mask, q_offset, t)
  w = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), F32)

  def loss(attend, only_seen):
    def f(q, keys, values):
      out = attend(q, keys, values, key_mask, q_offset)
      return jnp.sum(out * w * seen) if only_seen else jnp.sum(out * w)
    return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

  blockwise = lambda *a: bw.blockwise_attention(*a, dtype=F32, block=block)
  got = loss(blockwise, True)(q, keys, values)
  want = loss(_dense, True)(q, keys, values)
  for name, a, b in zip(("dq", "dk", "dv"), got, want):
    assert _max_err(a, b) < TOL, name
  # A loss over every query, those with no valid key too: finite gradients everywhere.
  for grad in loss(blockwise, False)(q, keys, values):
    assert bool(jnp.isfinite(grad).all())


def _temp_bytes(attend, t):
  """XLA:CPU's temporaries of the gradient of sum(out^2) at B=1, Hkv=1, G=2, d=64 (compiled
  only)."""
  q = jax.ShapeDtypeStruct((1, t, 1, 2, 64), F32)
  kv = jax.ShapeDtypeStruct((1, t, 1, 64), F32)
  mask = jax.ShapeDtypeStruct((1, t), jnp.bool_)
  loss = lambda q, k, v, m: jnp.sum(attend(q, k, v, m, 0) ** 2)
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, mask).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_memory_grows_linearly_in_t():
  """Doubling T doubles blockwise's temporaries (measured 11.6 -> 23.2 MB at T = 1024 -> 2048,
  block 256) and quadruples dense's (33.6 -> 134.3 MB: the [T, S] scores)."""
  blockwise = lambda *a: bw.blockwise_attention(*a, dtype=F32, block=256)
  bw_small, bw_large = _temp_bytes(blockwise, 1024), _temp_bytes(blockwise, 2048)
  dense_small, dense_large = _temp_bytes(_dense, 1024), _temp_bytes(_dense, 2048)
  assert bw_large <= 2.5 * bw_small, (bw_small, bw_large)
  assert dense_large > 3.5 * dense_small, (dense_small, dense_large)
  assert bw_large < dense_large / 4, (bw_large, dense_large)


def test_splash_kernel_is_what_make_splash_mha_makes():
  """`splash_kernel` builds the kernel from NumPy mask tables; make_splash_mha's, made outside
  any trace or mesh, has the same tables (as jax Arrays) and the same static arguments."""
  ours = bw.splash_kernel(200, 240, 40, 4, block_q=128, block_kv=128)
  theirs = splash.make_splash_mha(
      splash_mask.MultiHeadMask([splash_mask.CausalMask((256, 256), offset=40)] * 4),
      block_sizes=ours.kwargs["block_sizes"], head_shards=1, q_seq_shards=1)
  assert ours.kwargs == theirs.kwargs
  ours_leaves, ours_tree = jax.tree_util.tree_flatten(ours)
  theirs_leaves, theirs_tree = jax.tree_util.tree_flatten(theirs)
  assert ours_tree == theirs_tree
  for a, b in zip(ours_leaves, theirs_leaves):
    assert isinstance(a, np.ndarray) and a.dtype == b.dtype
    np.testing.assert_array_equal(a, np.asarray(b))


def test_splash_interpreted_equals_blockwise_and_dense():
  """The splash kernel in Pallas' TPU interpreter: T = 200 queries after a 40-slot prefix (T and
  S = 240 both padded to 256), GQA (Hkv=2, G=2), left-padded rows; forward at the queries with a
  valid key, and dq, dk, dv of a loss over them, against blockwise and dense; float32 errors
  measured here: forward 0 (blockwise) and 7e-7 (dense), gradients at most 2.4e-6 and 1.4e-6.
  Finite gradients of a loss over every query."""
  t, s, q_offset = 200, 240, 40
  q, keys, values, key_mask = _inputs(2, t, s, 2, 2, 64, [0, 150], seed=3)
  seen = _seen(key_mask, q_offset, t)
  w = jnp.asarray(np.random.default_rng(4).normal(size=q.shape), F32)
  splash_fn = lambda *a: bw.splash_attention(*a, q_offset, dtype=F32)
  def interpreted(q, keys, values):
    out, vjp = jax.vjp(lambda q, k, v: splash_fn(q, k, v, key_mask), q, keys, values)
    return out, vjp(w * seen), vjp(w)

  # One compiled program, finished before anything else runs: the interpreter calls back into
  # Python, and an eager op dispatched while those calls are pending can wait on them for ever.
  with pltpu.force_tpu_interpret_mode():
    out, grads, grads_all = jax.block_until_ready(jax.jit(interpreted)(q, keys, values))
  blockwise = lambda q, k, v: bw.blockwise_attention(q, k, v, key_mask, q_offset, dtype=F32,
                                                     block=128)
  dense = lambda q, k, v: _dense(q, keys=k, values=v, key_mask=key_mask, q_offset=q_offset)
  for ref in (blockwise, dense):
    ref_out, ref_vjp = jax.vjp(ref, q, keys, values)
    assert _max_err(out, ref_out, seen) < TOL
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_vjp(w * seen)):
      assert _max_err(a, b) < TOL, name
  assert bool(jnp.isfinite(out).all())
  for grad in grads_all:
    assert bool(jnp.isfinite(grad).all())


@pytest.mark.parametrize("head_dim", [64, 128])
def test_splash_compiles_for_v5e(head_dim):
  """Forward and backward compiled by XLA:TPU for one v5e chip, bfloat16, with the kernel made
  at trace time inside `jax.set_mesh` (its mask tables are NumPy)."""
  from rl_curriculum.plan import targets  # pylint: disable=import-outside-toplevel
  mesh = Mesh(np.array(targets.devices(targets.parse("v5e-4"))[:1]), ("x",))
  spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(
      shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))
  b, t, s, hkv, g = 2, 256, 384, 2, 2
  bw._splash_kernel.cache_clear()  # pylint: disable=protected-access

  def loss(q, keys, values, key_mask):
    out = bw.splash_attention(q, keys, values, key_mask, s - t, dtype=jnp.bfloat16)
    return jnp.sum(out.astype(F32))

  with jax.set_mesh(mesh):
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
        spec(b, t, hkv, g, head_dim), spec(b, s, hkv, head_dim), spec(b, s, hkv, head_dim),
        spec(b, s, dtype=jnp.bool_)).compile()
  assert "tpu_custom_call" in compiled.as_text()


def test_errors():
  q, keys, values, key_mask = _inputs(1, 8, 8, 1, 1, 8, [0])
  with pytest.raises(ValueError, match="static q_offset"):
    jax.jit(lambda off: bw.splash_attention(q, keys, values, key_mask, off, dtype=F32))(
        jnp.int32(0))
  with pytest.raises(ValueError, match="q_offset -1"):
    bw.splash_attention(q, keys, values, key_mask, -1, dtype=F32)
  with pytest.raises(ValueError, match="dense, blockwise, splash"):
    bw.attend(q, keys, values, key_mask, 0, dtype=F32, backend="flash")


def test_attend_dispatches():
  t, s, q_offset, block, pads = CASES["prefix"]
  q, keys, values, key_mask = _inputs(3, t, s, 2, 2, 8, pads, seed=5)
  seen = _seen(key_mask, q_offset, t)
  dense = bw.attend(q, keys, values, key_mask, q_offset, dtype=F32, backend="dense")
  np.testing.assert_array_equal(dense, _dense(q, keys, values, key_mask, q_offset))
  blockwise = bw.attend(q, keys, values, key_mask, q_offset, dtype=F32, backend="blockwise",
                        block=block)
  assert _max_err(blockwise, dense, seen) < TOL
