"""Rollouts in flight across RL steps: W generations of rows in one continuous engine.

A call of `continuous.sample` decodes one batch of rows to the end. With rollouts overlapped with
learning (`train.rollout.pipeline`) the batches of W steps are in flight at once: each step queues one
more batch (a generation of rows) behind the others, decodes for a while with the newest weights,
and takes the oldest batch out once its rows have stopped. The engine state holds every
generation's rows, prompt keys and values and queue positions, so a row that has not stopped when
a step's decoding ends goes on in the next step, under the weights of that step (each token
records the version that drew it: `EngineState.versions`), from the keys and values it already
has:

  state = init(graphdef, params, rows=R, generations=W, prompt_len=Tp, slots=S, ...)
  state = admit(graphdef, params, state, prompts, mask, key, w, temperature, version, ...)
  state = continuous.run(graphdef, params, state, temperature, version, budget, due, ...)
  state = evict(state, w)                     # its unfinished rows leave the engine
  rows = harvest(state, w)                    # its tokens, log-probs, mask, versions, done

Generations are slots of a ring (step t's batch in generation t mod W). The queue is first in,
first out across generations, so the oldest generation's rows are always the first seated. A
generation's rows draw their tokens with its own key, row r's t-th token with fold_in(fold_in(key,
r), t) (r its index in the batch): the tokens do not depend on which slot, step or call a row
runs in, and the engine with W = 1 is `continuous.start` (same tokens and log-probs). Each token
records the version of the weights whose logits drew it: a row's first token that of `admit`'s
weights (they prefilled its prompt), every later one that of the `continuous.run` call that fed
the token before it.

Shapes: R rows a generation, W generations, S slots, D shards, Tp prompt slots, N new tokens.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.model import kv_cache
from rl_curriculum.model import prefix_cache
from rl_curriculum.model import transformer
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import pages
from rl_curriculum.sampling import prompt_prefill
from rl_curriculum.sampling import slots as slots_lib

__all__ = ["ADMISSIONS", "init", "abstract", "admit", "evict", "Harvest", "harvest", "pending"]

# What becomes of a batch whose rows have not all stopped when its step comes to learn from it:
# wait (decode on until they stop: `continuous.run` with it as `due`) or drop (`evict` them).
ADMISSIONS = ("wait", "drop")


def _shards(mesh) -> int:
  return 1 if mesh is None else mesh_lib.batch_size_of(mesh)


def _empty_options(graphdef, params, *, rows, generations, prompt_len, slots, max_new_tokens,
                   pad_id, group, mesh, chunk, page_size=0, kv_pages=0) -> dict:
  """`_empty`'s static arguments for an engine of these sizes (`params`: shapes suffice)."""
  return dict(config=transformer.merge_params(graphdef, params).config, rows=rows,
              generations=generations, width=prompt_prefill.padded_length(prompt_len, chunk),
              slots=slots, max_new_tokens=max_new_tokens, pad_id=pad_id, group=group, mesh=mesh,
              page_size=page_size, kv_pages=kv_pages)


def init(graphdef, params, key, *, rows, generations, prompt_len, slots, max_new_tokens,
         pad_id=0, group=1, mesh=None, chunk=0, page_size=0, kv_pages=0
         ) -> continuous.EngineState:
  """An engine for `generations` batches of `rows` rows (whole groups of `group`; prompts of
  `prompt_len` tokens, prefilled `chunk` positions at a time) on `slots` decode slots, every row
  done and nothing queued, laid out over `mesh`'s batch axes; `key` is every generation's until
  `admit` sets its own; `page_size` > 0 pages the cache (`continuous.engine_cache`). `params`
  give only the model's shapes (arrays or abstract)."""
  return _empty(key, **_empty_options(
      graphdef, params, rows=rows, generations=generations, prompt_len=prompt_len, slots=slots,
      max_new_tokens=max_new_tokens, pad_id=pad_id, group=group, mesh=mesh, chunk=chunk,
      page_size=page_size, kv_pages=kv_pages))


def abstract(graphdef, params, key, **sizes) -> continuous.EngineState:
  """`init`'s state as `jax.ShapeDtypeStruct`s carrying their shardings (for the memory planner:
  `key` may be abstract too); `sizes` are `init`'s keyword arguments."""
  options = _empty_options(graphdef, params, **{"pad_id": 0, "group": 1, "mesh": None,
                                                "chunk": 0, **sizes})
  shapes = jax.eval_shape(functools.partial(_empty, **options), key)
  shardings = _empty.lower(key, **options).compile().output_shardings
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                      shardings)


@functools.partial(jax.jit, static_argnames=("config", "rows", "generations", "width", "slots",
                                             "max_new_tokens", "pad_id", "group", "mesh",
                                             "page_size", "kv_pages"))
def _empty(key, *, config, rows, generations, width, slots, max_new_tokens, pad_id, group,
           mesh, page_size, kv_pages) -> continuous.EngineState:
  prompts = generations * rows // group
  if page_size:
    cache = pages.init(config, prompts=prompts, width=width, slots=slots,
                       max_new_tokens=max_new_tokens, page_size=page_size, pages=kv_pages,
                       shards=_shards(mesh))
  else:
    cache = prefix_cache.from_prompts(kv_cache.init_cache(config, prompts, width),
                                      prefix_cache.init_completions(config, slots,
                                                                    max_new_tokens))
  state = slots_lib.empty(
      cache, jnp.zeros((prompts, width), bool), jnp.stack([key] * generations),
      rows=generations * rows, slots=slots, max_new_tokens=max_new_tokens, shards=_shards(mesh),
      pad_id=pad_id)
  return slots_lib.constrain(state, mesh)


@functools.partial(jax.jit, static_argnums=(0,),
                   static_argnames=("max_new_tokens", "top_k", "top_p", "greedy", "stop_ids",
                                    "pad_id", "group", "mesh", "chunk"),
                   donate_argnames=("state",))
def admit(graphdef, params, state, prompt_tokens, prompt_mask, key, generation, temperature,
          version, active=None, stop_after=None, *, max_new_tokens, top_k=0, top_p=1.0,
          greedy=False, stop_ids=(), pad_id=0, group=1, mesh=None, chunk=0):
  """The state with generation `generation` (i32[], traced) holding a new batch: the rows'
  prompts (i32[R, Tp] left-padded, runs of `group` equal prompts; mask bool[R, Tp]) prefilled
  once per group into the generation's prompt slots, its rows reset, the `active` ones (bool[R],
  None = all) given their first token (drawn at `temperature` f32[] and tagged `version` i32[],
  the version of `params`) and queued behind every row already queued unless it ends them, each
  allowed `stop_after` (i32[R], None = max_new_tokens) tokens, and `key` its sampling key. The
  generation must hold no row that has not stopped or been evicted (the pipeline takes a batch
  out before its generation is reused). The keyword arguments are static, as in
  `continuous.run`."""
  r = prompt_tokens.shape[0]
  shards = _shards(mesh)
  logits, prompts, mask = continuous.prefill_groups(graphdef, params, prompt_tokens, prompt_mask,
                                                    group=group, mesh=mesh, chunk=chunk)
  cache = state.cache
  put = lambda table, new, ax=0: slots_lib.put_block(table, new, generation, shards, ax)
  if isinstance(cache, pages.PagedCache):
    cache = pages.write_prompts(cache, prompts, mask, generation)
  else:
    axis = kv_cache.cache_batch_axis(kv_cache.KVCache(k=cache.prompt_k, v=cache.prompt_v))
    layer = lambda tables, news: (put(tables, news, axis) if axis else
                                  tuple(put(t, n) for t, n in zip(tables, news)))
    cache = cache._replace(prompt_k=layer(cache.prompt_k, prompts.k),
                           prompt_v=layer(cache.prompt_v, prompts.v))
  state = state._replace(cache=cache, prompt_mask=put(state.prompt_mask, mask),
                         keys=state.keys.at[generation].set(key))
  active = jnp.ones((r,), bool) if active is None else jnp.asarray(active, bool)
  first = continuous.first_tokens(logits, key, version, group=group, temperature=temperature,
                                  top_k=top_k, top_p=top_p, greedy=greedy, mesh=mesh)
  state = slots_lib.enqueue(state, active, generation,
                            continuous.row_limits(r, max_new_tokens, stop_after), first,
                            jnp.asarray(stop_ids, jnp.int32), pad_id)
  return slots_lib.constrain(state, mesh)


@functools.partial(jax.jit, static_argnames=("group",), donate_argnames=("state",))
def evict(state: continuous.EngineState, generation, group: int = 1) -> continuous.EngineState:
  """The state without generation `generation`'s rows that have not stopped: their slots are
  freed (with their pages, of a paged cache with `group` rows a prompt) and their queued places
  passed over (they are the oldest queued: the queue is first in, first out). They keep what
  they recorded and stay not done (`harvest`)."""
  rows, shards = state.tokens.shape[0], state.queue.shape[0]
  mine, _ = slots_lib.generation_parts(state.row, rows, shards, state.keys.shape[0])
  leave = (state.row < rows) & (mine == generation)
  if isinstance(state.cache, pages.PagedCache):
    lengths = slots_lib.prompt_lengths(state, slots_lib.slot_prompts(state.row, shards, rows,
                                                                     group))
    written = lengths + jnp.maximum(state.step - 1, 0)
    state = state._replace(cache=pages.stop(state.cache, leave, lengths, written))
  return state._replace(row=jnp.where(leave, rows, state.row),
                        step=jnp.where(leave, 0, state.step),
                        taken=jnp.maximum(state.taken, state.queue_end[:, generation]))


class Harvest(NamedTuple):
  """One generation's rows in batch order (R rows)."""
  tokens: jax.Array    # i32[R, N]
  logprobs: jax.Array  # f32[R, N]
  mask: jax.Array      # f32[R, N] 1 on recorded tokens
  versions: jax.Array  # i32[R, N] policy version that drew each token
  done: jax.Array      # bool[R] stopped (or never queued); False: evicted before it stopped


@jax.jit
def harvest(state: continuous.EngineState, generation) -> Harvest:
  """Generation `generation`'s rows (`Harvest`), read without changing the state."""
  shards, generations = state.queue.shape[0], state.keys.shape[0]
  take = lambda x: slots_lib.take_block(x, generation, generations, shards)
  return Harvest(tokens=take(state.tokens), logprobs=take(state.logprobs), mask=take(state.mask),
                 versions=take(state.versions), done=take(state.done))


pending = jax.jit(slots_lib.pending)
