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
         `prompt_prefill`), each active row's first token drawn from its prompt's prefill
         logits, the queue of the rows that go on, the first S of them in their slots
  run    EngineState -> EngineState, donated: `lax.while_loop` until every slot is empty; each
         iteration feeds every occupied slot's newest token through the model
         (`decoding.decode_slots`), draws its next token from the logits that come out,
         records it in its row's buffers, and refills the slots whose rows stopped from the queue
         (a refilled row's first token is already drawn, so refilling computes nothing)

A token is drawn in the iteration that computed its logits, so each records the version of the
weights that drew it (`run`'s `version`; a first token the version that prefilled its prompt),
even when a row's decoding spans calls with different weights (`inflight`), and the state between
two calls holds no logits: only tokens, the key/value cache and counters (`slots.EngineState`).

Shrinking (`shrink` = k > 0): once the queue has run dry the occupied slots thin out while the
longest rows finish, and a fixed-size loop would keep computing every slot. `run` then halves its
slots up to k times: a stage of S' slots ends when every row left (seated or queued) fits in
S' / 2, its occupied slots are moved to the front (rows, steps and their completion keys and
values, shard by shard) and the next stage's loop decodes S' / 2 slots. The stages are one
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

from rl_curriculum.model import decoding
from rl_curriculum.model import paged_cache
from rl_curriculum.model import prefix_cache
from rl_curriculum.model import transformer
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import pages
from rl_curriculum.sampling import prompt_prefill
from rl_curriculum.sampling import slots as slots_lib
from rl_curriculum.sampling import strategies
from rl_curriculum.sampling.slots import EngineState
from rl_curriculum.types import Rollout

__all__ = ["ENGINES", "EngineState", "prefill_groups", "row_limits", "first_tokens",
           "engine_cache", "start",
           "stage_slots", "run", "Generation", "sample"]

# The rollout engines a run can use (config.rl.engine): `sampler` and this module.
ENGINES = ("static", "continuous")


def prefill_groups(graphdef, params, prompt_tokens: jax.Array, prompt_mask: jax.Array, *,
                   group: int, mesh=None, chunk: int = 0):
  """(f32[P, V] first-token logits, KVCache, bool[P, Tp'] mask) of the P = R / group prompts of
  rows i32[R, Tp] (runs of `group` equal prompts), each prefilled once, in chunks
  (`prompt_prefill.prefill_prompts`)."""
  r = prompt_tokens.shape[0]
  layout = mesh_lib.row_layout(mesh)
  first = lambda x: x.reshape((r // group, group) + x.shape[1:])[:, 0]
  firsts = mesh_lib.constrain_rows((first(prompt_tokens), first(prompt_mask.astype(bool))), mesh)
  return prompt_prefill.prefill_prompts(graphdef, params, *firsts, chunk=chunk, constrain=layout)


def row_limits(rows: int, max_new_tokens: int, stop_after=None) -> jax.Array:
  """i32[rows] tokens each row may record: `stop_after`, or max_new_tokens when None."""
  if stop_after is None:
    return jnp.full((rows,), max_new_tokens, jnp.int32)
  return jnp.asarray(stop_after, jnp.int32)


def first_tokens(prompt_logits: jax.Array, key: jax.Array, version: jax.Array, *, group: int,
                 temperature, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
                 mesh=None) -> slots_lib.FirstTokens:
  """Each row's first token and its log-prob (`strategies.draw_tokens`) from its prompt's
  prefill logits f32[P, V]: row r = p * group + g with fold_in(fold_in(key, r), 0), as every
  later token of the row is drawn (`slots.slot_keys`)."""
  logits = mesh_lib.constrain_rows(jnp.repeat(prompt_logits, group, axis=0), mesh)
  rows = jnp.arange(logits.shape[0], dtype=jnp.int32)
  token, logprob = strategies.draw_tokens(
      logits, strategies.row_keys(key, rows, jnp.zeros((), jnp.int32)), temperature=temperature,
      top_k=top_k, top_p=top_p, greedy=greedy)
  return slots_lib.FirstTokens(token=token, logprob=logprob,
                               version=jnp.asarray(version, jnp.int32))


def engine_cache(config, prompts, mask, *, slots, max_new_tokens, page_size=0, kv_pages=0,
                 shards=1):
  """The engine's cache around prefilled prompts (a `kv_cache.KVCache` of P prompts, mask
  bool[P, Tp']): a `prefix_cache.PrefixCache` with N completion slots for each decode slot, or
  with `page_size` > 0 a `pages.PagedCache` of `kv_pages` completion pages (0: as many as every
  slot running to N needs) with the prompts in their pages."""
  if not page_size:
    return prefix_cache.from_prompts(
        prompts, prefix_cache.init_completions(config, slots, max_new_tokens))
  cache = pages.init(config, prompts=mask.shape[0], width=mask.shape[1], slots=slots,
                     max_new_tokens=max_new_tokens, page_size=page_size, pages=kv_pages,
                     shards=shards)
  return pages.write_prompts(cache, prompts, mask, 0)


@functools.partial(jax.jit, static_argnums=(0,),
                   static_argnames=("max_new_tokens", "slots", "top_k", "top_p", "greedy",
                                    "stop_ids", "pad_id", "group", "mesh", "chunk", "page_size",
                                    "kv_pages"))
def start(graphdef, params, prompt_tokens, prompt_mask, key, temperature, active=None,
          stop_after=None, *, max_new_tokens, slots, top_k=0, top_p=1.0, greedy=False,
          stop_ids=(), pad_id=0, group=1, mesh=None, chunk=0, page_size=0, kv_pages=0):
  """The first device program: the rows' prompts (i32[R, Tp] left-padded, runs of `group`
  equal prompts; mask bool[R, Tp]) prefilled once per group into a PrefixCache with `slots`
  decode slots, each active row's first token drawn at `temperature` (f32[], traced), and the
  first rows that go on seated. `active` (bool[R], None = all) and `stop_after` (i32[R] in
  [1, max_new_tokens], None = max_new_tokens) as in `sample`; `page_size` > 0 pages the cache
  (`engine_cache`). Jitted; everything after the
  arrays is static (stop_ids a sorted tuple of ints)."""
  r, _ = prompt_tokens.shape
  shards = 1 if mesh is None else mesh_lib.batch_size_of(mesh)
  logits, prompts, mask = prefill_groups(graphdef, params, prompt_tokens, prompt_mask,
                                         group=group, mesh=mesh, chunk=chunk)
  config = transformer.merge_params(graphdef, params).config
  cache = engine_cache(config, prompts, mask, slots=slots, max_new_tokens=max_new_tokens,
                       page_size=page_size, kv_pages=kv_pages, shards=shards)
  state = slots_lib.empty(cache, mask, jnp.stack([key]), rows=r, slots=slots,
                          max_new_tokens=max_new_tokens, shards=shards, pad_id=pad_id)
  active = jnp.ones((r,), bool) if active is None else jnp.asarray(active, bool)
  first = first_tokens(logits, key, jnp.zeros((), jnp.int32), group=group,
                       temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                       mesh=mesh)
  state = slots_lib.enqueue(state, active, jnp.zeros((), jnp.int32),
                            row_limits(r, max_new_tokens, stop_after), first,
                            jnp.asarray(stop_ids, jnp.int32), pad_id)
  state = slots_lib.seat(state, jnp.zeros((slots,), bool), group)
  return slots_lib.constrain(state, mesh)


def stage_slots(slots: int, shards: int, shrink: int) -> Tuple[int, ...]:
  """The decode slots of each stage of `run`: `slots` halved up to `shrink` times while the
  slots per shard are even (e.g. 64 slots, 1 shard, shrink 3: (64, 32, 16, 8))."""
  sizes = [slots]
  while len(sizes) <= shrink and (sizes[-1] // shards) % 2 == 0:
    sizes.append(sizes[-1] // 2)
  return tuple(sizes)


def _advance(s: EngineState, graphdef, params, temperature, version, *, stop, pad_id, group,
             draw, layout, per_shard=None) -> EngineState:
  """One loop iteration: every occupied slot's newest token fed through the model, its next
  token drawn from the logits that come out and recorded (with `version`), the slots whose rows
  stopped refilled from the queue. A paged cache first gives the slots whose token starts a page
  a page (restarting rows if it must: `pages.make_room`) and takes the stopped rows' pages back."""
  rows, shards = s.tokens.shape[0], s.queue.shape[0]
  live = s.row < rows
  prompts = slots_lib.slot_prompts(s.row, shards, rows, group)
  lengths = slots_lib.prompt_lengths(s, prompts)
  paged = isinstance(s.cache, pages.PagedCache)
  if paged:
    cache, restart = pages.make_room(s.cache, live, lengths, jnp.maximum(s.step - 1, 0))
    s = slots_lib.restart(s._replace(cache=cache), restart, pad_id)
  fed = jnp.maximum(s.step - 1, 0)  # the completion slot of the token fed
  if paged:
    index = paged_cache.PageIndex(
        table=s.cache.table.reshape((shards, -1) + s.cache.table.shape[1:]),
        length=jnp.where(live, lengths + fed + 1, 0).reshape(shards, -1), shard=per_shard)
    logits, pool = decoding.decode_pages(graphdef, params, slots_lib.pending_tokens(s, pad_id),
                                         lengths + fed, s.cache.pool, index, constrain=layout)
    cache = s.cache._replace(pool=pool)
  else:
    logits, cache = decoding.decode_slots(
        graphdef, params, slots_lib.pending_tokens(s, pad_id), lengths + fed, s.prompt_mask,
        s.cache, prefix_cache.SlotIndex(prompt=prompts, step=fed), constrain=layout)
  token, logprob = strategies.draw_tokens(logits, slots_lib.slot_keys(s),
                                          temperature=temperature, **draw)
  token = jnp.where(live, token, pad_id)
  forced, observed = slots_lib.forced_tokens(s, pad_id)
  token = jnp.where(forced, observed, token)
  limit = jnp.take(s.limit, jnp.minimum(s.row, rows - 1))
  stops = ((jnp.any(token[:, None] == stop[None, :], axis=-1) & ~forced)
           | (s.step + 1 >= limit))
  s = slots_lib.record(s._replace(cache=cache), token, logprob, version, stops,
                       None if s.forced is None else forced)
  if s.tables is not None:  # a row's turn ended: it keeps its pages for the next turn
    s = slots_lib.keep_tables(s, live & stops)
  elif paged:
    s = s._replace(cache=pages.stop(s.cache, live & stops, lengths, lengths + fed + 1))
  s = s._replace(iterations=s.iterations + 1, slot_steps=s.slot_steps + s.row.shape[0])
  return slots_lib.seat(s, live & ~stops, group)


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
  version = jnp.zeros((), jnp.int32) if version is None else jnp.asarray(version, jnp.int32)
  config = transformer.merge_params(graphdef, params).config
  scanned = config.scan_layers
  params = mesh_lib.gathered_vocab_weights(params, mesh, config.dtype)  # once for every stage
  layout = mesh_lib.row_layout(mesh)
  advance = functools.partial(
      _advance, graphdef=graphdef, params=params, temperature=temperature, version=version,
      stop=jnp.asarray(stop_ids, jnp.int32), pad_id=pad_id, group=group,
      draw=dict(top_k=top_k, top_p=top_p, greedy=greedy), layout=layout,
      per_shard=mesh_lib.per_shard(mesh))
  first_iteration = state.iterations

  def going(s):
    go = jnp.any(s.row < rows)
    if budget is not None:
      go = go & ((budget <= 0) | (s.iterations - first_iteration < budget))
    if due is not None:
      go = go & ((due < 0) | slots_lib.pending(s, due))
    if fed:  # some shard has a free slot and nothing queued for it
      free = jnp.any((s.row >= rows).reshape(shards, -1), axis=1)
      go = go & ~jnp.any(free & (s.queued <= s.taken))
    return go

  state = slots_lib.seat(state, state.row < rows, group)  # rows queued since the last call
  place = lambda s: s if mesh is None else slots_lib.on_slots(
      s, lambda x, axis, fill: mesh_lib.constrain_rows(x, mesh, axis), scanned)
  sizes = stage_slots(state.row.shape[0], shards, shrink)
  for smaller in sizes[1:]:
    state = jax.lax.while_loop(lambda s, n=smaller: going(s) & ~slots_lib.fits(s, n), advance,
                               state)
    state = place(slots_lib.compact(state, smaller, scanned))
  state = jax.lax.while_loop(going, advance, state)
  if len(sizes) == 1:
    return state
  # Every slot is free now: the state goes back to the first stage's shapes (so that its
  # buffers are donated) holding the free slots' values.
  def free(x, axis, fill):
    return jnp.full(x.shape[:axis] + (sizes[0],) + x.shape[axis + 1:], fill, x.dtype)
  return place(slots_lib.on_slots(state, free, scanned))


class Generation(NamedTuple):
  """A call's rollout and its cost in slot-steps (each loop iteration: its stage's slots)."""
  rollout: Rollout
  slot_steps: jax.Array  # i32[]


def sample(graphdef: nnx.GraphDef, params: transformer.Params, prompt_tokens: jax.Array,
           prompt_mask: jax.Array, key: jax.Array, *, max_new_tokens: int, eos_id: int,
           slots: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           greedy: bool = False, stop_ids: Sequence[int] = (), pad_id: int = 0, group: int = 1,
           mesh=None, active: Optional[jax.Array] = None, stop_after: Optional[jax.Array] = None,
           prefill_chunk: int = 0, shrink: int = 0, page_size: int = 0,
           kv_pages: int = 0) -> Generation:
  """Samples up to `max_new_tokens` tokens after each left-padded prompt with `slots` decode
  slots, halved up to `shrink` times as the rows run out (`stage_slots`), over a paged cache
  when `page_size` > 0 (`engine_cache`); arguments and the
  returned rollout as in `sampler.sample` (whose tokens, log-probs and mask it reproduces,
  log-probs to float rounding; module docstring), plus the call's slot-steps.

  Raises:
    ValueError: slots not a positive multiple of the mesh's batch shards, groups that do not
      split over them, shrink, page_size or kv_pages not an int >= 0, too few kv_pages
      (`pages.layout`), or a bad argument of `sampler.sample`.
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
  for name, value in (("page_size", page_size), ("kv_pages", kv_pages)):
    if not isinstance(value, int) or value < 0:
      raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
  stop = tuple(sorted({int(eos_id), *(int(s) for s in stop_ids)}))
  prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
  temperature = jnp.asarray(temperature, jnp.float32)
  draw = dict(top_k=top_k, top_p=float(top_p), greedy=bool(greedy), stop_ids=stop,
              pad_id=int(pad_id), group=group, mesh=mesh)
  state = start(graphdef, params, prompt_tokens, prompt_mask, key, temperature, active,
                stop_after, max_new_tokens=max_new_tokens, slots=slots, chunk=int(prefill_chunk),
                page_size=page_size, kv_pages=kv_pages, **draw)
  state = run(graphdef, params, state, temperature, shrink=shrink, **draw)
  rollout = Rollout(prompt_tokens=prompt_tokens, tokens=state.tokens, logprobs=state.logprobs,
                    mask=state.mask)
  return Generation(rollout=rollout, slot_steps=state.slot_steps)
