"""Building blocks shared by the prompt-level curricula.

Pure functions of arrays with static shapes: drawing prompts without replacement, pooling the rows
of a batch that share a prompt id, and a bounded memory of prompt ids (fixed-size arrays with
priorities and ages) used by VCRL's replay memory and hard-focus retention.

The curricula themselves live in vcrl.py, vade.py, greso.py, adarft.py, pcl.py and hard_focus.py.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

EMPTY = -1  # prompt id of an empty memory slot


def sample_without_replacement(key: jax.Array, num_prompts: int, k: int,
                               exclude: Optional[jax.Array] = None) -> jax.Array:
  """k distinct prompt ids drawn uniformly from [0, N), in random order; i32[k].

  Args:
    key: PRNG key.
    num_prompts: N.
    k: number of draws (static), k <= N minus the excluded count.
    exclude: optional bool[N]; excluded ids are drawn only when nothing else is left.
  """
  u = jax.random.uniform(key, (num_prompts,))
  if exclude is not None:
    u = jnp.where(exclude, -1.0, u)
  _, ids = jax.lax.top_k(u, k)
  return ids.astype(jnp.int32)


def rows_pooled(ids: jax.Array, values: jax.Array) -> jax.Array:
  """f32/i32[P]: per row, the sum of `values` over all rows with the same id (a P x P compare)."""
  same = ids[:, None] == ids[None, :]
  return (same * values[None, :]).sum(axis=1).astype(values.dtype)


def first_occurrence(ids: jax.Array) -> jax.Array:
  """bool[P]: row p is the first row carrying its id."""
  p = ids.shape[0]
  same = ids[:, None] == ids[None, :]
  earlier = jnp.arange(p)[None, :] < jnp.arange(p)[:, None]
  return ~jnp.any(same & earlier, axis=1)


class Memory(NamedTuple):
  """A bounded set of M prompt ids with a priority and an age each."""
  ids: jax.Array       # i32[M] prompt id, EMPTY (-1) for a free slot
  priority: jax.Array  # f32[M] higher is kept longer and replayed more (0 in free slots)
  age: jax.Array       # i32[M] steps since the entry was inserted or refreshed (0 in free slots)


def empty_memory(size: int) -> Memory:
  return Memory(ids=jnp.full((size,), EMPTY, jnp.int32), priority=jnp.zeros((size,), jnp.float32),
                age=jnp.zeros((size,), jnp.int32))


def update_memory(memory: Memory, batch_ids: jax.Array, batch_priority: jax.Array,
                  observed: jax.Array, insert: jax.Array,
                  max_age: Optional[int] = None) -> Memory:
  """One step of the bounded memory.

    1. Ages of occupied slots grow by 1.
    2. An entry whose prompt was observed in this batch is dropped: the fresh observation decides.
    3. An entry older than `max_age` (when given) is dropped.
    4. Batch rows with `insert` (first occurrence of their id only) become entries of age 0 with
       priority `batch_priority`.
    5. Of the surviving entries and the new ones, the M with the highest priority stay; ties go to
       the younger entry, then to the earlier position (memory slots before batch rows).
  Entries are stored in that order, so slot 0 holds the highest priority.

  Args:
    memory: Memory of M slots.
    batch_ids: i32[P] prompt ids of the batch.
    batch_priority: f32[P] priority of each row (rows sharing an id should carry the same value).
    observed: bool[P] row p counts as an observation of its prompt.
    insert: bool[P] row p enters the memory.
    max_age: optional int, entries with age > max_age expire.
  Returns:
    The updated Memory.
  """
  size = memory.ids.shape[0]
  occupied = memory.ids != EMPTY
  age = jnp.where(occupied, memory.age + 1, 0)
  seen = jnp.any((memory.ids[:, None] == batch_ids[None, :]) & observed[None, :], axis=1)
  keep_old = occupied & ~seen
  if max_age is not None:
    keep_old &= age <= max_age
  new = insert & observed & first_occurrence(batch_ids)
  ids = jnp.concatenate([memory.ids, batch_ids.astype(jnp.int32)])
  live = jnp.concatenate([keep_old, new])
  prio = jnp.concatenate([memory.priority, batch_priority.astype(jnp.float32)])
  ages = jnp.concatenate([age, jnp.zeros_like(batch_ids, jnp.int32)])
  big = jnp.iinfo(jnp.int32).max
  key_prio = jnp.where(live, -prio, jnp.inf)
  key_age = jnp.where(live, ages, big)
  order = jnp.lexsort((jnp.arange(ids.shape[0]), key_age, key_prio))[:size]
  live = live[order]
  return Memory(ids=jnp.where(live, ids[order], EMPTY),
                priority=jnp.where(live, prio[order], 0.0),
                age=jnp.where(live, ages[order], 0))


def mix_memory_and_pool(key: jax.Array, memory: Memory, memory_logits: jax.Array,
                        num_from_memory: int, num_prompts: int,
                        batch_size: int) -> tuple[jax.Array, jax.Array]:
  """Draws P distinct prompts: up to `num_from_memory` from the memory, the rest from the pool.

  Memory entries are drawn without replacement with probabilities proportional to
  exp(memory_logits) (Gumbel top-k; free slots never). When the memory holds fewer than
  num_from_memory entries, the pool fills the remaining slots. Pool prompts are uniform without
  replacement and never repeat a prompt drawn from the memory.

  Args:
    key: PRNG key.
    memory: Memory of M slots.
    memory_logits: f32[M] log-weights of the entries.
    num_from_memory: static number of memory slots in the batch, <= M.
    num_prompts: N, the pool size (N >= batch_size + num_from_memory).
    batch_size: P.
  Returns:
    (prompt_ids i32[P], from_memory bool[P]); memory draws come first.
  """
  key_mem, key_pool = jax.random.split(key)
  if num_from_memory == 0:
    return (sample_without_replacement(key_pool, num_prompts, batch_size),
            jnp.zeros((batch_size,), bool))
  occupied = memory.ids != EMPTY
  gumbel = jax.random.gumbel(key_mem, memory.ids.shape)
  score = jnp.where(occupied, memory_logits + gumbel, -jnp.inf)
  _, slots = jax.lax.top_k(score, num_from_memory)
  mem_ids = memory.ids[slots]
  n_mem = jnp.minimum(occupied.sum(), num_from_memory)
  picked = jnp.arange(num_from_memory) < n_mem
  exclude = jnp.zeros((num_prompts,), jnp.int32).at[mem_ids].add(picked.astype(jnp.int32)) > 0
  pool_ids = sample_without_replacement(key_pool, num_prompts, batch_size, exclude)
  slot = jnp.arange(batch_size)
  from_memory = slot < n_mem
  mem_full = jnp.zeros((batch_size,), jnp.int32).at[:num_from_memory].set(mem_ids)
  return jnp.where(from_memory, mem_full, pool_ids), from_memory
