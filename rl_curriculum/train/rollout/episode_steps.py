"""The rollout path's episodes: every batch's rows played to their end and scored by their tasks.

  h = turn_width(config, task)                          # turns an episode of the run may take
  stop_after = first_turn(config, side)                 # each row's first turn's token limit
  h_t = step_horizon(config, state, root, batch_step, h)   # a batch's turn limit, at selection
  engine = decode(loop, engine, records, params, version, temperature, budget=..., due=...)
  played = score(loop, engine, records, generation)     # a stopped batch's episodes
  state = update_horizon(loop, state, records, step)    # after the batch's update is kept
  stats = batch_stats(loop, records, step, version)

Every row is an episode (`episodes`): a single-turn completion is an episode of one turn, scored
by its task's `step`; an environment answers each turn and the row plays on. Decoding runs in
rounds: the engine (`engines.run`), then the answers to every turn that ended
(`episodes.step_turns` for each batch in flight whose episodes may take another turn), the rows
that go on queued again; a batch whose horizon is one turn needs no answers until it is scored.
With rl.decode_budget (partial rollouts) the rounds go on across turn ends until the step's b
iterations are spent, or no row was queued again while a slot idled (the rows left go on at the
next step), so episodes decode while the learn step runs. A batch is scored once all its rows
have stopped (`score`): its episodes' returns, each turn's reward, successes and statistics are
its records (`pipeline.Records.played`).

Nothing of an episode lives outside the engine's rows: tasks are pure, so a row's turns and
replies are its episode's state (`episodes.replay` reads it again), and a checkpoint of the
engine (k > 0) or between steps (k = 0) resumes every episode exactly.
"""

from typing import Any, Optional

import jax
import ml_collections
import numpy as np

from rl_curriculum.curriculum import horizon as horizon_lib
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.train.rollout import engines
from rl_curriculum.train.rollout import episodes
from rl_curriculum.train.rollout.checks import turn_width

__all__ = ["turn_width", "limits", "first_turn", "step_horizon", "answer", "decode", "score",
           "update_horizon", "batch_stats"]

_HORIZON_STREAM = 0x484F52  # folded into a step's key for its horizon: a stream of its own


def limits(config: ml_collections.ConfigDict, max_turns: int) -> episodes.Limits:
  """The run's episode bounds with `max_turns` turns (the batch's horizon)."""
  n = config.rl.max_new_tokens
  return episodes.Limits(max_turns=int(max_turns), turn_tokens=config.rl.turn_tokens or n,
                         observation_tokens=config.rl.observation_tokens, max_new_tokens=n)


def first_turn(config: ml_collections.ConfigDict, side) -> jax.Array:
  """i32[R] each row's token limit for its first turn, over the rows' batch axes."""
  layout = side.layout
  cap = config.rl.turn_tokens or config.rl.max_new_tokens
  return distributed.rows_to_global(np.full(len(layout.mine), cap, np.int32),
                                    mesh_lib.batch_sharding(side.mesh, 1), layout.num_rows)


def step_horizon(config: ml_collections.ConfigDict, state, root, step: int, width: int) -> int:
  """Batch `step`'s horizon: 1 when episodes take one turn (width 1), else under
  config.curriculum.horizon (`curriculum.horizon.select`), with the horizon curriculum's state as
  it is when the batch is selected."""
  if width == 1:
    return 1
  c = config.curriculum
  key = jax.random.fold_in(jax.random.fold_in(root, step), _HORIZON_STREAM)
  return horizon_lib.select(c.horizon, state.horizon, key, step=step, steps=config.rl.steps,
                            start=c.horizon_start, temperature=c.horizon_temperature)


def _turns_of(loop, records, generation: int, **options) -> dict:
  """`episodes.step_turns`' arguments for generation `generation`'s batch: each row's problem
  (None where no completion slot was sampled, or `options["sampled"]` says not), its episode's
  seed, the batch's bounds, this process's rows."""
  run = loop.run
  valid = options.pop("sampled", records.valid[generation]).reshape(-1)
  ids = np.repeat(records.prompt_ids[generation], records.valid.shape[2])
  problems = [run.pool.problems[i] if v else None for i, v in zip(ids, valid)]
  step = int(records.batch_step[generation])
  return dict(problems=problems, task=run.task, tokenizer=run.tokenizer,
              seeds=[step * len(problems) + r for r in range(len(problems))],
              framing=run.framing, limits=limits(loop.config, int(records.horizon[generation])),
              width=turn_width(loop.config, run.task), mine=loop.side.layout.mine,
              mesh=loop.side.mesh, rows_of=engines.rows_of, **options)


def _answered(records) -> list:
  """The generations holding a batch not yet scored whose episodes may take another turn."""
  return [g for g in range(len(records.batch_step))
          if records.batch_step[g] > 0 and not records.scored[g] and records.horizon[g] > 1]


def answer(loop, engine, records) -> tuple[Any, bool]:
  """(engine, whether a row was queued again): every batch in flight's rows whose turns ended
  answered by their tasks (`episodes.step_turns`), those that go on queued again."""
  again = False
  for g in _answered(records):
    engine, _, queued = episodes.step_turns(engine, g, **_turns_of(loop, records, g))
    again |= queued
  return engine, again


def decode(loop, engine, records, params, version: int, temperature, *,
           budget: Optional[int] = None, due: Optional[int] = None, fed: bool = False,
           shrink: int = 0):
  """The engine after rounds of decoding with `params` (of `version`) and answering the turns
  that ended: without a `budget`, until no row goes on, or with `due` (a generation) until that
  generation has no row left; with a budget (partial rollouts), until b loop iterations are
  spent across the rounds, or a round stopped on an idle slot (`fed`) and no row was queued
  again. The slots halve (`shrink`) only where rows never come back after a turn (episodes of
  one turn)."""
  if turn_width(loop.config, loop.run.task) > 1:
    shrink = 0
  first = engines.iterations(engine)
  while True:
    left = None if budget is None else budget - (engines.iterations(engine) - first)
    engine = engines.run(loop, engine, params, temperature, version, budget=left, due=due,
                         fed=fed, shrink=shrink)
    engine, again = answer(loop, engine, records)
    if not again:
      return engine
    if budget is not None and engines.iterations(engine) - first >= budget:
      return engine
    if due is not None and not engines.pending(engine, due):
      return engine


def score(loop, engine, records, generation: int) -> tuple[episodes.Played, np.ndarray]:
  """(`episodes.Played` of the batch's rows, complete bool[S]): generation `generation`'s batch,
  its rows stopped, scored by replaying each row's episode (`episodes.step_turns`, read only);
  its groups whose sampled rows all stopped are complete, the others (rows evicted by `drop`)
  count nowhere and are not scored."""
  valid = records.valid[generation]
  s, g = valid.shape
  done = np.asarray(distributed.to_host(engines.harvest(engine, generation).done)).reshape(s, g)
  complete = np.all(done | ~valid, axis=1)
  _, played, _ = episodes.step_turns(
      engine, generation, read_only=True,
      **_turns_of(loop, records, generation, sampled=valid & complete[:, None]))
  return played, complete


def update_horizon(loop, state, records, step: int):
  """`state` with the horizon bandit moved by batch `step`'s spread of returns
  (curriculum.horizon = bandit; called once the step's update is kept, so a discarded update
  leaves the bandit as it was)."""
  config = loop.config
  if config.curriculum.horizon != "bandit" or state.horizon is None:
    return state
  generation = step % records.batch_step.shape[0]
  valid = records.valid[generation] & records.complete[generation][:, None]
  returns = records.played.rewards[generation].reshape(valid.shape)
  return state._replace(horizon=horizon_lib.update(
      state.horizon, int(records.horizon[generation]), horizon_lib.spread(returns, valid),
      config.curriculum.horizon_alpha))


def batch_stats(loop, records, step: int, version: int) -> dict:
  """Batch `step`'s episode statistics for the log (`episodes.episode_stats`), from its records;
  none for episodes of one turn, whose turns say nothing their rewards do not."""
  if turn_width(loop.config, loop.run.task) == 1:
    return {}
  generation = step % records.batch_step.shape[0]
  played = episodes.Played(*(x[generation] for x in records.played))
  valid = records.valid[generation] & records.complete[generation][:, None]
  return {**episodes.episode_stats(played, valid),
          "episode/horizon": float(records.horizon[generation]),
          "episode/staleness_max": float(np.max(played.staleness(version)[valid.reshape(-1)],
                                                initial=0))}
