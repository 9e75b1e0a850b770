"""Continuous batching: a fixed number of decode slots fed from a queue of rows.

The static sampler (`sampler`) gives each of the R rows of a call a decode row until the longest
completion of the call ends, and stores each prompt's keys and values once per row. This engine
decodes with S slots (S may be fewer than R): when a row stops, its slot takes the next queued
row in the same loop iteration, so a slot idles only once the queue is empty. Each prompt's keys
and values are stored once (`prefix_cache.PrefixCache`): P x Tp prompt slots plus S x N
completion slots instead of R x (Tp + N). Rows that are not `active` (GRESO's skipped prompts, a
rollout allocation's unused slots) are never queued and cost no decode step.

Two device programs, each compiled once per shape and cached by `jax.jit`:

  start  prompts i32[R, Tp] -> EngineState: each group's prompt prefilled once (in chunks:
         `prompt_prefill`), the queue of active rows, the first S rows in their slots
  run    EngineState -> EngineState, donated: `lax.while_loop` until every slot is empty; each
         iteration draws a token for every occupied slot, records it in its row's buffers,
         feeds the slots whose rows go on through the model (`transformer.decode_slots`) and
         refills the slots whose rows stopped from the queue (a refilled slot starts from its
         prompt's prefill logits, so refilling computes nothing)

Shrinking (`shrink` = k > 0): once the queue has run dry the occupied slots thin out while the
longest rows finish, and a fixed-size loop would keep computing every slot. `run` then halves its
slots up to k times: a stage of S' slots ends when every row left (seated or queued) fits in
S' / 2, its occupied slots are moved to the front (rows, steps, logits and their completion keys
and values, shard by shard) and the next stage's loop decodes S' / 2 slots. The stages are one
program with k + 1 loops of decreasing batch, as an inference server pads its batch to a few
sizes rather than one; a stage stops halving once its slots per shard are odd. On long-tailed
completions (log-normal lengths, sigma 1.2) the share of computed slot-steps that carry a kept
token goes from 0.72-0.79 at k = 0 to 0.95-0.97 at k = 3 (benchmarks/results/rollout_engine.md).

Results do not depend on where a row ran: row r's t-th token is drawn with
fold_in(fold_in(key, r), t) (`strategies.row_keys`), as in the static sampler, and each slot's
attention reads its prompt's slots and its own completion slots (`prefix_cache.attend`). Tokens and
masks are the static sampler's; log-probs agree to float rounding (about 1e-6), since XLA's CPU
compiler picks kernels by batch size (the one-query attention's reductions at 1-3 rows, the tied
output head at one row, wider matmuls below 48 rows) and the prompt and completion slots are read
as two parts.

With a mesh, rows, prompts and slots are split into D = `mesh_lib.batch_size_of(mesh)` equal
shards over the batch axes, and each shard's slots take only its own rows: the queue, the prompt
gathers and the row writes are per shard (a leading [D, ...] axis), so no step moves a cache
between devices. S and the number of groups must divide by D.

Shapes: R rows (P prompts x G), S slots, D shards, Tp prompt slots, N = max_new_tokens, V vocab.
"""

import functools
from typing import NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl_curriculum.model import prefix_cache
from rl_curriculum.model import transformer
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import prompt_prefill
from rl_curriculum.sampling import strategies
from rl_curriculum.types import Rollout

# The rollout engines a run can use (config.rl.engine): `sampler` and this module.
ENGINES = ("static", "continuous")


class EngineState(NamedTuple):
  """What the decode loop carries (donated to `run`); rows are global indices, R = empty slot.

  The R rows are W generations of R/W (`inflight`: the batches of W steps in flight; W = 1 for
  one call of `sample`), laid out shard by shard: shard d holds rows [d R/D, (d + 1) R/D), and
  within it generation w holds the block [w R/(W D), (w + 1) R/(W D)) (prompts likewise, by P).
  """
  tokens: jax.Array         # i32[R, N] completion buffers (pad_id where nothing was recorded)
  logprobs: jax.Array       # f32[R, N]
  mask: jax.Array           # f32[R, N] 1 on recorded tokens
  versions: jax.Array       # i32[R, N] policy version (`run`'s `version`) that drew each token
  limit: jax.Array          # i32[R] tokens a row may record (N, or `stop_after`)
  done: jax.Array           # bool[R] stopped, or never queued (not active)
  row: jax.Array            # i32[S] the row in each slot, R when the slot is empty
  step: jax.Array           # i32[S] tokens the slot's row has recorded
  logits: jax.Array         # f32[S, V] each slot's next-token logits
  cache: prefix_cache.PrefixCache
  prompt_mask: jax.Array    # bool[P, Tp'] real tokens of the prompts' slots
  prompt_logits: jax.Array  # f32[P, V] each prompt's first-token logits
  queue: jax.Array          # i32[D, R/D] each shard's queued rows (local index), a first-in
                            # first-out ring: position q holds the q-th row ever queued, mod R/D
  queued: jax.Array         # i32[D] rows ever queued per shard
  taken: jax.Array          # i32[D] of them given a slot (or passed over by `inflight.evict`)
  queue_end: jax.Array      # i32[D, W] `queued` once each generation's rows were queued
  iterations: jax.Array     # i32[] loop iterations run
  slot_steps: jax.Array     # i32[] slot-steps computed (each iteration: the slots of its stage)
  drawn: jax.Array          # i32[] tokens recorded
  keys: jax.Array           # [W] each generation's key (row r's t-th token: fold_in(fold_in(
                            # key, r), t), r its index in its generation's batch)


def _shards(x: jax.Array, d: int) -> jax.Array:
  """[n, ...] as [d, n / d, ...] (each shard's block)."""
  return x.reshape((d, -1) + x.shape[1:])


def _slot_prompts(row: jax.Array, shards: int, rows: int, group: int) -> jax.Array:
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


def _slot_keys(state: EngineState) -> jax.Array:
  """One key per slot for its row's next token: fold_in(fold_in(generation key, batch index),
  step), as `strategies.row_keys` gives a row of a single call."""
  rows, shards = state.tokens.shape[0], state.queue.shape[0]
  generation, index = generation_parts(state.row, rows, shards, state.keys.shape[0])
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


def _refill(free: jax.Array, state: EngineState, rows: int):
  """(row i32[S], refilled bool[S], taken i32[D]): each free slot given its shard's next queued
  row, in slot order, while the shard's queue lasts; R where none is left."""
  d, per_shard = state.queue.shape
  free = free.reshape(d, -1)
  position = state.taken[:, None] + jnp.cumsum(free, axis=1, dtype=jnp.int32) - 1
  refilled = free & (position < state.queued[:, None])
  local = jnp.take_along_axis(state.queue, position % per_shard, axis=1)
  row = jnp.where(refilled, local + per_shard * jnp.arange(d, dtype=jnp.int32)[:, None], rows)
  taken = state.taken + jnp.sum(refilled, axis=1, dtype=jnp.int32)
  return row.reshape(-1), refilled.reshape(-1), taken


def _seat(state: EngineState, keep: jax.Array, logits: jax.Array, group: int) -> EngineState:
  """The state with the slots not in `keep` (bool[S]) refilled from the queue: a new row starts
  at step 0 from its prompt's prefill logits; slots left without a row hold R."""
  rows = state.tokens.shape[0]
  new_row, refilled, taken = _refill(~keep, state, rows)
  first = prefix_cache.gather(state.prompt_logits,
                      _slot_prompts(new_row, state.queue.shape[0], rows, group))
  return state._replace(row=jnp.where(keep, state.row, new_row),
                        step=jnp.where(keep, state.step, 0),
                        logits=jnp.where(refilled[:, None], first, logits), taken=taken)


def _write(buffer: jax.Array, row: jax.Array, step: Optional[jax.Array], value: jax.Array,
           shards: int):
  """buffer [R, N] with value[s] at (row[s], step[s]) for the occupied slots (buffer [R] and
  step None: at row[s]), shard by shard."""
  per_shard = buffer.shape[0] // shards
  local = jnp.where(row < buffer.shape[0], row % per_shard, per_shard).reshape(shards, -1)
  by_shard = lambda x: x.reshape(shards, -1)
  if step is None:
    out = jax.vmap(lambda b, r, v: b.at[r].set(v, mode="drop"))(
        _shards(buffer, shards), local, by_shard(value))
  else:
    out = jax.vmap(lambda b, r, t, v: b.at[r, t].set(v, mode="drop"))(
        _shards(buffer, shards), local, by_shard(step), by_shard(value))
  return out.reshape(buffer.shape)


def enqueue(state: EngineState, active: jax.Array, generation: jax.Array, limit: jax.Array,
            pad_id: int) -> EngineState:
  """The state with generation `generation`'s rows reset (pad_id tokens, nothing recorded,
  `limit` i32[n] tokens each) and its `active` ones (bool[n], batch order) queued after every
  row queued before them; the others are done from the start."""
  d, per_shard = state.queue.shape
  per_generation = per_shard // state.keys.shape[0]
  by_shard = active.reshape(d, per_generation)
  order = jnp.argsort(~by_shard, axis=1, stable=True).astype(jnp.int32)
  count = jnp.sum(by_shard, axis=1, dtype=jnp.int32)
  m = jnp.arange(per_generation, dtype=jnp.int32)[None, :]
  position = jnp.where(m < count[:, None], (state.queued[:, None] + m) % per_shard, per_shard)
  queue = jax.vmap(lambda q, i, v: q.at[i].set(v, mode="drop"))(
      state.queue, position, generation * per_generation + order)
  queued = state.queued + count
  block = lambda table, new: put_block(table, new, generation, d)
  fill = lambda x, value: jnp.full((active.shape[0],) + x.shape[1:], value, x.dtype)
  return state._replace(
      tokens=block(state.tokens, fill(state.tokens, pad_id)),
      logprobs=block(state.logprobs, fill(state.logprobs, 0)),
      mask=block(state.mask, fill(state.mask, 0)),
      versions=block(state.versions, fill(state.versions, 0)),
      limit=block(state.limit, limit), done=block(state.done, ~active), queue=queue,
      queued=queued, queue_end=state.queue_end.at[:, generation].set(queued))


def empty(cache: prefix_cache.PrefixCache, prompt_mask: jax.Array, prompt_logits: jax.Array,
          keys: jax.Array, *, rows: int, slots: int, max_new_tokens: int, shards: int,
          pad_id: int) -> EngineState:
  """An engine of `rows` rows (W = len(keys) generations; every row done, none queued) and
  `slots` empty slots around a prompt cache, its mask and its prompts' first-token logits."""
  n, w = max_new_tokens, keys.shape[0]
  return EngineState(
      tokens=jnp.full((rows, n), pad_id, jnp.int32), logprobs=jnp.zeros((rows, n), jnp.float32),
      mask=jnp.zeros((rows, n), jnp.float32), versions=jnp.zeros((rows, n), jnp.int32),
      limit=jnp.full((rows,), n, jnp.int32), done=jnp.ones((rows,), bool),
      row=jnp.full((slots,), rows, jnp.int32), step=jnp.zeros((slots,), jnp.int32),
      logits=jnp.zeros((slots, prompt_logits.shape[-1]), jnp.float32), cache=cache,
      prompt_mask=prompt_mask, prompt_logits=prompt_logits,
      queue=jnp.zeros((shards, rows // shards), jnp.int32),
      queued=jnp.zeros((shards,), jnp.int32), taken=jnp.zeros((shards,), jnp.int32),
      queue_end=jnp.zeros((shards, w), jnp.int32), iterations=jnp.zeros((), jnp.int32),
      slot_steps=jnp.zeros((), jnp.int32), drawn=jnp.zeros((), jnp.int32), keys=keys)


# The fields laid out by rows or slots over the mesh's batch axes (the cache has its own axis).
_BY_ROWS = ("tokens", "logprobs", "mask", "versions", "limit", "done", "row", "step", "logits",
            "queue", "queued", "taken", "queue_end")


def constrain(state: EngineState, mesh) -> EngineState:
  """The state's row and slot arrays and cache over the mesh's batch axes (None: unchanged)."""
  if mesh is None:
    return state
  scanned = not isinstance(state.cache.k, (tuple, list))
  cache = mesh_lib.constrain_rows(state.cache, mesh, 1 if scanned else 0)
  by_rows = mesh_lib.constrain_rows({f: getattr(state, f) for f in _BY_ROWS}, mesh)
  return state._replace(cache=cache, **by_rows)


def prefill_groups(graphdef, params, prompt_tokens: jax.Array, prompt_mask: jax.Array, *,
                   group: int, mesh=None, chunk: int = 0):
  """(f32[P, V] first-token logits, KVCache, bool[P, Tp'] mask) of the P = R / group prompts of
  rows i32[R, Tp] (runs of `group` equal prompts), each prefilled once, in chunks
  (`prompt_prefill.prefill_prompts`)."""
  r = prompt_tokens.shape[0]
  layout = None if mesh is None else (lambda tree, axis=0: mesh_lib.constrain_rows(tree, mesh,
                                                                                   axis))
  first = lambda x: x.reshape((r // group, group) + x.shape[1:])[:, 0]
  firsts = mesh_lib.constrain_rows((first(prompt_tokens), first(prompt_mask.astype(bool))), mesh)
  return prompt_prefill.prefill_prompts(graphdef, params, *firsts, chunk=chunk, constrain=layout)


def row_limits(rows: int, max_new_tokens: int, stop_after=None) -> jax.Array:
  """i32[rows] tokens each row may record: `stop_after`, or max_new_tokens when None."""
  if stop_after is None:
    return jnp.full((rows,), max_new_tokens, jnp.int32)
  return jnp.asarray(stop_after, jnp.int32)


@functools.partial(jax.jit, static_argnums=(0,),
                   static_argnames=("max_new_tokens", "slots", "pad_id", "group", "mesh",
                                    "chunk"))
def start(graphdef, params, prompt_tokens, prompt_mask, key, active=None, stop_after=None, *,
          max_new_tokens, slots, pad_id=0, group=1, mesh=None, chunk=0):
  """The first device program: the rows' prompts (i32[R, Tp] left-padded, runs of `group`
  equal prompts; mask bool[R, Tp]) prefilled once per group into a PrefixCache with `slots`
  decode slots, and the first rows seated. `active` (bool[R], None = all) and `stop_after`
  (i32[R] in [1, max_new_tokens], None = max_new_tokens) as in `sample`. Jitted; everything
  after the arrays is static."""
  r, _ = prompt_tokens.shape
  shards = 1 if mesh is None else mesh_lib.batch_size_of(mesh)
  logits, prompts, mask = prefill_groups(graphdef, params, prompt_tokens, prompt_mask,
                                         group=group, mesh=mesh, chunk=chunk)
  config = transformer.merge_params(graphdef, params).config
  cache = prefix_cache.from_prompts(
      prompts, prefix_cache.init_completions(config, slots, max_new_tokens))
  state = empty(cache, mask, logits, jnp.stack([key]), rows=r, slots=slots,
                max_new_tokens=max_new_tokens, shards=shards, pad_id=pad_id)
  active = jnp.ones((r,), bool) if active is None else jnp.asarray(active, bool)
  state = enqueue(state, active, jnp.zeros((), jnp.int32),
                  row_limits(r, max_new_tokens, stop_after), pad_id)
  state = _seat(state, jnp.zeros((slots,), bool), state.logits, group)
  return constrain(state, mesh)


def stage_slots(slots: int, shards: int, shrink: int) -> Tuple[int, ...]:
  """The decode slots of each stage of `run`: `slots` halved up to `shrink` times while the
  slots per shard are even (e.g. 64 slots, 1 shard, shrink 3: (64, 32, 16, 8))."""
  sizes = [slots]
  while len(sizes) <= shrink and (sizes[-1] // shards) % 2 == 0:
    sizes.append(sizes[-1] // 2)
  return tuple(sizes)


def _fits(state: EngineState, rows: int, slots: int) -> jax.Array:
  """bool[]: every shard's rows left (seated, or queued and not yet seated) fit in `slots`."""
  d = state.queue.shape[0]
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


def _on_slots(state: EngineState, fn, scanned: bool) -> EngineState:
  """The state with fn(x, axis, fill) applied to each of its slot arrays (rows, steps, logits,
  completion keys and values; `fill` marks a free slot's value)."""
  rows = state.tokens.shape[0]
  cache = state.cache
  layer = lambda arrays: (fn(arrays, 1, 0) if scanned else tuple(fn(a, 0, 0) for a in arrays))
  return state._replace(row=fn(state.row, 0, rows), step=fn(state.step, 0, 0),
                        logits=fn(state.logits, 0, 0),
                        cache=cache._replace(k=layer(cache.k), v=layer(cache.v)))


def _compact(state: EngineState, slots: int, scanned: bool) -> EngineState:
  """The state on `slots` slots: each shard's occupied slots first (`_fits` must hold, so none
  is dropped)."""
  d, rows = state.queue.shape[0], state.tokens.shape[0]
  free = (state.row >= rows).reshape(d, -1)
  order = jnp.argsort(free, axis=1, stable=True)[:, :slots // d].astype(jnp.int32)
  return _on_slots(state, lambda x, axis, fill: _take_slots(x, order, axis), scanned)


def pending(state: EngineState, generation: jax.Array) -> jax.Array:
  """bool[]: a row of generation `generation` has not stopped (queued, seated or evicted)."""
  shards, generations = state.queue.shape[0], state.keys.shape[0]
  return jnp.any(~take_block(state.done, generation, generations, shards))


@functools.partial(
    jax.jit, static_argnums=(0,),
    static_argnames=("top_k", "top_p", "greedy", "stop_ids", "pad_id", "group", "mesh",
                     "shrink", "fed"),
    donate_argnames=("state",))
def run(graphdef, params, state, temperature, version=None, budget=None, due=None, *, top_k=0,
        top_p=1.0, greedy=False, stop_ids=(), pad_id=0, group=1, mesh=None, shrink=0,
        fed=False):
  """The second device program: seats queued rows in the free slots, then decodes until every
  queued row has stopped, halving its slots up to `shrink` times as the rows run out (module
  docstring); returns the final state (`state.slot_steps` slot-steps computed in
  `state.iterations` loop iterations), of the input's shapes.

  Traced: temperature f32[]; version i32[] (recorded with every token drawn; None: 0); budget
  i32[] (stop after this many loop iterations, 0: no limit; None: no limit) and due i32[] (stop
  once generation `due` has no row left, -1: no such condition; None: none), for the rollouts
  in flight across steps (`inflight`). With `fed`, the loop also stops once a slot is free with
  no queued row to take it (every iteration it runs keeps every slot busy; the rows left go on
  at the next call). The keyword arguments are static (stop_ids a sorted tuple of ints).

  Raises:
    ValueError: shrink > 0 with a budget, a due generation or `fed` (halving the slots needs a
      call that runs until every row has stopped).
  """
  if shrink and (budget is not None or due is not None or fed):
    raise ValueError("shrink > 0 needs a run until every row stops: no budget, no due "
                     "generation, not fed")
  rows, shards = state.tokens.shape[0], state.queue.shape[0]
  stop = jnp.asarray(stop_ids, jnp.int32)
  version = jnp.zeros((), jnp.int32) if version is None else jnp.asarray(version, jnp.int32)
  config = transformer.merge_params(graphdef, params).config
  scanned = config.scan_layers
  params = mesh_lib.gathered_vocab_weights(params, mesh, config.dtype)  # once for every stage
  layout = None if mesh is None else (lambda tree, axis=0: mesh_lib.constrain_rows(tree, mesh,
                                                                                   axis))

  def advance(s):
    live = s.row < rows
    token, logprob = strategies.draw_tokens(s.logits, _slot_keys(s), temperature=temperature,
                                            top_k=top_k, top_p=top_p, greedy=greedy)
    token = jnp.where(live, token, pad_id)
    limit = jnp.take(s.limit, jnp.minimum(s.row, rows - 1))
    stops = jnp.any(token[:, None] == stop[None, :], axis=-1) | (s.step + 1 >= limit)
    go_on = live & ~stops
    s = s._replace(tokens=_write(s.tokens, s.row, s.step, token, shards),
                   logprobs=_write(s.logprobs, s.row, s.step, logprob, shards),
                   mask=_write(s.mask, s.row, s.step, jnp.ones_like(logprob), shards),
                   versions=_write(s.versions, s.row, s.step,
                                   jnp.broadcast_to(version, token.shape), shards),
                   done=_write(s.done, jnp.where(stops, s.row, rows), None,
                               jnp.ones(token.shape, bool), shards),
                   drawn=s.drawn + jnp.sum(live, dtype=jnp.int32))
    prompts = _slot_prompts(s.row, shards, rows, group)
    index = prefix_cache.SlotIndex(prompt=prompts, step=s.step)
    lengths = prefix_cache.gather(jnp.sum(s.prompt_mask, axis=1, dtype=jnp.int32), prompts)
    logits, cache = transformer.decode_slots(graphdef, params, token, lengths + s.step,
                                             s.prompt_mask, s.cache, index, constrain=layout)
    s = s._replace(cache=cache, step=s.step + 1, iterations=s.iterations + 1,
                   slot_steps=s.slot_steps + s.row.shape[0])
    return _seat(s, go_on, logits, group)

  first_iteration = state.iterations

  def going(s):
    go = jnp.any(s.row < rows)
    if budget is not None:
      go = go & ((budget <= 0) | (s.iterations - first_iteration < budget))
    if due is not None:
      go = go & ((due < 0) | pending(s, due))
    if fed:  # some shard has a free slot and nothing queued for it
      free = jnp.any((s.row >= rows).reshape(shards, -1), axis=1)
      go = go & ~jnp.any(free & (s.queued <= s.taken))
    return go

  state = _seat(state, state.row < rows, state.logits, group)  # rows queued since the last call
  place = lambda s: s if mesh is None else _on_slots(
      s, lambda x, axis, fill: mesh_lib.constrain_rows(x, mesh, axis), scanned)
  sizes = stage_slots(state.row.shape[0], shards, shrink)
  for smaller in sizes[1:]:
    state = jax.lax.while_loop(lambda s, n=smaller: going(s) & ~_fits(s, rows, n), advance,
                               state)
    state = place(_compact(state, smaller, scanned))
  state = jax.lax.while_loop(going, advance, state)
  if len(sizes) == 1:
    return state
  # Every slot is free now: the state goes back to the first stage's shapes (so that its
  # buffers are donated) holding the free slots' values.
  def free(x, axis, fill):
    return jnp.full(x.shape[:axis] + (sizes[0],) + x.shape[axis + 1:], fill, x.dtype)
  return place(_on_slots(state, free, scanned))


class Generation(NamedTuple):
  """A call's rollout and its cost in slot-steps (each loop iteration: its stage's slots)."""
  rollout: Rollout
  slot_steps: jax.Array  # i32[]


def sample(graphdef: nnx.GraphDef, params: transformer.Params, prompt_tokens: jax.Array,
           prompt_mask: jax.Array, key: jax.Array, *, max_new_tokens: int, eos_id: int,
           slots: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           greedy: bool = False, stop_ids: Sequence[int] = (), pad_id: int = 0, group: int = 1,
           mesh=None, active: Optional[jax.Array] = None, stop_after: Optional[jax.Array] = None,
           prefill_chunk: int = 0, shrink: int = 0) -> Generation:
  """Samples up to `max_new_tokens` tokens after each left-padded prompt with `slots` decode
  slots, halved up to `shrink` times as the rows run out (`stage_slots`); arguments and the
  returned rollout as in `sampler.sample` (whose tokens, log-probs and mask it reproduces,
  log-probs to float rounding; module docstring), plus the call's slot-steps.

  Raises:
    ValueError: slots not a positive multiple of the mesh's batch shards, groups that do not
      split over them, shrink not an int >= 0, or a bad argument of `sampler.sample`.
  """
  rows = prompt_tokens.shape[0]
  shards = 1 if mesh is None else mesh_lib.batch_size_of(mesh)
  if not isinstance(slots, int) or slots < 1 or slots % shards:
    raise ValueError(f"slots must be a positive multiple of the mesh's {shards} batch shards, "
                     f"got {slots!r}.")
  if not isinstance(group, int) or group < 1 or rows % (group * shards):
    raise ValueError(f"the {rows} rows must split into groups of {group} over {shards} batch "
                     "shards.")
  if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}.")
  if not isinstance(shrink, int) or shrink < 0:
    raise ValueError(f"shrink must be an int >= 0 (0 = fixed slots), got {shrink!r}.")
  stop = tuple(sorted({int(eos_id), *(int(s) for s in stop_ids)}))
  prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
  state = start(graphdef, params, prompt_tokens, prompt_mask, key, active, stop_after,
                max_new_tokens=max_new_tokens, slots=slots, pad_id=int(pad_id), group=group,
                mesh=mesh, chunk=int(prefill_chunk))
  state = run(graphdef, params, state, jnp.asarray(temperature, jnp.float32), top_k=top_k,
              top_p=float(top_p), greedy=bool(greedy), stop_ids=stop, pad_id=int(pad_id),
              group=group, mesh=mesh, shrink=shrink)
  rollout = Rollout(prompt_tokens=prompt_tokens, tokens=state.tokens, logprobs=state.logprobs,
                    mask=state.mask)
  return Generation(rollout=rollout, slot_steps=state.slot_steps)


def compiled_programs():
  """Number of (start, run) programs compiled so far in this process (for tests)."""
  return start._cache_size(), run._cache_size()  # pylint: disable=protected-access
