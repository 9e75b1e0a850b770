"""Tests of rl_curriculum/model/paged_attention.py: the reference against JAX's own reference of
ragged paged attention, decode attention against NumPy dense attention, page writes, a bfloat16
pool, and the TPU kernel compiled for a TPU slice on this CPU host."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

import test_util
from rl_curriculum.model import kv_cache, paged_attention

PAGE = 4  # tokens a page in the CPU tests


def _random(shape, seed, scale=1.0):
  return np.asarray(np.random.default_rng(seed).normal(size=shape) * scale, np.float32)


def _ragged_case(page_size=PAGE, head_dim=8, heads=4, kv_heads=2, tq=16):
  """Four sequences (three decode rows, one of 5 queries) with ragged kv lengths over several
  pages; sequences 0 and 2 share their first two pages; query rows 9.. are padding."""
  q_lens = np.array([1, 5, 1, 1], np.int32)
  kv_lens = np.array([7, 13, 11, 3], np.int32)
  page_indices = np.array([[3, 8, 1, 0],
                           [5, 2, 9, 11],
                           [3, 8, 10, 0],    # the same first pages as sequence 0
                           [4, 0, 0, 0]], np.int32)
  cu_q_lens = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
  q = _random((tq, heads, head_dim), 0)
  kv_pages = _random((12, page_size, 2 * kv_heads, head_dim), 1)
  return (q, kv_pages, kv_lens, page_indices, cu_q_lens,
          np.array([len(q_lens)], np.int32))


def _dense_decode(q, keys, values, lens):
  """NumPy attention of one query per row over its first lens[s] keys: q [S, Hkv, G, d],
  keys/values [S, K, Hkv, d] -> [S, Hkv, G, d] (float64)."""
  q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
  out = np.zeros(q.shape)
  for s, n in enumerate(lens):
    if n == 0:
      continue
    scores = np.einsum("kgd,jkd->kgj", q[s], keys[s, :n]) / np.sqrt(q.shape[-1])
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out[s] = np.einsum("kgj,jkd->kgd", probs, values[s, :n])
  return out


def _gathered(kv_pages, page_table):
  """NumPy keys and values [S, Pp * ps, Hkv, d] of each sequence, read from its pages."""
  kv = np.asarray(kv_pages, np.float32)[np.asarray(page_table)]
  kv = kv.reshape(kv.shape[0], -1, *kv.shape[3:])
  return kv[:, :, 0::2], kv[:, :, 1::2]


@test_util.JIT
def test_reference_equals_jax_reference_on_ragged_shared_pages(use_jit):
  args = _ragged_case()
  scale = 8 ** -0.5
  want = rpa.ref_ragged_paged_attention(*map(jnp.asarray, args), sm_scale=scale)
  fn = test_util.maybe_jit(paged_attention.ragged_paged_attention, use_jit, sm_scale=scale,
                           backend="reference")
  got = fn(*map(jnp.asarray, args))
  n = int(args[4][-1])
  assert got.shape == args[0].shape and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got[:n]), np.asarray(want), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got[n:]), 0.0)  # padding rows: zeros
  assert np.isfinite(np.asarray(got)).all()


def test_reference_honours_num_seqs():
  q, kv_pages, kv_lens, page_indices, cu_q_lens, _ = _ragged_case()
  num_seqs = np.array([2], np.int32)  # sequences 2 and 3 are not live: their rows are padding
  cu_q_lens = np.concatenate([cu_q_lens[:3], [0, 0]]).astype(np.int32)  # and their entries junk
  got = paged_attention.ragged_paged_attention(
      *map(jnp.asarray, (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)),
      sm_scale=0.3, backend="reference")
  want = rpa.ref_ragged_paged_attention(
      *map(jnp.asarray, (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)), sm_scale=0.3)
  n = int(cu_q_lens[2])
  np.testing.assert_allclose(np.asarray(got[:n]), np.asarray(want), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got[n:]), 0.0)


@test_util.JIT
@pytest.mark.parametrize("block_pages,bucket", [(4, 16), (1, 3), (2, 1)])
def test_decode_attention_equals_dense_attention_gqa(use_jit, block_pages, bucket):
  """The reference decode step against dense attention: in one bucket, in buckets of 3 slots
  (the 4 sequences sorted by length and padded to 6), one slot a bucket; blocks of 1, 2, 4
  pages (the table's 3 pages padded)."""
  seqs, kv_heads, group, head_dim = 4, 2, 3, 8
  kv_pages = _random((10, PAGE, 2 * kv_heads, head_dim), 2)
  page_table = np.array([[7, 2, 5], [1, 1, 1], [7, 2, 0], [9, 4, 6]], np.int32)
  kv_lens = np.array([10, 0, 6, 12], np.int32)  # sequence 1 is an empty decode slot
  q = _random((seqs, kv_heads, group, head_dim), 3)
  fn = test_util.maybe_jit(paged_attention.decode_attention, use_jit, backend="reference",
                           dtype=jnp.float32, block_pages=block_pages, bucket=bucket)
  got = np.asarray(fn(jnp.asarray(q), jnp.asarray(kv_pages), jnp.asarray(kv_lens),
                      jnp.asarray(page_table)))
  keys, values = _gathered(kv_pages, page_table)
  want = _dense_decode(q, keys, values, kv_lens)
  assert got.shape == q.shape and got.dtype == np.float32
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[1], 0.0)


def _write_then_read(dtype):
  """A pool filled by write_prefill (two left-padded prompts) and token-by-token writes (with dead
  rows), and the keys and values written, per sequence [S, T, Hkv, d]."""
  kv_heads, head_dim, tp, steps = 2, 8, 6, 5
  num_pages = 14
  prompt_k = _random((2, tp, kv_heads, head_dim), 4)
  prompt_v = _random((2, tp, kv_heads, head_dim), 5)
  mask = np.array([[False, False, True, True, True, True],      # 4 tokens: one page
                   [False, True, True, True, True, True]])      # 5 tokens: two pages
  pool = jnp.full((num_pages, PAGE, 2 * kv_heads, head_dim), 7.0, dtype)
  pool = jax.jit(paged_attention.write_prefill)(
      pool, jnp.asarray(prompt_k), jnp.asarray(prompt_v), jnp.asarray(mask),
      jnp.asarray(np.array([[6, 13], [2, 9]], np.int32)))
  # Prompt 0 needs one page: its second (13) is not written; the others hold what was written.
  untouched = np.ones(num_pages, bool)
  untouched[[6, 2, 9]] = False
  np.testing.assert_array_equal(np.asarray(pool, np.float32)[untouched], 7.0)
  # Sequence s continues prompt s at token len_s; a third sequence starts empty at token 0.
  page_table = np.array([[6, 0, 3], [2, 9, 11], [5, 8, 10]], np.int32)
  lens = np.array([4, 5, 0])
  keys = np.zeros((3, 3 * PAGE, kv_heads, head_dim), np.float32)
  values = np.zeros_like(keys)
  for s in range(2):
    keys[s, :lens[s]] = prompt_k[s, tp - lens[s]:]
    values[s, :lens[s]] = prompt_v[s, tp - lens[s]:]
  write = jax.jit(paged_attention.write)
  for step in range(steps):
    k, v = _random((3, kv_heads, head_dim), 10 + step), _random((3, kv_heads, head_dim), 20 + step)
    live = np.array([True, step % 2 == 0, step != 3])  # rows 1 and 2 are dead at some steps
    before = np.asarray(pool, np.float32)
    pool = write(pool, jnp.asarray(k), jnp.asarray(v), jnp.asarray(page_table),
                 jnp.asarray(lens.astype(np.int32)), jnp.asarray(live))
    changed = np.any(np.asarray(pool, np.float32) != before, axis=(1, 2, 3))
    live_pages = {page_table[s, lens[s] // PAGE] for s in range(3) if live[s]}
    assert set(np.flatnonzero(changed)) <= live_pages  # dead rows wrote nothing
    for s in np.flatnonzero(live):
      keys[s, lens[s]], values[s, lens[s]] = k[s], v[s]
    lens = lens + live
  return pool, page_table, lens.astype(np.int32), keys, values


def test_write_then_decode_equals_dense_attention():
  pool, page_table, lens, keys, values = _write_then_read(jnp.float32)
  assert pool.dtype == jnp.float32
  # What was written is what the pages hold, token by token.
  read_k, read_v = _gathered(pool, page_table)
  for s, n in enumerate(lens):
    np.testing.assert_array_equal(read_k[s, :n], keys[s, :n])
    np.testing.assert_array_equal(read_v[s, :n], values[s, :n])
  q = _random((3, 2, 3, 8), 30)
  got = np.asarray(paged_attention.decode_attention(
      jnp.asarray(q), pool, jnp.asarray(lens), jnp.asarray(page_table), backend="reference",
      dtype=jnp.float32))
  mask = np.arange(keys.shape[1])[None, :] < lens[:, None]
  want = kv_cache.one_query_attention(jnp.asarray(q), jnp.asarray(keys), jnp.asarray(values),
                                      jnp.asarray(mask), jnp.float32)
  np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got, _dense_decode(q, keys, values, lens), rtol=1e-5, atol=1e-5)


def test_bfloat16_pool_is_close_to_float32():
  pool, page_table, lens, keys, values = _write_then_read(jnp.bfloat16)
  assert pool.dtype == jnp.bfloat16  # writes cast to the pool's dtype
  read_k, _ = _gathered(pool, page_table)
  as_bf16 = np.asarray(jnp.asarray(keys[0, :lens[0]], jnp.bfloat16), np.float32)
  np.testing.assert_array_equal(read_k[0, :lens[0]], as_bf16)
  q = _random((3, 2, 3, 8), 30)
  got = paged_attention.decode_attention(jnp.asarray(q), pool, jnp.asarray(lens),
                                         jnp.asarray(page_table), backend="reference",
                                         dtype=jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  want = _dense_decode(q, keys, values, lens)
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=2e-2)


def test_pages_needed():
  assert [paged_attention.pages_needed(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
  np.testing.assert_array_equal(paged_attention.pages_needed(jnp.array([0, 3, 9]), 4), [0, 1, 3])


def test_unknown_backend_raises():
  args = map(jnp.asarray, _ragged_case())
  with pytest.raises(ValueError, match="'reference', 'tpu'"):
    paged_attention.ragged_paged_attention(*args, sm_scale=1.0, backend="gpu")


def test_tpu_backend_compiles_for_a_tpu_slice():
  from rl_curriculum.plan import targets  # pylint: disable=import-outside-toplevel
  devs = targets.devices(targets.parse("v5e-4"))
  mesh = Mesh(np.array(devs[:1]), ("x",))
  seqs, kv_heads, group, head_dim, page_size, per_seq = 8, 2, 2, 128, 16, 4

  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))

  args = (spec((seqs, kv_heads, group, head_dim), jnp.bfloat16),
          spec((seqs * per_seq, page_size, 2 * kv_heads, head_dim), jnp.bfloat16),
          spec((seqs,), jnp.int32), spec((seqs, per_seq), jnp.int32))
  fn = functools.partial(paged_attention.decode_attention, backend="tpu", dtype=jnp.bfloat16,
                         num_kv_pages_per_block=2, num_queries_per_block=8)
  with jax.set_mesh(mesh):
    compiled = jax.jit(fn).lower(*args).compile()
  assert isinstance(compiled.input_shardings[0][0], (NamedSharding, SingleDeviceSharding))
  text = compiled.as_text()
  assert "tpu_custom_call" in text and "ragged_paged_attention_kernel" in text


def test_tpu_decode_over_a_tensor_axis_reads_only_its_heads_pages():
  """A decode step of the paged cache (`paged_cache.attend`) compiled for a v5e-4 laid out as
  2 batch shards x a tensor axis of 2: the pool's pages split over the batch shards and its KV
  heads over `tensor` (`mesh.pool_sharding`), the kernel run on each device's rows and heads
  (`mesh.per_shard` with heads): no device gathers another's pages or heads."""
  from rl_curriculum.model import paged_cache  # pylint: disable=import-outside-toplevel
  from rl_curriculum.model.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from rl_curriculum.parallel import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  from rl_curriculum.parallel import rollout_layout  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import targets  # pylint: disable=import-outside-toplevel
  config = ModelConfig.tiny(vocab_size=64, d_model=512, num_layers=2, num_heads=4,
                            num_kv_heads=2, attention="tpu", dtype="bfloat16")
  learner = Mesh(np.array(targets.devices(targets.parse("v5e-4"))).reshape(1, 4, 1),
                 mesh_lib.MESH_AXES)
  mesh = rollout_layout.layout_mesh(learner, "tensor", 2)
  slots, per_slot, page_size, shards = 16, 8, 16, 2
  pool_shape = (2, slots * per_slot, page_size, 4, 128)
  rows = lambda *dims: NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *dims))
  args = (jax.ShapeDtypeStruct(pool_shape, jnp.bfloat16,
                               sharding=mesh_lib.pool_sharding(mesh, pool_shape)),
          jax.ShapeDtypeStruct((shards, slots // shards, per_slot), jnp.int32, sharding=rows()),
          jax.ShapeDtypeStruct((shards, slots // shards), jnp.int32, sharding=rows()),
          jax.ShapeDtypeStruct((slots, 2, 2, 128), jnp.bfloat16, sharding=rows("tensor")),
          jax.ShapeDtypeStruct((slots, 2, 128), jnp.bfloat16, sharding=rows("tensor")),
          jax.ShapeDtypeStruct((slots, 2, 128), jnp.bfloat16, sharding=rows("tensor")))
  shard = mesh_lib.per_shard(mesh)

  def step(pool, table, length, q, k, v):
    return paged_cache.attend(pool, paged_cache.PageIndex(table, length, 0, shard), q, k, v,
                              config=config)

  with jax.set_mesh(mesh):
    compiled = jax.jit(step).lower(*args).compile()
  text = compiled.as_text()
  assert "ragged_paged_attention_kernel" in text
  assert "all-gather" not in text and "all-to-all" not in text
  out, pool = compiled.output_shardings
  assert pool.shard_shape(pool_shape) == (2, slots * per_slot // shards, page_size, 2, 128)


@functools.lru_cache(maxsize=None)
def _interpreted_kernel():
  """The "tpu" backend's output on the ragged case run by Pallas' TPU interpreter on this host,
  or the error it raised (jax 0.10.2's interpreter fails on the kernel's page copies)."""
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=import-outside-toplevel
  q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs = _ragged_case(
      page_size=16, head_dim=128)
  args = tuple(map(jnp.asarray, (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)))
  try:
    with pltpu.force_tpu_interpret_mode():
      out = paged_attention.ragged_paged_attention(
          *args, sm_scale=128 ** -0.5, backend="tpu", num_kv_pages_per_block=2,
          num_queries_per_block=8)
      return np.asarray(out), args
  except Exception as e:  # pylint: disable=broad-except
    lines = [line for line in str(e).splitlines() if line.strip()] or [""]
    return f"{type(e).__name__}: {lines[0][:120]} ... {lines[-1][:160]}", args


def test_tpu_kernel_interpreted_equals_reference():
  out, args = _interpreted_kernel()
  if isinstance(out, str):
    pytest.skip(f"the installed RPA kernel does not run in Pallas' TPU interpret mode ({out})")
  want = paged_attention.ragged_paged_attention(*args, sm_scale=128 ** -0.5, backend="reference")
  np.testing.assert_allclose(out, np.asarray(want), rtol=1e-5, atol=1e-5)
