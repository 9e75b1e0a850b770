"""The continuous engine's state and its bookkeeping: rows, decode slots and the queue between them.

`continuous` runs the decode loop over an `EngineState`; this module holds the state's layout and
the pure functions that move rows in and out of slots, with no model in them:

  state = empty(cache, prompt_mask, keys, rows=R, slots=S, ...)   every row done, nothing queued
  state = enqueue(state, active, w, limit, first, stop)           generation w's rows queued
  state = seat(state, keep, group)                                free slots take queued rows
  token = pending_tokens(state)                                   each slot's token to feed next
  state = record(state, token, logprob, version, stops)           a drawn token in its row
  state = restart(state, again, pad_id)                           rows back at their first token
  state = compact(state, slots, scanned)                          occupied slots first, fewer

A row's first token is drawn when it is queued, from its prompt's prefill logits (`enqueue`
records it), so a seated row always has a token to feed: its newest recorded one. Every token is
recorded with the version of the weights whose logits drew it, and nothing between two calls of
the decode loop holds logits: the state is tokens, the key/value cache and counters.

Shapes: R rows (W generations of R/W), S slots, D shards, P prompts, Tp' prompt slots, N new
tokens.
"""

from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from rl_curriculum.model import prefix_cache
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import pages

__all__ = ["EngineState", "FirstTokens", "generation_parts", "slot_keys", "put_block",
           "take_block", "empty", "enqueue", "seat", "pending_tokens", "record", "fits",
           "compact", "on_slots", "constrain", "pending", "slot_prompts", "prompt_lengths",
           "restart", "forced_tokens", "keep_tables"]


class EngineState(NamedTuple):
  """What the decode loop carries (donated to `continuous.run`); rows are global indices, R = an
  empty slot.

  The R rows are W generations of R/W (`inflight`: the batches of W steps in flight; W = 1 for
  one call of `continuous.sample`), laid out shard by shard: shard d holds rows [d R/D,
  (d + 1) R/D), and within it generation w holds the block [w R/(W D), (w + 1) R/(W D)) (prompts
  likewise, by P).
  """
  tokens: jax.Array         # i32[R, N] completion buffers (pad_id where nothing was recorded)
  logprobs: jax.Array       # f32[R, N]
  mask: jax.Array           # f32[R, N] 1 on recorded tokens
  versions: jax.Array       # i32[R, N] policy version of the weights whose logits drew each token
  limit: jax.Array          # i32[R] tokens a row may record (N, or `stop_after`)
  done: jax.Array           # bool[R] stopped, or never queued (not active)
  row: jax.Array            # i32[S] the row in each slot, R when the slot is empty
  step: jax.Array           # i32[S] tokens the slot's row has recorded (>= 1 once seated: the
                            # newest, at step - 1, is the one it feeds next)
  cache: Union[prefix_cache.PrefixCache, pages.PagedCache]  # dense, or paged (`pages`)
  prompt_mask: jax.Array    # bool[P, Tp'] real tokens of the prompts' slots
  queue: jax.Array          # i32[D, R/D] each shard's queued rows (local index), a first-in
                            # first-out ring: position q holds the q-th row ever queued, mod R/D
  queued: jax.Array         # i32[D] rows ever queued per shard
  taken: jax.Array          # i32[D] of them given a slot (or passed over by `inflight.evict`)
  queue_end: jax.Array      # i32[D, W] `queued` once each generation's rows were queued
  iterations: jax.Array     # i32[] loop iterations run
  slot_steps: jax.Array     # i32[] slot-steps computed (each iteration: the slots of its stage)
  drawn: jax.Array          # i32[] tokens recorded (first tokens included)
  fed: jax.Array            # i32[] slot-steps that fed an occupied slot's token (each drew the
                            # row's next token)
  keys: jax.Array           # [W] each generation's key (row r's t-th token: fold_in(fold_in(
                            # key, r), t), r its index in its generation's batch)
  # Episodes (`turns`; None in a single-turn engine): rows queued again after a turn.
  forced: Optional[jax.Array] = None  # i32[R] positions < forced[r] of row r hold tokens written
                                      # before it was queued again (its observations): fed as
                                      # they are, never drawn
  resume: Optional[jax.Array] = None  # i32[R] the step a queued row is seated at (1: new row)
  tables: Optional[jax.Array] = None  # i32[R, M] each row's page table while it waits


class FirstTokens(NamedTuple):
  """Each row's first token, drawn from its prompt's prefill logits when it is queued."""
  token: jax.Array    # i32[n] batch order
  logprob: jax.Array  # f32[n]
  version: jax.Array  # i32[] the weights that prefilled the prompts


def _shards(x: jax.Array, d: int) -> jax.Array:
  """[n, ...] as [d, n / d, ...] (each shard's block)."""
  return x.reshape((d, -1) + x.shape[1:])


def _sizes(state: EngineState) -> tuple[int, int, int]:
  """(R rows, D shards, W generations)."""
  return state.tokens.shape[0], state.queue.shape[0], state.keys.shape[0]


def slot_prompts(row: jax.Array, shards: int, rows: int, group: int) -> jax.Array:
  """i32[D, S/D]: the shard-local prompt each slot's row continues (0 for an empty slot)."""
  local = (jnp.minimum(row, rows - 1) % (rows // shards)) // group
  return local.reshape(shards, -1)


def generation_parts(row: jax.Array, rows: int, shards: int, generations: int):
  """(generation, index in its generation's batch) of each row i32[...] (an empty slot's R reads
  as row R - 1): see `EngineState`'s layout."""
  per_shard = rows // shards
  per_generation = per_shard // generations
  local = jnp.minimum(row, rows - 1) % per_shard
  shard = jnp.minimum(row, rows - 1) // per_shard
  return local // per_generation, shard * per_generation + local % per_generation


def slot_keys(state: EngineState) -> jax.Array:
  """One key per slot for its row's next token (index `state.step`): fold_in(fold_in(generation
  key, batch index), step), as `strategies.row_keys` gives a row of a single call."""
  rows, shards, generations = _sizes(state)
  generation, index = generation_parts(state.row, rows, shards, generations)
  fold = lambda g, r, t: jax.random.fold_in(jax.random.fold_in(state.keys[g], r), t)
  return jax.vmap(fold)(generation, index, state.step)


def put_block(table: jax.Array, new: jax.Array, generation: jax.Array, shards: int,
              axis: int = 0) -> jax.Array:
  """table [..., W n, ...] (a generation table on `axis`, `EngineState` layout) with generation
  `generation`'s block replaced by new [..., n, ...] (batch order), shard by shard."""
  split = lambda x: x.reshape(x.shape[:axis] + (shards, -1) + x.shape[axis + 1:])
  block = split(new).astype(table.dtype)
  start = [0] * (table.ndim + 1)
  start[axis + 1] = generation * block.shape[axis + 1]
  return jax.lax.dynamic_update_slice(split(table), block, start).reshape(table.shape)


def take_block(table: jax.Array, generation: jax.Array, generations: int, shards: int,
               axis: int = 0) -> jax.Array:
  """Generation `generation`'s block of table [..., W n, ...] in batch order: [..., n, ...]."""
  blocks = table.reshape(table.shape[:axis] + (shards, generations, -1) + table.shape[axis + 1:])
  out = jax.lax.dynamic_index_in_dim(blocks, generation, axis + 1, keepdims=False)
  return out.reshape(table.shape[:axis] + (-1,) + table.shape[axis + 1:])


def empty(cache: prefix_cache.PrefixCache, prompt_mask: jax.Array, keys: jax.Array, *,
          rows: int, slots: int, max_new_tokens: int, shards: int, pad_id: int) -> EngineState:
  """An engine of `rows` rows (W = len(keys) generations; every row done, none queued) and
  `slots` empty slots around a prompt cache and its mask."""
  n, w = max_new_tokens, keys.shape[0]
  return EngineState(
      tokens=jnp.full((rows, n), pad_id, jnp.int32), logprobs=jnp.zeros((rows, n), jnp.float32),
      mask=jnp.zeros((rows, n), jnp.float32), versions=jnp.zeros((rows, n), jnp.int32),
      limit=jnp.full((rows,), n, jnp.int32), done=jnp.ones((rows,), bool),
      row=jnp.full((slots,), rows, jnp.int32), step=jnp.zeros((slots,), jnp.int32), cache=cache,
      prompt_mask=prompt_mask, queue=jnp.zeros((shards, rows // shards), jnp.int32),
      queued=jnp.zeros((shards,), jnp.int32), taken=jnp.zeros((shards,), jnp.int32),
      queue_end=jnp.zeros((shards, w), jnp.int32), iterations=jnp.zeros((), jnp.int32),
      slot_steps=jnp.zeros((), jnp.int32), drawn=jnp.zeros((), jnp.int32),
      fed=jnp.zeros((), jnp.int32), keys=keys)


def enqueue(state: EngineState, active: jax.Array, generation: jax.Array, limit: jax.Array,
            first: FirstTokens, stop: jax.Array, pad_id: int) -> EngineState:
  """The state with generation `generation`'s rows reset (`limit` i32[n] tokens each), the
  `active` ones (bool[n], batch order) holding their first token and queued after every row
  queued before them, unless that token already ends them (a stop id in `stop` i32[k], or a
  limit of 1); the others are done from the start."""
  d, per_shard = state.queue.shape
  per_generation = per_shard // state.keys.shape[0]
  ended = jnp.any(first.token[:, None] == stop[None, :], axis=-1) | (limit <= 1)
  waits = active & ~ended
  by_shard = waits.reshape(d, per_generation)
  order = jnp.argsort(~by_shard, axis=1, stable=True).astype(jnp.int32)
  count = jnp.sum(by_shard, axis=1, dtype=jnp.int32)
  m = jnp.arange(per_generation, dtype=jnp.int32)[None, :]
  position = jnp.where(m < count[:, None], (state.queued[:, None] + m) % per_shard, per_shard)
  queue = jax.vmap(lambda q, i, v: q.at[i].set(v, mode="drop"))(
      state.queue, position, generation * per_generation + order)
  queued = state.queued + count
  block = lambda table, new: put_block(table, new, generation, d)

  def first_column(table, value, fill):  # the generation's rows: `value` at 0 where active
    fresh = jnp.full((active.shape[0],) + table.shape[1:], fill, table.dtype)
    return block(table, fresh.at[:, 0].set(jnp.where(active, value, fill)))

  if state.forced is not None:  # episodes: the generation's rows start with no observation
    state = state._replace(forced=block(state.forced, jnp.zeros_like(limit)),
                           resume=block(state.resume, jnp.ones_like(limit)))
  return state._replace(
      tokens=first_column(state.tokens, first.token, pad_id),
      logprobs=first_column(state.logprobs, first.logprob, 0),
      mask=first_column(state.mask, 1, 0),
      versions=first_column(state.versions, first.version, 0),
      limit=block(state.limit, limit), done=block(state.done, ~waits), queue=queue,
      queued=queued, queue_end=state.queue_end.at[:, generation].set(queued),
      drawn=state.drawn + jnp.sum(active, dtype=jnp.int32))


def _refill(free: jax.Array, state: EngineState, rows: int, room: Optional[jax.Array]):
  """(row i32[S], refilled bool[S], taken i32[D]): each free slot given its shard's next queued
  row, in slot order, while the shard's queue lasts (and at most `room` i32[D] rows a shard);
  R where none is left."""
  d, per_shard = state.queue.shape
  free = free.reshape(d, -1)
  order = jnp.cumsum(free, axis=1, dtype=jnp.int32)
  position = state.taken[:, None] + order - 1
  refilled = free & (position < state.queued[:, None])
  if room is not None:
    refilled = refilled & (order <= room[:, None])
  local = jnp.take_along_axis(state.queue, position % per_shard, axis=1)
  row = jnp.where(refilled, local + per_shard * jnp.arange(d, dtype=jnp.int32)[:, None], rows)
  taken = state.taken + jnp.sum(refilled, axis=1, dtype=jnp.int32)
  return row.reshape(-1), refilled.reshape(-1), taken


def seat(state: EngineState, keep: jax.Array, group: int = 1) -> EngineState:
  """The state with the slots not in `keep` (bool[S]) refilled from the queue: a new row starts
  at step 1 (its first token recorded, to be fed); slots left without a row hold R. A paged
  cache seats only the rows its free pages admit and gives each its pages (`pages.seat`;
  `group` rows a prompt)."""
  rows = state.tokens.shape[0]
  paged = isinstance(state.cache, pages.PagedCache)
  room = pages.admissible(state.cache, keep & (state.row < rows)) if paged else None
  new_row, refilled, taken = _refill(~keep, state, rows, room)
  shards = state.queue.shape[0]
  first = refilled.astype(jnp.int32)
  back = jnp.zeros_like(refilled)  # rows that come back after a turn, to their own pages
  if state.resume is not None:
    first = jnp.where(refilled, _read(state.resume, new_row, shards), 0)
    back = refilled & (first > 1)
  state = state._replace(row=jnp.where(keep, state.row, new_row),
                         step=jnp.where(keep, state.step, first), taken=taken)
  if not paged:
    return state
  prompt = slot_prompts(state.row, shards, rows, group)
  cache = pages.seat(state.cache, refilled & ~back, prompt, prompt_lengths(state, prompt))
  if state.tables is not None:
    cache = cache._replace(table=jnp.where(back[:, None], _read(state.tables, new_row, shards),
                                           cache.table))
  return state._replace(cache=cache)


def _read(buffer: jax.Array, row: jax.Array, shards: int) -> jax.Array:
  """buffer [R, ...] read at each slot's row i32[S] (zeros for an empty slot), shard by shard."""
  local = _local(row, buffer.shape[0], shards)
  out = jax.vmap(lambda b, r: b.at[r].get(mode="fill", fill_value=0))(_shards(buffer, shards),
                                                                      local)
  return out.reshape((-1,) + buffer.shape[1:])


def forced_tokens(state: EngineState, pad_id: int) -> tuple[jax.Array, jax.Array]:
  """(bool[S], i32[S]): whether each occupied slot's next position holds a token written before
  (an observation: `EngineState.forced`), and that token (pad_id where not)."""
  rows, shards, _ = _sizes(state)
  if state.forced is None:
    return jnp.zeros(state.row.shape, bool), jnp.full(state.row.shape, pad_id, jnp.int32)
  here = (state.row < rows) & (state.step < _read(state.forced, state.row, shards))
  token = jax.vmap(lambda b, r, t: b.at[r, t].get(mode="fill", fill_value=pad_id))(
      _shards(state.tokens, shards), _local(state.row, rows, shards),
      state.step.reshape(shards, -1)).reshape(-1)
  return here, jnp.where(here, token, pad_id)


def keep_tables(state: EngineState, leaving: jax.Array) -> EngineState:
  """The state with the page tables of the slots `leaving` (bool[S]) kept by their rows
  (`EngineState.tables`), so that the rows find their pages when they are seated again."""
  rows, shards, _ = _sizes(state)
  local = _local(jnp.where(leaving, state.row, rows), rows, shards)
  tables = jax.vmap(lambda b, r, v: b.at[r].set(v, mode="drop"))(
      _shards(state.tables, shards), local, _shards(state.cache.table, shards))
  return state._replace(tables=tables.reshape(state.tables.shape))


def prompt_lengths(state: EngineState, prompt: jax.Array) -> jax.Array:
  """i32[S] the real tokens of each slot's prompt (prompt: i32[D, S/D], `slot_prompts`)."""
  lengths = jnp.sum(state.prompt_mask, axis=1, dtype=jnp.int32)
  return prefix_cache.gather(lengths, prompt)


def _local(row: jax.Array, rows: int, shards: int) -> jax.Array:
  """i32[D, S/D] shard-local index of each slot's row (R / D, out of bounds, for an empty one)."""
  per_shard = rows // shards
  return jnp.where(row < rows, row % per_shard, per_shard).reshape(shards, -1)


def _write(buffer: jax.Array, row: jax.Array, step: Optional[jax.Array], value: jax.Array,
           shards: int):
  """buffer [R, N] with value[s] at (row[s], step[s]) for the occupied slots (buffer [R] and
  step None: at row[s]), shard by shard."""
  local = _local(row, buffer.shape[0], shards)
  by_shard = lambda x: x.reshape(shards, -1)
  if step is None:
    out = jax.vmap(lambda b, r, v: b.at[r].set(v, mode="drop"))(
        _shards(buffer, shards), local, by_shard(value))
  else:
    out = jax.vmap(lambda b, r, t, v: b.at[r, t].set(v, mode="drop"))(
        _shards(buffer, shards), local, by_shard(step), by_shard(value))
  return out.reshape(buffer.shape)


def pending_tokens(state: EngineState, pad_id: int) -> jax.Array:
  """i32[S] each occupied slot's token to feed: its row's newest recorded one (pad_id where the
  slot is empty)."""
  rows, shards, _ = _sizes(state)
  local = _local(state.row, rows, shards)
  last = jnp.maximum(state.step - 1, 0).reshape(shards, -1)
  token = jax.vmap(lambda b, r, t: b.at[r, t].get(mode="fill", fill_value=pad_id))(
      _shards(state.tokens, shards), local, last)
  return token.reshape(-1)


def record(state: EngineState, token: jax.Array, logprob: jax.Array, version: jax.Array,
           stops: jax.Array, forced: Optional[jax.Array] = None) -> EngineState:
  """The state with each occupied slot's drawn token i32[S] (its log-prob f32[S], drawn by the
  weights of `version`) recorded at its row's next position, the rows whose token `stops`
  (bool[S]) done, and the slot steps advanced. Where `forced` (bool[S], None: nowhere) the
  position already holds an observation token: it is left as it is (mask 0), not drawn."""
  rows, shards, _ = _sizes(state)
  live = state.row < rows
  at = state.row if forced is None else jnp.where(forced, rows, state.row)
  write = lambda buffer, value: _write(buffer, at, state.step, value, shards)
  drawn = live if forced is None else live & ~forced
  return state._replace(
      tokens=write(state.tokens, token), logprobs=write(state.logprobs, logprob),
      mask=write(state.mask, jnp.ones_like(logprob)),
      versions=write(state.versions, jnp.broadcast_to(version, token.shape)),
      done=_write(state.done, jnp.where(stops, state.row, rows), None,
                  jnp.ones(token.shape, bool), shards),
      step=state.step + 1, drawn=state.drawn + jnp.sum(drawn, dtype=jnp.int32),
      fed=state.fed + jnp.sum(live, dtype=jnp.int32))


def restart(state: EngineState, again: jax.Array, pad_id: int) -> EngineState:
  """The state with the rows in the slots `again` (bool[S]) back at their first token: step 1,
  and everything they recorded after it cleared (they draw it again, `pages.make_room`)."""
  rows, shards, _ = _sizes(state)
  mine = _write(jnp.zeros((rows,), bool), jnp.where(again, state.row, rows), None,
                jnp.ones(again.shape, bool), shards)
  later = mine[:, None] & (jnp.arange(state.tokens.shape[1], dtype=jnp.int32)[None, :] >= 1)
  clear = lambda x, fill: jnp.where(later, jnp.asarray(fill, x.dtype), x)
  dropped = jnp.sum(jnp.where(again, state.step - 1, 0), dtype=jnp.int32)
  return state._replace(tokens=clear(state.tokens, pad_id), logprobs=clear(state.logprobs, 0),
                        mask=clear(state.mask, 0), versions=clear(state.versions, 0),
                        step=jnp.where(again, 1, state.step), drawn=state.drawn - dropped)


def fits(state: EngineState, slots: int) -> jax.Array:
  """bool[]: every shard's rows left (seated, or queued and not yet seated) fit in `slots`."""
  rows, d, _ = _sizes(state)
  seated = jnp.sum((state.row < rows).reshape(d, -1), axis=1, dtype=jnp.int32)
  return jnp.all(seated + state.queued - state.taken <= slots // d)


def _take_slots(x: jax.Array, order: jax.Array, axis: int) -> jax.Array:
  """x [..., S, ...] (slots on `axis`) at the shard-local slots order i32[D, S'/D] -> [..., S',
  ...]: each shard's slots gathered within the shard."""
  d = order.shape[0]
  # Moved as bits: a compiler without 16-bit float arithmetic (XLA:CPU) would otherwise gather
  # a bfloat16 cache through a float32 copy of it.
  bits = {2: jnp.uint16, 4: jnp.uint32}.get(x.dtype.itemsize) if jnp.issubdtype(
      x.dtype, jnp.floating) else None
  moved = x if bits is None else jax.lax.bitcast_convert_type(x, bits)
  blocks = moved.reshape(x.shape[:axis] + (d, -1) + x.shape[axis + 1:])
  out = jax.vmap(lambda b, i: jnp.take(b, i, axis=axis), in_axes=(axis, 0), out_axes=axis)(
      blocks, order)
  out = out.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 1:])
  return out if bits is None else jax.lax.bitcast_convert_type(out, x.dtype)


def on_slots(state: EngineState, fn, scanned: bool) -> EngineState:
  """The state with fn(x, axis, fill) applied to each of its slot arrays (rows, steps,
  completion keys and values; `fill` marks a free slot's value)."""
  rows = state.tokens.shape[0]
  cache = state.cache
  if isinstance(cache, pages.PagedCache):  # the pages stay; the slots' tables move
    cache = cache._replace(table=fn(cache.table, 0, 0))
  else:
    layer = lambda arrays: (fn(arrays, 1, 0) if scanned else tuple(fn(a, 0, 0) for a in arrays))
    cache = cache._replace(k=layer(cache.k), v=layer(cache.v))
  return state._replace(row=fn(state.row, 0, rows), step=fn(state.step, 0, 0), cache=cache)


def compact(state: EngineState, slots: int, scanned: bool) -> EngineState:
  """The state on `slots` slots: each shard's occupied slots first (`fits` must hold, so none
  is dropped)."""
  rows, d, _ = _sizes(state)
  free = (state.row >= rows).reshape(d, -1)
  order = jnp.argsort(free, axis=1, stable=True)[:, :slots // d].astype(jnp.int32)
  return on_slots(state, lambda x, axis, fill: _take_slots(x, order, axis), scanned)


# The fields laid out by rows or slots over the mesh's batch axes (the cache has its own axis).
_BY_ROWS = ("tokens", "logprobs", "mask", "versions", "limit", "done", "row", "step", "queue",
            "queued", "taken", "queue_end")


def constrain(state: EngineState, mesh) -> EngineState:
  """The state's row and slot arrays and cache over the mesh's batch axes (None: unchanged)."""
  if mesh is None:
    return state
  if isinstance(state.cache, pages.PagedCache):  # pages on axis 1 (KV heads over tensor), the
    # rest by shard or slot
    rest = {f: getattr(state.cache, f) for f in ("table", "prompts", "free", "count")}
    pool = state.cache.pool
    pool = jax.lax.with_sharding_constraint(pool, mesh_lib.pool_sharding(mesh, pool.shape))
    cache = state.cache._replace(pool=pool, **mesh_lib.constrain_rows(rest, mesh))
  else:
    scanned = not isinstance(state.cache.k, (tuple, list))
    cache = mesh_lib.constrain_rows(state.cache, mesh, 1 if scanned else 0)
  fields = _BY_ROWS + tuple(f for f in ("forced", "resume", "tables")
                            if getattr(state, f) is not None)
  by_rows = mesh_lib.constrain_rows({f: getattr(state, f) for f in fields}, mesh)
  return state._replace(cache=cache, **by_rows)


def pending(state: EngineState, generation: jax.Array) -> jax.Array:
  """bool[]: a row of generation `generation` has not stopped (queued, seated or evicted)."""
  _, shards, generations = _sizes(state)
  return jnp.any(~take_block(state.done, generation, generations, shards))
