"""Causal grouped-query attention computed blockwise, never holding a [T, S] score matrix.

The function of `attention.grouped_query_attention` with `attention.causal_slot_mask(key_mask,
q_offset + arange(T), S)`: query t sits at key slot q_offset + t and sees key slot s iff
s <= q_offset + t and key_mask[b, s]. `attend` picks one of three ways to compute it:

  dense      `attention.grouped_query_attention`: [B, Hkv, G, T, S] float32 scores, kept for the
             backward pass.
  blockwise  `blockwise_attention`, pure JAX: an online softmax over key blocks (Rabe & Staats
             (2021), "Self-attention Does Not Need O(n^2) Memory", arXiv:2112.05682) and the
             FlashAttention backward pass (Dao et al. (2022), "FlashAttention: Fast and
             Memory-Efficient Exact Attention with IO-Awareness", arXiv:2205.14135); any device.
  splash     `splash_attention`: JAX's Pallas splash attention kernels, forward and backward; TPUs
             (or, on a CPU, `pltpu.force_tpu_interpret_mode()`).

A query with no valid key gets a finite output (dense: the mean of all values; blockwise: zeros;
splash: the mean over the key blocks it visits) and finite gradients.

Shapes: B rows, T queries, S key slots, Hkv key/value heads, G query heads per key/value head,
d = head_dim.
"""

import contextlib
import functools
from typing import Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask_info as splash_mask_info)

from rl_curriculum.model import attention

BACKENDS = ("dense", "blockwise", "splash")
# The masked-score floor of `attention.grouped_query_attention`: finite, so no inf - inf.
_FLOOR = float(jnp.finfo(jnp.float32).min)
Offset = Union[int, jax.Array]


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, key_mask: jax.Array,
           q_offset: Offset, *, dtype, backend: str, block: int = 512) -> jax.Array:
  """Causal attention of T queries at slots q_offset + t over S key slots, by `backend`.

  Args:
    q: [B, T, Hkv, G, d] queries. keys, values: [B, S, Hkv, d]. key_mask: bool[B, S].
    q_offset: the slot of query 0 (int, or i32[] except for "splash").
    dtype: the activation dtype (the output's); scores and softmax statistics are float32.
    backend: "dense", "blockwise" or "splash" (module docstring).
    block: key slots per step ("blockwise"); query and key blocks ("splash": a multiple of 128).

  Returns:
    [B, T, Hkv, G, d] in `dtype`.

  Raises:
    ValueError: an unknown backend (or, for "splash", a traced or negative q_offset).
  """
  if backend == "dense":
    q_slots = q_offset + jnp.arange(q.shape[1], dtype=jnp.int32)
    mask = attention.causal_slot_mask(key_mask, q_slots, keys.shape[1])
    return attention.grouped_query_attention(q, keys, values, mask, dtype)
  if backend == "blockwise":
    return blockwise_attention(q, keys, values, key_mask, q_offset, dtype=dtype, block=block)
  if backend == "splash":
    return splash_attention(q, keys, values, key_mask, q_offset, dtype=dtype, block_q=block,
                            block_kv=block)
  raise ValueError(f"attention backend {backend!r}: expected one of {', '.join(BACKENDS)}")


def blockwise_attention(q: jax.Array, keys: jax.Array, values: jax.Array, key_mask: jax.Array,
                        q_offset: Offset, *, dtype, block: int = 512) -> jax.Array:
  """`attention.grouped_query_attention` computed over key blocks (online softmax).

  A `lax.scan` over key blocks of `block` slots (S padded with invalid keys) carries the running
  max, sum and output accumulator (float32); the backward pass (a `jax.custom_vjp`) keeps q,
  keys, values, the output and the float32 log-sum-exp [B, Hkv, G, T] and recomputes each
  block's probabilities (Dao et al. (2022), arXiv:2205.14135; Rabe & Staats (2021),
  arXiv:2112.05682). The largest buffers are one block's [B, Hkv, G, T, block] scores.

  Args:
    q: [B, T, Hkv, G, d] queries. keys, values: [B, S, Hkv, d]. key_mask: bool[B, S].
    q_offset: the slot of query 0 (int or i32[], may be traced): query t sees key s iff
      s <= q_offset + t and key_mask[b, s].
    dtype: the activation dtype: the score matmul takes q's dtype with float32 results; the
      probabilities times values take `dtype` with float32 accumulation.
    block: key slots per scan step.

  Returns:
    [B, T, Hkv, G, d] in `dtype`. A query with no valid key gets zeros, and zero gradients; no
    gradient flows to key_mask or q_offset.
  """
  q_offset = jnp.asarray(q_offset, jnp.int32)
  return _blockwise(q, keys, values, key_mask, q_offset, jnp.dtype(dtype), block)


def _blocks(keys, values, key_mask, block):
  """Keys and values [n, B, Hkv, block, d] and key validity bool[n, B, block], S padded up to
  n * block with invalid keys (scan's leading axis first)."""
  b, s, hkv, d = keys.shape
  n = -(-s // block)
  pad = ((0, 0), (0, n * block - s))  # key_mask pads with False
  split = lambda x: jnp.pad(x, pad + ((0, 0),) * 2).reshape(b, n, block, hkv, d).transpose(
      1, 0, 3, 2, 4)
  return split(keys), split(values), jnp.pad(key_mask, pad).reshape(b, n, block).transpose(1, 0, 2)


def _block_scores(qt, k_block, m_block, start, q_offset):
  """One key block's float32 scores [B, Hkv, G, T, block] and where they count
  bool[B, 1, 1, T, block]: the key is valid and s <= q_offset + t."""
  scale = qt.shape[-1] ** -0.5
  scores = jnp.einsum("bkgtd,bksd->bkgts", qt, k_block.astype(qt.dtype),
                      preferred_element_type=jnp.float32) * scale
  slots = start + jnp.arange(k_block.shape[2], dtype=jnp.int32)
  q_slots = q_offset + jnp.arange(qt.shape[3], dtype=jnp.int32)
  valid = (slots[None, :] <= q_slots[:, None])[None, :, :] & m_block[:, None, :]
  return scores, valid[:, None, None, :, :]


def _forward(q, keys, values, key_mask, q_offset, dtype, block):
  """(out [B, T, Hkv, G, d] in dtype, log-sum-exp float32 [B, Hkv, G, T])."""
  k_blocks, v_blocks, m_blocks = _blocks(keys, values, key_mask, block)
  qt = q.transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, d]
  starts = jnp.arange(k_blocks.shape[0], dtype=jnp.int32) * block

  def step(carry, xs):
    run_max, run_sum, acc = carry
    k_block, v_block, m_block, start = xs
    # The block's mask made to depend on the carry (always + 0): under `jax.checkpoint` JAX
    # splits out what depends only on the integer inputs and keeps it for the backward pass,
    # which here would be every block's [B, Hkv, G, T, block] mask at once (quadratic in T).
    start = start + jnp.where(jnp.isfinite(run_sum.reshape(-1)[0]), 0, 0).astype(jnp.int32)
    scores, valid = _block_scores(qt, k_block, m_block, start, q_offset)
    scores = jnp.where(valid, scores, _FLOOR)
    new_max = jnp.maximum(run_max, scores.max(axis=-1))
    # Masked slots are zeroed, not left to exp(floor - max): while a row has seen no valid key
    # its max is the floor itself and exp(0) would count them.
    probs = jnp.where(valid, jnp.exp(scores - new_max[..., None]), 0.0)
    rescale = jnp.exp(run_max - new_max)  # exp(floor - real max) underflows to 0, no inf
    run_sum = rescale * run_sum + probs.sum(axis=-1)
    acc = rescale[..., None] * acc + jnp.einsum(
        "bkgts,bksd->bkgtd", probs.astype(dtype), v_block.astype(dtype),
        preferred_element_type=jnp.float32)
    return (new_max, run_sum, acc), None

  stats = jnp.full(qt.shape[:-1], _FLOOR, jnp.float32)
  init = (stats, jnp.zeros_like(stats), jnp.zeros(qt.shape, jnp.float32))
  (run_max, run_sum, acc), _ = lax.scan(step, init, (k_blocks, v_blocks, m_blocks, starts))
  seen = run_sum > 0  # False: the query has no valid key; zeros out, a finite log-sum-exp
  out = acc / jnp.where(seen, run_sum, 1.0)[..., None]
  lse = jnp.where(seen, run_max + jnp.log(jnp.where(seen, run_sum, 1.0)), 0.0)
  return out.transpose(0, 3, 1, 2, 4).astype(dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _blockwise(q, keys, values, key_mask, q_offset, dtype, block):
  return _forward(q, keys, values, key_mask, q_offset, dtype, block)[0]


def _blockwise_fwd(q, keys, values, key_mask, q_offset, dtype, block):
  out, lse = _forward(q, keys, values, key_mask, q_offset, dtype, block)
  return out, (q, keys, values, key_mask, q_offset, out, lse)


def _blockwise_bwd(dtype, block, residuals, d_out):
  """FlashAttention's backward pass over the same key blocks: with D = rowsum(dO * O), per block
  P = exp(S - lse), dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ += dS K / sqrt(d),
  dK = dS^T Q / sqrt(d)."""
  q, keys, values, key_mask, q_offset, out, lse = residuals
  b, s, hkv, d = keys.shape
  scale = d ** -0.5
  k_blocks, v_blocks, m_blocks = _blocks(keys, values, key_mask, block)
  qt = q.transpose(0, 2, 3, 1, 4)
  d_out = d_out.astype(dtype).transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, d]
  row_dot = jnp.sum(d_out.astype(jnp.float32) * out.transpose(0, 2, 3, 1, 4).astype(jnp.float32),
                    axis=-1)  # D [B, Hkv, G, T]
  starts = jnp.arange(k_blocks.shape[0], dtype=jnp.int32) * block

  def step(d_q, xs):
    k_block, v_block, m_block, start = xs
    scores, valid = _block_scores(qt, k_block, m_block, start, q_offset)
    # Zero where masked: a masked score minus lse could be anything (a query with no valid key
    # has lse 0), and a NaN or inf here would reach every gradient through 0 * NaN.
    probs = jnp.where(valid, jnp.exp(jnp.where(valid, scores, _FLOOR) - lse[..., None]), 0.0)
    d_v = jnp.einsum("bkgts,bkgtd->bksd", probs.astype(dtype), d_out,
                     preferred_element_type=jnp.float32)
    d_probs = jnp.einsum("bkgtd,bksd->bkgts", d_out, v_block.astype(dtype),
                         preferred_element_type=jnp.float32)
    d_scores = (probs * (d_probs - row_dot[..., None])).astype(qt.dtype)
    d_q = d_q + jnp.einsum("bkgts,bksd->bkgtd", d_scores, k_block.astype(qt.dtype),
                           preferred_element_type=jnp.float32) * scale
    d_k = jnp.einsum("bkgts,bkgtd->bksd", d_scores, qt,
                     preferred_element_type=jnp.float32) * scale
    return d_q, (d_k, d_v)

  d_q, (d_k, d_v) = lax.scan(step, jnp.zeros(qt.shape, jnp.float32),
                             (k_blocks, v_blocks, m_blocks, starts))
  unsplit = lambda x: x.transpose(1, 0, 3, 2, 4).reshape(b, -1, hkv, d)[:, :s]
  return (d_q.transpose(0, 3, 1, 2, 4).astype(q.dtype), unsplit(d_k).astype(keys.dtype),
          unsplit(d_v).astype(values.dtype), None, None)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def _padded(n: int, block: int) -> int:
  return -(-n // block) * block


def splash_kernel(num_queries: int, num_keys: int, q_offset: int, num_heads: int, *,
                  block_q: int = 128, block_kv: int = 128) -> splash.SplashAttentionKernel:
  """The kernel `splash_attention` uses for these sizes: `num_heads` (Hkv * G) query heads,
  causal with query t at slot q_offset + t, T and S padded up to multiples of the blocks. Cached;
  built from NumPy alone, so it may be made anywhere (at trace time, under `jax.set_mesh`)."""
  return _splash_kernel(_padded(num_queries, block_q), _padded(num_keys, block_kv),
                        int(q_offset), num_heads, block_q, block_kv)


@functools.lru_cache(maxsize=64)
def _splash_kernel(t_pad, s_pad, q_offset, num_heads, block_q, block_kv):
  """`make_splash_mha(mask, block_sizes=..., head_shards=1, q_seq_shards=1)`, except that the
  mask tables stay NumPy: make_splash_mha makes jax Arrays of them eagerly, which under a jit trace
  are tracers (this cache would leak them) and under `jax.set_mesh` over compile-only TPU devices
  fail to be made. The kernel embeds them as constants either way (a test checks the two agree)."""
  mask = splash_mask.MultiHeadMask(
      [splash_mask.CausalMask((t_pad, s_pad), offset=q_offset) for _ in range(num_heads)])
  sizes = splash.BlockSizes(block_q, block_kv, block_kv, block_q_dkv=block_q, block_kv_dkv=block_kv,
                            block_kv_dkv_compute=block_kv, block_q_dq=block_q, block_kv_dq=block_kv)
  shards = dict(downcast_smem_data=True, head_shards=1, q_seq_shards=1)
  # The dq kernel's blocks are the forward's, so are its tables (process_mask caches them).
  fwd_info, mask_fn = splash_mask_info.process_mask(mask, (block_q, block_kv), **shards)
  dkv_info, _ = splash_mask_info.process_mask_dkv(mask, (block_q, block_kv), shrink_grid=True,
                                                  **shards)
  return splash.SplashAttentionKernel(
      fwd_info, fwd_info, dkv_info, block_sizes=sizes, is_mqa=False, save_residuals=False,
      mask_value=splash.DEFAULT_MASK_VALUE, attn_logits_soft_cap=None,
      residual_checkpoint_name=None, mask_function=mask_fn, interpret=False)


def splash_attention(q: jax.Array, keys: jax.Array, values: jax.Array, key_mask: jax.Array,
                     q_offset: int, *, dtype, block_q: int = 128,
                     block_kv: int = 128) -> jax.Array:
  """`blockwise_attention`'s contract computed by JAX's TPU splash attention kernels.

  One kernel call per row (`splash_kernel`; query head k * G + g reads key/value head k), the
  causal offset in its static mask, the key mask in its segment ids. T and S are padded up to
  the blocks; padded keys are invalid, padded queries dropped. Every query sees slot 0 causally
  (q_offset >= 0), so the kernel visits a key block for each: a query with no valid key averages
  what it visits (finite, with finite gradients) instead of dividing by zero.

  Rows go through `lax.map`, not `jax.vmap` (one kernel call over all heads per row): Pallas'
  TPU interpreter in jax 0.10.2 fails on a vmapped pallas_call (no dimension semantics for the
  batch grid axis). The kernel is a custom call that XLA's SPMD partitioner cannot split: under
  a mesh, call this inside `jax.shard_map` over rows (T, S whole per device); its mask tables
  are constants and need no partition spec.

  Args:
    q: [B, T, Hkv, G, d] queries. keys, values: [B, S, Hkv, d]. key_mask: bool[B, S].
    q_offset: the slot of query 0, a static Python int >= 0 (the mask tables are NumPy).
    dtype: the dtype of q, keys and values in the kernel and of the output; scores and softmax
      are float32 inside it.
    block_q, block_kv: the kernel's query and key blocks, multiples of 128.

  Returns:
    [B, T, Hkv, G, d] in `dtype`.

  Raises:
    ValueError: q_offset is traced or negative.
  """
  if isinstance(q_offset, jax.core.Tracer):
    raise ValueError("splash_attention needs a static q_offset (a Python int): the kernel's "
                     "causal mask is built in NumPy; use blockwise_attention for a traced one")
  q_offset = int(q_offset)
  if q_offset < 0:
    raise ValueError(f"splash_attention: q_offset {q_offset} < 0 leaves queries no key to visit")
  b, t, hkv, g, d = q.shape
  s = keys.shape[1]
  kernel = splash_kernel(t, s, q_offset, hkv * g, block_q=block_q, block_kv=block_kv)
  t_pad, s_pad = _padded(t, block_q), _padded(s, block_kv)
  # The kernel does not scale its scores; q takes the 1/sqrt(d) (rounded to `dtype`).
  q = (q.astype(jnp.float32) * d ** -0.5).astype(dtype)
  q = jnp.pad(q, ((0, 0), (0, t_pad - t), (0, 0), (0, 0), (0, 0)))
  q = q.reshape(b, t_pad, hkv * g, d).transpose(0, 2, 1, 3)  # [B, Hkv * G, T', d]
  kv_pad = ((0, 0), (0, s_pad - s), (0, 0), (0, 0))
  keys = jnp.pad(keys.astype(dtype), kv_pad).transpose(0, 2, 1, 3)  # [B, Hkv, S', d]
  values = jnp.pad(values.astype(dtype), kv_pad).transpose(0, 2, 1, 3)
  # Segment ids: every query (padded ones too) 1, a valid key 1, an invalid or padded key 0.
  kv_ids = jnp.pad(key_mask, ((0, 0), (0, s_pad - s))).astype(jnp.int32)
  out = _splash_rows(kernel, np.ones((t_pad,), np.int32), q, keys, values, kv_ids)
  return out.transpose(0, 2, 1, 3)[:, :t].reshape(b, t, hkv, g, d).astype(dtype)


def _splash_rows(kernel, q_ids, q, keys, values, kv_ids):
  """The kernel on each row, its forward and backward traced under the default matmul precision
  for bfloat16: Mosaic rejects a float32-precision contraction of bfloat16 operands ("Bad lhs
  type"), which a global "highest" precision asks for (bf16 products are exact in float32). The
  backward is traced by the caller's grad, outside this call: a custom_vjp re-enters the context."""
  precision = lambda: (jax.default_matmul_precision("default") if q.dtype != jnp.float32
                       else contextlib.nullcontext())

  def rows(q, keys, values, kv_ids):
    run = lambda xs: kernel(xs[0], xs[1], xs[2], splash.SegmentIds(q=q_ids, kv=xs[3]))
    return lax.map(run, (q, keys, values, kv_ids))

  @jax.custom_vjp
  def call(q, keys, values, kv_ids):
    with precision():
      return rows(q, keys, values, kv_ids)

  def call_fwd(q, keys, values, kv_ids):
    with precision():  # residuals: the kernels' vjp
      return jax.vjp(lambda q, k, v: rows(q, k, v, kv_ids), q, keys, values)

  def call_bwd(back, d_out):
    with precision():
      return (*back(d_out), None)

  call.defvjp(call_fwd, call_bwd)
  return call(q, keys, values, kv_ids)
