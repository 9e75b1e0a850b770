"""Decode over a paged key/value cache: one pool of fixed-size pages, a page table per decode slot.

The continuous engine's dense cache (`prefix_cache`) gives every decode slot N completion slots,
whether its row stops after ten tokens or runs to N. A paged cache keeps every layer's keys and
values in one pool of pages of `page_size` tokens; decode slot b reads the pages its table lists,

  token j of slot b  ->  pool[layer, table[b, j // page_size], j % page_size]

so a row holds only the pages it has filled, and the pages of a group's prompt are listed by all
G rows of the group (shared, not copied). Which pages a slot owns, and when they are taken and
given back, is the engine's bookkeeping (`sampling.pages`); this module is the model's side: the
pool, and one decode step's write and attention (`paged_attention.decode_attention`, whose
backends are the pure-JAX reference and JAX's TPU kernel).

The pool has the layout of JAX's ragged paged attention kernel, keys and values interleaved on
one head axis: [L, Pg, page_size, 2 Hkv, d], keys at even heads. Pages are split into D equal
blocks over the mesh's batch shards, as the decode slots are; a slot lists page ids local to its
shard's block, so that under a mesh no read or write crosses devices: each device runs the step
on its own block (`PageIndex.shard`, a `jax.shard_map`; also how the TPU kernel, which XLA cannot
partition, runs under a mesh).

Shapes: L layers, Pg pages (D blocks of Pg / D), B decode slots (D shards of B / D), M pages a
slot can list, Hkv key/value heads, G query heads per key/value head, d = head_dim.
"""

from typing import Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from rl_curriculum.model import attention
from rl_curriculum.model import paged_attention
from rl_curriculum.model.config import ModelConfig

__all__ = ["PageIndex", "init_pool", "page_size", "attend"]

# The TPU kernel's tiling of one decode step: pages of keys fetched per block, queries per block.
_KERNEL_BLOCKS = dict(num_kv_pages_per_block=8, num_queries_per_block=8)


class PageIndex(NamedTuple):
  """Where one decode step's token of each slot is written and what the slot reads.

  `table` and `length` are split into D shards ([D, B / D, ...]); the model's blocks set `layer`.
  """
  table: jax.Array                 # i32[D, B/D, M] each slot's pages in order (shard-local ids)
  length: jax.Array                # i32[D, B/D] tokens the slot holds with this step's (0: empty)
  layer: Union[int, jax.Array] = 0  # the layer whose pages are read and written
  # None, or run(fn, args, in_axes, out_axes) applying fn to each device's shard
  # (`mesh.per_shard`): how the TPU kernel, which XLA cannot partition, runs under a mesh.
  shard: Optional[Callable] = None


def init_pool(config: ModelConfig, pages: int, size: int) -> jax.Array:
  """An all-zero pool of `pages` pages of `size` tokens for every layer, in the model's cache
  dtype (`config.cache_dtype`): [L, pages, size, 2 Hkv, head_dim]."""
  shape = (config.num_layers, pages, size, 2 * config.num_kv_heads, config.head_dim)
  return jnp.zeros(shape, config.cache_dtype)


def page_size(pool: jax.Array) -> int:
  """Tokens per page of a pool from `init_pool`."""
  return pool.shape[2]


def attend(pool: jax.Array, index: PageIndex, q: jax.Array, k: jax.Array, v: jax.Array, *,
           config: ModelConfig):
  """One decode step of one layer: each slot's new key and value written at its token
  `index.length - 1`, then its query attends over its `index.length` tokens.

  Args:
    pool: [L, Pg, page_size, 2 Hkv, d] every layer's pages (`init_pool`).
    index: the slots' pages and lengths, and the layer (`PageIndex`).
    q: [B, Hkv, G, d] one query per slot; k, v: [B, Hkv, d] the slot's new key and value.
    config: the model's config (`attention` picks the backend, `dtype` the output's).

  Returns:
    ([B, Hkv, G, d] in config.dtype, the pool with the new keys and values written). An empty
    slot (length 0) writes nothing and gets a finite, unused output.
  """
  kind = attention.backend(config.attention)
  blocks = _KERNEL_BLOCKS if kind == "tpu" else {}

  def one_shard(pool, table, length, q, k, v):
    # One shard's pool [L, Pg', ...] and slots (a mesh's device holds one: `index.shard`), its
    # pages of every layer seen as one axis [L Pg']: layer l's page p is l Pg' + p, so the kernel
    # reads the layer's pages without a copy of the layer being made.
    if table.shape[0] != 1:
      raise ValueError(f"{table.shape[0]} shards of decode slots without a mesh to run them on "
                       "(PageIndex.shard)")
    layers, pages = pool.shape[:2]
    flat = pool.reshape((layers * pages,) + pool.shape[2:])
    ids = table[0] + index.layer * pages
    length = length[0]
    flat = paged_attention.write(flat, k, v, ids, length - 1, length > 0)
    out = paged_attention.decode_attention(q, flat, length, ids, backend=kind,
                                           dtype=config.dtype, **blocks)
    return out, flat.reshape(pool.shape)

  args = (pool, index.table, index.length, q, k, v)
  if index.shard is None:
    return one_shard(*args)
  tensor = getattr(index.shard, "tensor", 1)
  if tensor > 1 and q.shape[1] % tensor == 0:  # each device its KV heads (`mesh.pool_sharding`)
    return index.shard(one_shard, args, (1, 0, 0, 0, 0, 0), (0, 1),
                       heads_in=(3, None, None, 1, 1, 1), heads_out=(1, 3))
  return index.shard(one_shard, args, (1, 0, 0, 0, 0, 0), (0, 1))
