"""The rollout path's steps for a task that is an environment: its batches are episodes.

  on = active(task)                                     # the run's task is an environment
  engine = attach_engine(config, programs, side, params, key, rows, prompt_len, generations)
  stop_after = first_turn(config, side)                 # each row's first turn's token limit
  h = step_horizon(config, state, root, batch_step)     # a batch's turn limit, at selection
  engine = decode(loop, engine, records, params, version, ...)   # turns decoded and answered
  state, rewards, correct = finish_batch(loop, state, params, step, version, records, ...)
  stats = batch_stats(loop, state, records, step, version)

A batch is selected and queued as any other (`pipeline.queue`, which also draws its horizon H
from `curriculum.horizon` and, with batches in flight, first gives back the pages of the batch
its generation held: `turns.release`). Every call of the engine is followed by the environments'
answers to the turns that ended (`step_all`: `episodes.step_turns` for each batch in flight), so
between calls each row is decoding, queued, or over. `finish_batch` replaces `pipeline.finish`'s
decoding and scoring: rounds of decoding and answering until the batch's episodes are over, their
returns and successes its records' rewards and correctness; the horizon bandit moves with the
batch's spread of returns. With rollouts in flight (rl.max_staleness = k > 0), `decode` runs the
rounds of the batches queued after it while the learn step runs (with rl.decode_budget, one call
of b iterations a step: episodes then span steps and versions, each token keeping the version
that drew it).

Nothing of an episode lives outside the engine's rows: an environment is pure, so a row's turns
and replies are its episode's state (`episodes.replay` reads it again), and a checkpoint of the
engine (k > 0) or between steps (k = 0) resumes every episode exactly.
"""

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum import environments
from rl_curriculum.curriculum import horizon as horizon_lib
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import turns
from rl_curriculum.train.rollout import episodes

__all__ = ["active", "limits", "attach_engine", "first_turn", "step_horizon", "step_all",
           "decode", "finish_batch", "batch_stats"]

_HORIZON_STREAM = 0x484F52  # folded into a step's key for its horizon: a stream of its own


def active(task) -> bool:
  """Whether a run's task is an environment (or a mixture of them): its rollouts are episodes."""
  return environments.is_environment(task)


def limits(config: ml_collections.ConfigDict, max_turns: int) -> episodes.Limits:
  """The run's episode bounds with `max_turns` turns (the step's horizon)."""
  n = config.rl.max_new_tokens
  return episodes.Limits(max_turns=int(max_turns), turn_tokens=config.rl.turn_tokens or n,
                         observation_tokens=config.rl.observation_tokens, max_new_tokens=n)


def attach_engine(config: ml_collections.ConfigDict, programs, side, params, key, rows: int,
                  prompt_len: int, generations: int = 1):
  """An empty engine for `generations` batches of `rows` episodes: a paged cache whose pool
  holds every row's N positions (`turns.episode_pages`), its rows able to come back after a
  turn."""
  options = programs.sampler
  n = options["max_new_tokens"]
  engine = inflight.init(
      programs.graphdef, params, key, rows=rows, generations=generations,
      prompt_len=prompt_len, slots=config.rl.decode_slots, chunk=config.rl.prefill_chunk,
      max_new_tokens=n, pad_id=options["pad_id"], group=options["group"], mesh=side.mesh,
      page_size=config.rl.page_size,
      kv_pages=turns.episode_pages(generations * rows, n, config.rl.page_size))
  return turns.episodic(engine, mesh=side.mesh)


def first_turn(config: ml_collections.ConfigDict, side) -> jax.Array:
  """i32[R] each row's token limit for its first turn, over the rows' batch axes."""
  layout = side.layout
  cap = config.rl.turn_tokens or config.rl.max_new_tokens
  return distributed.rows_to_global(np.full(len(layout.mine), cap, np.int32),
                                    mesh_lib.batch_sharding(side.mesh, 1), layout.num_rows)


def step_horizon(config: ml_collections.ConfigDict, state, root, step: int) -> int:
  """Batch `step`'s horizon under config.curriculum.horizon (`curriculum.horizon.select`), with
  the horizon curriculum's state as it is when the batch is selected."""
  c = config.curriculum
  key = jax.random.fold_in(jax.random.fold_in(root, step), _HORIZON_STREAM)
  return horizon_lib.select(c.horizon, state.horizon, key, step=step, steps=config.rl.steps,
                            start=c.horizon_start, temperature=c.horizon_temperature)


def _episodes(loop, records, generation: int) -> dict:
  """`episodes.step_turns`' arguments for generation `generation`'s batch: each row's problem
  (None where no completion slot was sampled), its episode's seed and the batch's bounds."""
  run = loop.run
  valid = records.valid[generation]
  ids = np.repeat(records.prompt_ids[generation], valid.shape[1])
  problems = [run.pool.problems[i] if v else None for i, v in zip(ids, valid.reshape(-1))]
  step = int(records.batch_step[generation])
  return dict(problems=problems, task=run.task, tokenizer=run.tokenizer,
              seeds=[step * len(problems) + r for r in range(len(problems))],
              framing=episodes.observation_framing(run.tokenizer, loop.config.task.template),
              limits=limits(loop.config, int(records.horizon[generation])),
              mesh=loop.side.mesh)


def _going(records) -> list:
  """The generations holding a batch whose episodes are not yet scored."""
  return [g for g in range(len(records.batch_step))
          if records.batch_step[g] > 0 and not records.scored[g]]


def step_all(loop, engine, records) -> tuple[Any, bool]:
  """(engine, whether a row was queued again): every batch in flight's rows whose turns ended
  answered by their environments (`episodes.step_turns`)."""
  again = False
  for g in _going(records):
    engine, _, queued = episodes.step_turns(engine, g, **_episodes(loop, records, g))
    again |= queued
  return engine, again


def decode(loop, engine, records, params, version: int, temperature, draw: dict, *, budget=None,
           due=None, fed: bool = False):
  """The engine after decoding with `params` (of `version`) and answering the turns that ended:
  with a `budget` (partial rollouts) one call of b iterations, then the environments; without,
  rounds of decoding and answering until no row goes on, or with `due` (a generation) until
  that generation's episodes are all over."""
  graphdef = loop.programs.graphdef
  while True:
    engine = continuous.run(graphdef, params, engine, temperature, jnp.int32(version),
                            None if budget is None else jnp.int32(budget),
                            None if due is None else jnp.int32(due), fed=fed, **draw)
    engine, again = step_all(loop, engine, records)
    if budget is not None or not again:
      return engine
    if due is not None and not bool(inflight.pending(engine, jnp.int32(due))):
      return engine


def finish_batch(loop, state, params, step: int, version: int, records, draw: dict,
                 temperature):
  """(state, rewards f32[S, G], correct bool[S, G]): batch `step`'s episodes played to their end
  with `params` (of `version`), beside the batches in flight after it; their returns and
  successes, and the horizon bandit moved by the batch's spread of returns."""
  config = loop.config
  w = records.batch_step.shape[0]
  generation = step % w
  # Rows whose first token ended their turn were never queued: they are answered first.
  engine, _ = step_all(loop, state.rollouts.engine, records)
  if bool(inflight.pending(engine, jnp.int32(generation))):
    engine = decode(loop, engine, records, params, version, temperature, draw,
                    due=None if w == 1 else generation)
  _, played, _ = episodes.step_turns(engine, generation, read_only=True,
                                     **_episodes(loop, records, generation))
  valid = records.valid[generation]
  s, g = valid.shape
  rewards, correct = played.rewards.reshape(s, g), played.correct.reshape(s, g)
  if config.curriculum.horizon == "bandit":
    state = state._replace(horizon=horizon_lib.update(
        state.horizon, int(records.horizon[generation]), horizon_lib.spread(rewards, valid),
        config.curriculum.horizon_alpha))
  return state._replace(rollouts=state.rollouts._replace(engine=engine)), rewards, correct


def batch_stats(loop, state, records, step: int, version: int) -> dict:
  """Batch `step`'s episode statistics for the log (`episodes.episode_stats`), read again from
  its rows (the environments are pure: nothing of an episode is kept apart from its tokens)."""
  generation = step % records.batch_step.shape[0]
  _, played, _ = episodes.step_turns(state.rollouts.engine, generation, read_only=True,
                                     **_episodes(loop, records, generation))
  return {**episodes.episode_stats(played, records.valid[generation]),
          "episode/horizon": float(records.horizon[generation]),
          "episode/staleness_max": float(np.max(played.staleness(version), initial=0))}
