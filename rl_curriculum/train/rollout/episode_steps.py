"""The rollout path's steps for a task that is an environment: its batches are episodes.

  on = active(config)                                   # the run's task is an environment
  engine = attach_engine(config, programs, side, state, rows, prompt_len)   # a paged engine
                                                        # whose rows can come back after a turn
  stop_after = first_turn(config, side)                 # each row's first turn's token limit
  state, stats, rewards, correct = play_batch(loop, state, params, step, version)

A step's batch is queued as any other (`pipeline.queue`); `play_batch` replaces the decoding to
the end and the scoring of `pipeline.finish`: the rows play their episodes (`episodes.play`) with
the step's horizon (`curriculum.horizon`), and each row's return and success are its records'
rewards and correctness. The horizon bandit's state moves with the step's spread of returns.
Episodes need the synchronous schedule (rl.max_staleness = 0): nothing is in flight between
steps, so a checkpoint between steps holds every episode's outcome, and a resumed run plays the
next step's episodes as the uninterrupted one would.
"""

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

__all__ = ["active", "limits", "attach_engine", "first_turn", "step_horizon", "play_batch"]

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
                  prompt_len: int):
  """An empty engine for one batch of episodes: a paged cache whose pool holds every row's N
  positions (`turns.episode_pages`), its rows able to come back after a turn."""
  options = programs.sampler
  n = options["max_new_tokens"]
  engine = inflight.init(
      programs.graphdef, params, key, rows=rows, generations=1, prompt_len=prompt_len,
      slots=config.rl.decode_slots, chunk=config.rl.prefill_chunk, max_new_tokens=n,
      pad_id=options["pad_id"], group=options["group"], mesh=side.mesh,
      page_size=config.rl.page_size,
      kv_pages=turns.episode_pages(rows, n, config.rl.page_size))
  return turns.episodic(engine, mesh=side.mesh)


def first_turn(config: ml_collections.ConfigDict, side) -> jax.Array:
  """i32[R] each row's token limit for its first turn, over the rows' batch axes."""
  layout = side.layout
  cap = config.rl.turn_tokens or config.rl.max_new_tokens
  return distributed.rows_to_global(np.full(len(layout.mine), cap, np.int32),
                                    mesh_lib.batch_sharding(side.mesh, 1), layout.num_rows)


def step_horizon(config: ml_collections.ConfigDict, state, root, step: int) -> int:
  """Step `step`'s horizon under config.curriculum.horizon (`curriculum.horizon.select`)."""
  c = config.curriculum
  key = jax.random.fold_in(jax.random.fold_in(root, step), _HORIZON_STREAM)
  return horizon_lib.select(c.horizon, state.horizon, key, step=step, steps=config.rl.steps,
                            start=c.horizon_start, temperature=c.horizon_temperature)


def play_batch(loop, state, params, step: int, version: int, records, draw: dict,
               temperature):
  """(state, episode statistics, rewards f32[S, G], correct bool[S, G]): batch `step`'s rows
  (queued, generation 0) play their episodes with `params` (of `version`); the horizon bandit
  updated with the step's spread of returns."""
  config, run = loop.config, loop.run
  h = step_horizon(config, state, loop.root, step)
  valid = records.valid[0]
  s, g = valid.shape
  ids = np.repeat(records.prompt_ids[0], g)
  problems = [run.pool.problems[i] if v else None for i, v in zip(ids, valid.reshape(-1))]
  decode = lambda engine: continuous.run(loop.programs.graphdef, params, engine, temperature,
                                         jnp.int32(version), **draw)
  engine, played = episodes.play(
      state.rollouts.engine, run=decode, problems=problems, task=run.task,
      seeds=[step * len(problems) + r for r in range(len(problems))], tokenizer=run.tokenizer,
      framing=episodes.observation_framing(run.tokenizer, config.task.template),
      limits=limits(config, h), mesh=loop.side.mesh)
  rewards, correct = played.rewards.reshape(s, g), played.correct.reshape(s, g)
  stats = {**episodes.episode_stats(played, valid), "episode/horizon": float(h),
           "episode/staleness_max": float(np.max(played.staleness(version), initial=0))}
  if config.curriculum.horizon == "bandit":
    state = state._replace(horizon=horizon_lib.update(
        state.horizon, h, horizon_lib.spread(rewards, valid), config.curriculum.horizon_alpha))
  state = state._replace(rollouts=state.rollouts._replace(engine=engine))
  return state, stats, rewards, correct
