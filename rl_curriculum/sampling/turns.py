"""Episodes on the continuous engine: a row's turns, with observations between them.

A multi-turn row is one buffer of N positions: the policy's first turn, an observation, its
second turn, another observation, and so on, token in, token out (the ids the policy drew and
the observations' ids, never a conversation rendered and tokenised again). The engine decodes
turns as it decodes single-turn rows; what episodes add is small:

  state = episodic(state)                  # a paged engine whose rows can come back
  state = continuous.run(...)              # every queued row writes its turn; a stop id (or the
                                           # turn's token limit) ends it and frees its slot
  ... the host steps each row's environment on the text of its turn ...
  state = requeue(state, again, observations, lengths, start, limit)
  state = continuous.run(...)              # the rows that go on write their next turn

A row whose turn ends leaves its decode slot, as a finished row does, so a queued row takes the
slot while the host steps the environments; its pages stay listed in its own page table
(`EngineState.tables`) and nothing it wrote is recomputed: the prompt's pages stay shared with its
group and its earlier turns stay in its pages. `requeue` writes a row's observation ids after its
turn, marks them as written before (`EngineState.forced`) and queues the row again, to be seated
at the step of its turn's last token (`EngineState.resume`). Once seated, the slot feeds that
token and then the observation's ids one per loop iteration, as a decode slot feeds its own
tokens: each fed id writes its keys and values into the row's pages, none is drawn, and each keeps
mask 0, so the loss, the KL and the entropy never see it. The logits after the observation's
last id draw the next turn's first token. Feeding the observation through the decode loop costs
one slot-step per id (observations are short next to turns); a prefill of several ids at once
over the row's pages is the faster form on an accelerator.

Every drawn token records its log-prob and the version of the weights that drew it as it is
drawn, and row r's t-th position is drawn with fold_in(fold_in(key, r), t) whatever its slot, turn
or call, so an episode's tokens do not depend on how its turns were scheduled.

The page pool holds every row's N positions (`episode_pages`, from `pages.row_pages`): a row
waiting for its environment keeps its pages, so rows never restart for want of one
(`pages.make_room` never finds a pool short).

Shapes: R rows, S slots, D shards, N positions a row (turns and observations), O observation ids,
M pages a row lists.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.sampling import pages
from rl_curriculum.sampling import slots as slots_lib
from rl_curriculum.sampling.slots import EngineState

__all__ = ["episode_pages", "episodic", "Rows", "rows_of", "requeue", "release"]


def episode_pages(rows: int, max_new_tokens: int, page_size: int) -> int:
  """The completion pages a pool needs so that each of `rows` rows can hold all its
  `max_new_tokens` positions at once (rows waiting for their environment keep their pages)."""
  return rows * pages.row_pages(max_new_tokens, page_size)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnames=("state",))
def episodic(state: EngineState, *, mesh=None) -> EngineState:
  """A paged engine state whose rows can be queued again after a turn (`requeue`): no row has
  observations yet, every row is seated at step 1, and each keeps its page table when its turn
  ends."""
  if not isinstance(state.cache, pages.PagedCache):
    raise ValueError("episodes run on a paged cache (rl.page_size > 0)")
  rows = state.tokens.shape[0]
  return slots_lib.constrain(state._replace(
      forced=jnp.zeros((rows,), jnp.int32), resume=jnp.ones((rows,), jnp.int32),
      tables=jnp.zeros((rows, state.cache.table.shape[1]), jnp.int32)), mesh)


class Rows(NamedTuple):
  """One generation's rows in batch order (`rows_of`)."""
  tokens: jax.Array    # i32[R, N]
  mask: jax.Array      # f32[R, N] 1 on drawn tokens
  versions: jax.Array  # i32[R, N]
  done: jax.Array      # bool[R] not decoding: stopped, waiting for its environment, or never
                       # queued
  forced: jax.Array    # i32[R] positions before it hold written replies


@jax.jit
def rows_of(state: EngineState, generation) -> Rows:
  """Generation `generation`'s rows (`Rows`), read without changing the state."""
  shards, generations = state.queue.shape[0], state.keys.shape[0]
  take = lambda x: slots_lib.take_block(x, generation, generations, shards)
  forced = (jnp.zeros(state.done.shape, jnp.int32) if state.forced is None
            else state.forced)  # a one-turn engine: no row was ever given a reply
  return Rows(tokens=take(state.tokens), mask=take(state.mask), versions=take(state.versions),
              done=take(state.done), forced=take(forced))


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnames=("state",))
def requeue(state: EngineState, again: jax.Array, observations: jax.Array, lengths: jax.Array,
            start: jax.Array, limit: jax.Array, generation=0, *, mesh=None) -> EngineState:
  """The state with generation `generation`'s rows `again` (bool[R], batch order; their turns
  ended) given their observation ids observations i32[R, O] (the first lengths[r] of row r) at
  positions start[r] .. start[r] + lengths[r] - 1 (start[r]: the position after its turn's last
  token), allowed positions up to limit[r] (exclusive, > start[r] + lengths[r]), and queued
  again after every row already queued, in the engine's row order within each shard. The other
  rows are unchanged."""
  rows, n = state.tokens.shape
  d, per_shard = state.queue.shape
  put = lambda x: slots_lib.put_block(jnp.zeros((rows,) + x.shape[1:], x.dtype), x,
                                      generation, d)
  again, observations, lengths, start, limit = (
      put(jnp.asarray(x)) for x in (again, observations, lengths, start, limit))
  j = jnp.arange(observations.shape[1], dtype=jnp.int32)[None, :]
  position = jnp.where(again[:, None] & (j < lengths[:, None]), start[:, None] + j, n)
  row = jnp.arange(rows, dtype=jnp.int32)[:, None]
  tokens = state.tokens.at[row, position].set(observations, mode="drop")
  by_shard = again.reshape(d, per_shard)
  order = jnp.argsort(~by_shard, axis=1, stable=True).astype(jnp.int32)
  count = jnp.sum(by_shard, axis=1, dtype=jnp.int32)
  m = jnp.arange(per_shard, dtype=jnp.int32)[None, :]
  place = jnp.where(m < count[:, None], (state.queued[:, None] + m) % per_shard, per_shard)
  queue = jax.vmap(lambda q, i, v: q.at[i].set(v, mode="drop"))(state.queue, place, order)
  queued = state.queued + count
  state = state._replace(
      tokens=tokens, forced=jnp.where(again, start + lengths, state.forced),
      resume=jnp.where(again, start, state.resume), limit=jnp.where(again, limit, state.limit),
      done=state.done & ~again, queue=queue, queued=queued,
      queue_end=jnp.broadcast_to(queued[:, None], state.queue_end.shape))
  return slots_lib.constrain(state, mesh)


@functools.partial(jax.jit, static_argnames=("group", "mesh"), donate_argnames=("state",))
def release(state: EngineState, generation, *, group: int = 1, mesh=None) -> EngineState:
  """The state with every page that generation `generation`'s rows kept (their episodes over,
  none of them seated) back on the free stacks: before the generation takes a new batch, whose
  rows take pages of their own."""
  rows = state.tokens.shape[0]
  d = state.queue.shape[0]
  mine = slots_lib.put_block(jnp.zeros((rows,), bool), jnp.ones((rows // state.keys.shape[0],),
                                                                 bool), generation, d)
  drawn = state.mask > 0
  n = state.mask.shape[1]
  end = jnp.where(jnp.any(drawn, axis=1), n - jnp.argmax(drawn[:, ::-1], axis=1), 0)
  ids = jnp.arange(rows, dtype=jnp.int32)
  lengths = slots_lib.prompt_lengths(state, slots_lib.slot_prompts(ids, d, rows, group))
  size = state.cache.pool.shape[2]
  first = lengths // size
  # A row that was ever seated fed its tokens up to its last one, which it drew and never fed.
  held = pages.held(lengths, lengths + end - 1, size)
  cache = pages.release(state.cache, mine & (end >= 2), first, first + held - 1,
                        table=state.tables)
  return slots_lib.constrain(state._replace(cache=cache), mesh)
