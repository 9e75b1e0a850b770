"""The continuous engine's paged cache: which pages each decode slot lists, taken and given back.

`model.paged_cache` keeps every layer's keys and values in one pool of pages and decodes one token
per slot through a page table; this module is the bookkeeping around it, pure functions of arrays
with no model in them. In each shard's block of the pool, pages come in two regions:

  prompt pages      prompt p's real tokens (the left padding dropped) in its Mp = ceil(Tp' /
                    page_size) pages p Mp .. p Mp + Mp - 1, written once when the prompt is
                    prefilled and listed by every row of its group
  completion pages  a stack of free pages; a row takes one when it is seated and one each time
                    its tokens cross into a new page, and gives them all back when it stops

A row of prompt length Lp lists the prompt's full pages j < Lp // page_size (shared) followed by
its own pages; its first own page starts as a copy of the prompt's partly filled last page
(`seat`: fewer than page_size tokens a row, the only thing copied), so that its first completion
token follows the prompt in the same page, as the kernel's contiguous token order needs.

Out of pages. A paged cache holds more slots than the dense one in the same memory because rows
seldom all run long; when they do, a row that needs a page and finds none makes room: the rows that
have drawn the fewest tokens restart in place (`make_room`: their own pages but the first go back,
their recorded tokens after the first are cleared, and they decode again from their first token,
drawing the same tokens with the same keys when the weights are the same), the row furthest along
never, so it always finishes. New rows are seated only while a shard keeps one free page for each
of its running rows (`admissible`).

Shapes: S slots (D shards of n = S / D), L layers, Pg pages (D blocks), F completion pages a
shard, M pages a row can list, P prompts, Tp' prompt slots.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.model import kv_cache
from rl_curriculum.model import paged_cache

__all__ = ["PagedCache", "row_pages", "layout", "init", "write_prompts", "held", "admissible",
           "seat", "make_room", "release", "stop"]


class PagedCache(NamedTuple):
  """The pool and each slot's pages (page ids local to the slot's shard's block of the pool)."""
  pool: jax.Array   # [L, Pg, page_size, 2 Hkv, d] every layer's pages (`paged_cache.init_pool`)
  table: jax.Array  # i32[S, M] each slot's pages in token order
  prompts: jax.Array  # i32[D, P/D, Mp] each shard's prompts' pages (shard-local ids)
  free: jax.Array   # i32[D, F] each shard's free completion pages: entries [0, count) are free
  count: jax.Array  # i32[D] free pages of each shard


def row_pages(max_new_tokens: int, page_size: int) -> int:
  """The most completion pages one row holds: its `max_new_tokens` positions in pages of
  `page_size`, and one more, since its first own page starts part-filled by the prompt's last
  tokens (`seat`)."""
  return -(-max_new_tokens // page_size) + 1


def layout(prompts: int, width: int, slots: int, max_new_tokens: int, page_size: int,
           pages: int, shards: int) -> dict:
  """The static sizes of a paged cache: prompt pages per prompt `mp`, pages a row lists `m`,
  completion pages per shard `f` (`pages` in all; 0: enough for every slot to run to
  max_new_tokens, the dense engine's worst case) and pool pages `total`."""
  mp = -(-width // page_size)
  m = -(-(width + max_new_tokens) // page_size) + 1
  own = row_pages(max_new_tokens, page_size)
  f = pages // shards if pages else (slots // shards) * own
  if f < own + slots // shards - 1:
    raise ValueError(
        f"{pages} KV pages leave {f} a shard; a shard needs at least {own + slots // shards - 1}"
        f" ({own} for one row of {max_new_tokens} tokens in pages of {page_size}, one for each "
        f"of its {slots // shards - 1} other slots) so that its longest row can always finish.")
  return dict(mp=mp, m=m, f=f, total=shards * ((prompts // shards) * mp + f))


def init(config, *, prompts: int, width: int, slots: int, max_new_tokens: int, page_size: int,
         pages: int, shards: int) -> PagedCache:
  """An empty paged cache: every completion page free, every slot listing nothing."""
  sizes = layout(prompts, width, slots, max_new_tokens, page_size, pages, shards)
  prompt_region = (prompts // shards) * sizes["mp"]
  free = prompt_region + jnp.arange(sizes["f"], dtype=jnp.int32)
  local = jnp.arange(prompt_region, dtype=jnp.int32).reshape(prompts // shards, sizes["mp"])
  return PagedCache(pool=paged_cache.init_pool(config, sizes["total"], page_size),
                    table=jnp.zeros((slots, sizes["m"]), jnp.int32),
                    prompts=jnp.tile(local[None], (shards, 1, 1)),
                    free=jnp.tile(free[None], (shards, 1)),
                    count=jnp.full((shards,), sizes["f"], jnp.int32))


def _pages_of(cache: PagedCache) -> tuple:
  """(page_size, D shards, Pg / D pages a shard)."""
  shards = cache.count.shape[0]
  return cache.pool.shape[2], shards, cache.pool.shape[1] // shards


def write_prompts(cache: PagedCache, prompts: kv_cache.KVCache, mask: jax.Array,
                  generation) -> PagedCache:
  """The cache with generation `generation`'s prompts written into their prompt pages.

  prompts: the P' prompts' prefilled keys and values (batch order, left-padded), in either
  layout of `kv_cache` (L arrays [P', Tp', Hkv, d], or one [L, P', Tp', Hkv, d] each); mask
  bool[P', Tp'] their real tokens. Prompt i of shard d's P'/D is the shard's local prompt
  generation * P'/D + i (the engine's layout, `slots.EngineState`).
  """
  stacked = lambda x: jnp.stack(x) if isinstance(x, (tuple, list)) else x
  keys, values = stacked(prompts.k), stacked(prompts.v)
  size, shards, per_shard = _pages_of(cache)
  layers, prompts, width = keys.shape[:3]
  mp = -(-width // size)
  length = jnp.sum(mask, axis=1, dtype=jnp.int32)                         # [P']
  # Real token j of prompt p sits at slot width - length[p] + j of its left-padded row.
  j = jnp.arange(mp * size, dtype=jnp.int32)[None, :]
  source = jnp.clip(width - length[:, None] + j, 0, width - 1)          # [P', Mp page_size]
  real = (j < length[:, None])[None, :, :, None, None]

  def pages(x):
    x = jnp.take_along_axis(x, source[None, :, :, None, None], axis=2)
    return jnp.where(real, x, jnp.zeros((), x.dtype))

  both = jnp.stack([pages(keys), pages(values)], axis=-2)               # [L, P', Mp ps, Hkv, 2, d]
  both = both.reshape(layers, shards, (prompts // shards) * mp, size, -1, keys.shape[-1])
  pool = cache.pool.reshape((layers, shards, per_shard) + cache.pool.shape[2:])
  start = (0, 0, generation * (prompts // shards) * mp, 0, 0, 0)
  pool = jax.lax.dynamic_update_slice(pool, both.astype(pool.dtype), start)
  return cache._replace(pool=pool.reshape(cache.pool.shape))


def held(prompt_length: jax.Array, written: jax.Array, size: int) -> jax.Array:
  """i32[...]: a seated row's own pages, with `written` tokens (prompt included) in the cache:
  from its first own page, Lp // size, to the page of its last token (at least the first)."""
  first = prompt_length // size
  return jnp.maximum(-(-written // size), first + 1) - first


def admissible(cache: PagedCache, live: jax.Array) -> jax.Array:
  """i32[D]: rows each shard may seat now: its free pages less one for each running row."""
  _, shards, _ = _pages_of(cache)
  running = jnp.sum(live.reshape(shards, -1), axis=1, dtype=jnp.int32)
  return jnp.maximum(cache.count - running, 0)


def _pop(cache: PagedCache, take: jax.Array, where: jax.Array) -> PagedCache:
  """The cache with each slot in `take` (bool[S]) given a free page at its table entry `where`
  (i32[S]); every shard must have enough free pages."""
  _, shards, _ = _pages_of(cache)
  by_shard = lambda x: x.reshape(shards, -1)
  take, where = by_shard(take), by_shard(where)
  rank = jnp.cumsum(take, axis=1, dtype=jnp.int32) - 1
  page = jnp.take_along_axis(cache.free, jnp.clip(cache.count[:, None] - 1 - rank, 0, None),
                             axis=1)
  m = cache.table.shape[1]
  table = cache.table.reshape(shards, -1, m)
  column = jnp.where(take, where, m)  # out of range: nothing written
  table = jax.vmap(lambda t, c, p: t.at[jnp.arange(t.shape[0]), c].set(p, mode="drop"))(
      table, column, page)
  return cache._replace(table=table.reshape(cache.table.shape),
                        count=cache.count - jnp.sum(take, axis=1, dtype=jnp.int32))


def seat(cache: PagedCache, seated: jax.Array, prompt: jax.Array,
         prompt_length: jax.Array) -> PagedCache:
  """The cache with the newly `seated` slots (bool[S]) listing their prompt's pages (prompt:
  i32[D, S/D] shard-local prompt index, `slots.slot_prompts`; prompt_length: i32[S] its real
  tokens) and one own page, which starts as a copy of the prompt's page Lp // page_size in
  every layer (the only copy: the prompt's tokens of a partly filled page): on one shard in
  place, a page at a time (`_copy_pages`); over shards, one scatter into each shard's block."""
  size, shards, _ = _pages_of(cache)
  m = cache.table.shape[1]
  mp = cache.prompts.shape[2]
  first = prompt_length // size
  listed = jax.vmap(lambda t, p: t[p])(cache.prompts, prompt).reshape(-1, mp)   # [S, Mp]
  listed = jnp.concatenate(
      [listed, jnp.broadcast_to(listed[:, -1:], (listed.shape[0], m - mp))], axis=1)
  source = jnp.take_along_axis(listed, jnp.minimum(first, mp - 1)[:, None], axis=1)[:, 0]
  cache = _pop(cache._replace(table=jnp.where(seated[:, None], listed, cache.table)), seated,
               first)
  target = jnp.take_along_axis(cache.table, first[:, None], axis=1)[:, 0]
  if shards == 1:
    return cache._replace(pool=_copy_pages(cache.pool, source, target, seated))
  layers = cache.pool.shape[0]
  pool = cache.pool.reshape((layers, shards, -1) + cache.pool.shape[2:])
  by_shard = lambda x: x.reshape(shards, -1)
  dead = pool.shape[2]  # an out-of-range page: nothing written

  def copy(block, src, dst, ok):
    return block.at[:, jnp.where(ok, dst, dead)].set(block[:, src], mode="drop")

  pool = jax.vmap(copy, in_axes=(1, 0, 0, 0), out_axes=1)(
      pool, by_shard(source), by_shard(target), by_shard(seated))
  return cache._replace(pool=pool.reshape(cache.pool.shape))


def _copy_pages(pool: jax.Array, source: jax.Array, target: jax.Array, copy: jax.Array
                ) -> jax.Array:
  """The pool [L, Pg, ...] with page source[s] copied to page target[s] in every layer for each
  slot s in `copy` (bool[S]): a loop over the slots that copy, each page moved in place. One
  scatter of every slot's page, its updates gathered from the pool itself, made XLA:CPU copy the
  whole pool a call (58 ms at 256 slots of SmolLM2-135M, against 1.4 ms for this loop)."""
  order = jnp.argsort(~copy)                           # the slots that copy first
  source, target = source[order], target[order]

  def one(i, pool):
    page = jax.lax.dynamic_slice_in_dim(pool, source[i], 1, axis=1)
    return jax.lax.dynamic_update_slice_in_dim(pool, page, target[i], axis=1)

  return jax.lax.fori_loop(0, jnp.sum(copy, dtype=jnp.int32), one, pool)


def make_room(cache: PagedCache, live: jax.Array, prompt_length: jax.Array, fed: jax.Array):
  """(cache, restart bool[S]): each running slot (`live`) whose next token (at fed i32[S] tokens
  after its prompt) starts a new page given one; where a shard has too few free pages, its rows
  that have drawn the fewest tokens first restart (module docstring) until the others' pages
  fit, and `restart` marks them (their slots then hold their first token again, step 1). A row
  whose restart would free no page and need none is never restarted; the row furthest along only
  if every other has been, which the pool's least size (`layout`) rules out."""
  size, shards, _ = _pages_of(cache)
  position = prompt_length + fed
  first = prompt_length // size
  need = live & (position % size == 0) & (position // size > first)
  spare = jnp.where(live, held(prompt_length, position, size) - 1, 0)  # pages a restart frees
  by_shard = lambda x: x.reshape(shards, -1)
  n = by_shard(live).shape[1]
  gain = spare + need.astype(jnp.int32)  # pages a restart frees or no longer needs
  # Youngest first among the rows whose restart gains a page: fewest tokens fed, ties to the
  # later slot (a stable sort of the slots in reverse); the others last.
  key = by_shard(jnp.where(live & (gain > 0), fed, jnp.iinfo(jnp.int32).max))[:, ::-1]
  order = n - 1 - jnp.argsort(key, axis=1, stable=True).astype(jnp.int32)
  gain = jnp.take_along_axis(by_shard(gain), order, axis=1)
  gained = jnp.concatenate([jnp.zeros((shards, 1), jnp.int32),
                            jnp.cumsum(gain, axis=1, dtype=jnp.int32)], axis=1)  # [D, n + 1]
  short = jnp.sum(by_shard(need), axis=1, dtype=jnp.int32) - cache.count             # [D]
  victims = jnp.argmax(gained >= short[:, None], axis=1)          # fewest restarts that fit
  chosen = jnp.arange(n, dtype=jnp.int32)[None, :] < victims[:, None]
  restart = jnp.zeros((shards, n), bool)
  restart = jax.vmap(lambda r, o, c: r.at[o].set(c))(restart, order, chosen).reshape(-1)
  # A restarted row keeps its first own page (its prompt's copy) and gives back the rest.
  cache = release(cache, restart, first + 1, first + held(prompt_length, position, size) - 1)
  return _pop(cache, need & ~restart, position // size), restart


def release(cache: PagedCache, leaving: jax.Array, low: jax.Array, high: jax.Array,
            table=None) -> PagedCache:
  """The cache with the pages that the slots `leaving` (bool[S]) list at table entries low ..
  high (i32[S], inclusive; none if high < low) back on their shard's free stack; `table`
  (i32[n, M], shard by shard; None: the slots' own) lists them instead, for n rows then."""
  _, shards, _ = _pages_of(cache)
  table = cache.table if table is None else table
  j = jnp.arange(table.shape[1], dtype=jnp.int32)[None, :]
  back = leaving[:, None] & (j >= low[:, None]) & (j <= high[:, None])        # [S, M]
  back = back.reshape(shards, -1)
  rank = jnp.cumsum(back, axis=1, dtype=jnp.int32) - 1
  position = jnp.where(back, cache.count[:, None] + rank, cache.free.shape[1])
  free = jax.vmap(lambda f, p, v: f.at[p].set(v, mode="drop"))(
      cache.free, position, table.reshape(shards, -1))
  return cache._replace(free=free, count=cache.count + jnp.sum(back, axis=1, dtype=jnp.int32))


def stop(cache: PagedCache, leaving: jax.Array, prompt_length: jax.Array,
         written: jax.Array) -> PagedCache:
  """The cache with every own page of the slots `leaving` (bool[S]; `written` i32[S] tokens in
  the cache, prompt included) given back."""
  size = cache.pool.shape[2]
  first = prompt_length // size
  return release(cache, leaving, first, first + held(prompt_length, written, size) - 1)
