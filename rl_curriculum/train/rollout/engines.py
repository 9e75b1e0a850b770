"""The run's rollout engine behind one door: what the pipeline asks of it, whichever it is.

  engine = attach(config, programs, side, params, key, rows, prompt_len, width)
  engine = admit(loop, engine, params, tokens, mask, key, generation, temperature, version,
                 active, stop_after)                          # a batch queued in its generation
  engine = run(loop, engine, params, temperature, version, budget=b, due=g, fed=f, shrink=s)
  rows = rows_of(engine, generation)                          # `turns.Rows`, for the episodes
  harvest = harvest(engine, generation)                       # `inflight.Harvest`, for learning
  engine = release(engine, generation, group)                 # its rows' kept pages given back
  pending(engine, generation), counters(engine)

Three engines, chosen by the config and by how many turns the run's episodes take (`width`):
  static       (rl.engine = static) the static sampler, a synchronous step's batch sampled whole
               when `run` is first called for it (`static_batch`); episodes of one turn only
  continuous   the continuous engine (`sampling.inflight`: W generations of rows, their decode
               slots refilled from a queue), for one-turn episodes: a stopped row's pages, on a
               paged cache, go back at once
  returning    the continuous engine over a paged cache whose rows come back after a turn
               (`sampling.turns`: a row keeps its pages while its environment answers), for
               episodes of more than one turn
The pipeline never asks which: every call here takes any of them.
"""

from typing import Optional

import jax.numpy as jnp
import numpy as np

from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import turns
from rl_curriculum.train.rollout import static_batch
from rl_curriculum.train.rollout.static_batch import StaticBatch

__all__ = ["attach", "admit", "draw_options", "run", "rows_of", "harvest", "release", "pending",
           "evict", "counters", "iterations"]


def attach(config, programs, side, params, key, rows: int, prompt_len: int, generations: int,
           width: int):
  """An empty engine for `generations` batches of `rows` rows whose episodes take at most
  `width` turns: the static batch (rl.engine = static), or the continuous engine's, whose rows
  come back after a turn when width > 1 (its page pool then holds every row's positions:
  `turns.episode_pages`)."""
  options = programs.sampler
  if config.rl.engine == "static":
    return StaticBatch(prompt_tokens=None, prompt_mask=None, key=key, active=None, rows=None,
                       counters=np.zeros(4, np.int64))
  n = options["max_new_tokens"]
  returning = width > 1
  engine = inflight.init(
      programs.graphdef, params, key, rows=rows, generations=generations,
      prompt_len=prompt_len, slots=config.rl.decode_slots, chunk=config.rl.prefill_chunk,
      max_new_tokens=n, pad_id=options["pad_id"], group=options["group"], mesh=side.mesh,
      page_size=config.rl.page_size,
      kv_pages=(turns.episode_pages(generations * rows, n, config.rl.page_size) if returning
                else config.rl.kv_pages))
  return turns.episodic(engine, mesh=side.mesh) if returning else engine


def admit(loop, engine, params, tokens, mask, key, generation: int, temperature, version: int,
          active, stop_after):
  """The engine with a new batch (rows' prompts i32[R, Tp], mask, over the rows' batch axes) in
  `generation`: the static batch keeps them to sample whole; the continuous engine prefills them,
  draws each active row's first token and queues the rows, each allowed `stop_after` i32[R]
  tokens in its first turn."""
  if isinstance(engine, StaticBatch):
    return engine._replace(prompt_tokens=tokens, prompt_mask=mask, key=key, active=active,
                           rows=None)
  config = loop.config
  return inflight.admit(
      loop.programs.graphdef, params, engine, tokens, mask, key, jnp.int32(generation),
      temperature, jnp.int32(version), active, stop_after,
      max_new_tokens=config.rl.max_new_tokens, chunk=config.rl.prefill_chunk,
      **draw_options(loop))


def draw_options(loop) -> dict:
  """The engine programs' static sampling options."""
  options = loop.programs.sampler
  return dict(stop_ids=tuple(sorted({options["eos_id"], *options["stop_ids"]})),
              pad_id=options["pad_id"], group=options["group"], mesh=loop.side.mesh)


def run(loop, engine, params, temperature, version: int, *, budget: Optional[int] = None,
        due: Optional[int] = None, fed: bool = False, shrink: int = 0):
  """The engine after decoding with `params` (of `version`): the static batch sampled whole (once;
  a sampled batch is left as it is), or the continuous engine's loop (`continuous.run`) for at
  most `budget` iterations (None: no limit), until generation `due` has no row left (None: until
  every queued row stops), stopping once a slot idles with nothing queued (`fed`), halving its
  slots up to `shrink` times."""
  if isinstance(engine, StaticBatch):
    if engine.rows is not None:
      return engine
    return static_batch.sample(loop.programs, engine, params, temperature, version)
  return continuous.run(loop.programs.graphdef, params, engine, temperature, jnp.int32(version),
                        None if budget is None else jnp.int32(budget),
                        None if due is None else jnp.int32(due), shrink=shrink, fed=fed,
                        **draw_options(loop))


def rows_of(engine, generation) -> turns.Rows:
  """Generation `generation`'s rows as the episodes read them (`turns.Rows`)."""
  if isinstance(engine, StaticBatch):
    rows = engine.rows
    return turns.Rows(tokens=rows.tokens, mask=rows.mask, versions=rows.versions,
                      done=rows.done, forced=jnp.zeros(rows.done.shape, jnp.int32))
  return turns.rows_of(engine, generation)


def harvest(engine, generation: int) -> inflight.Harvest:
  """Generation `generation`'s rows as the learn step takes them (`inflight.Harvest`)."""
  if isinstance(engine, StaticBatch):
    return engine.rows
  return inflight.harvest(engine, jnp.int32(generation))


def release(engine, generation: int, *, group: int, mesh=None):
  """The engine with the pages generation `generation`'s rows kept (rows that come back after a
  turn keep theirs when their episode ends) given back, before it takes a new batch; other
  engines free a row's pages when it stops, and are returned as they are."""
  if isinstance(engine, StaticBatch) or engine.tables is None:
    return engine
  return turns.release(engine, jnp.int32(generation), group=group, mesh=mesh)


def pending(engine, generation: int) -> bool:
  """Whether generation `generation` has a row queued or decoding (a static batch: not sampled
  yet)."""
  if isinstance(engine, StaticBatch):
    return engine.rows is None
  return bool(inflight.pending(engine, jnp.int32(generation)))


def evict(engine, generation: int, *, group: int):
  """The engine without generation `generation`'s rows that have not stopped (`inflight.evict`:
  admission `drop`)."""
  return inflight.evict(engine, jnp.int32(generation), group=group)


def counters(engine) -> np.ndarray:
  """i64[4] (tokens recorded, slot-steps computed, loop iterations, slot-steps that fed an
  occupied slot) of the engine so far."""
  if isinstance(engine, StaticBatch):
    return engine.counters.copy()
  return np.asarray([int(engine.drawn), int(engine.slot_steps), int(engine.iterations),
                     int(engine.fed)], np.int64)


def iterations(engine) -> int:
  """Loop iterations the engine has run (a static batch: 0)."""
  return 0 if isinstance(engine, StaticBatch) else int(engine.iterations)
