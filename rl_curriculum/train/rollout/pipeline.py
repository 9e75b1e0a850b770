"""The rollout path of every step: a batch queued, decoded, scored and handed to the learn step.

Step t queues the batch of step t + k (rl.max_staleness = k), finishes and scores batch t, learns
from it while the engine decodes the batches queued after it, then scores the batches whose rows
have all stopped. The synchronous run is k = 0: batch t is queued, decoded to its end and scored
in its own step, then learned from, exactly as a loop that samples and then learns.

  side = rollout_side(config, rollout_mesh, mesh)    # where the rollouts decode
  state = attach(config, run, programs, side, key, state)   # an empty engine and its records
  state = queue(loop, state, params, j, now)         # batch j selected and its rows queued
  state, seconds = finish(loop, state, params, t, version)  # batch t's rows stopped, scored
  batch, stats = learn_batch(loop, state, t, key)    # batch t as the learn step takes it
  state = decode(loop, state, params, version)       # the decoding that overlaps a learn step
  state, seconds = score_stopped(loop, state)        # every batch whose rows have all stopped

The engine is the configured one (rl.engine): the continuous engine (`sampling.inflight`, W =
k + 1 generations of rows in one engine state), or at k = 0 the static sampler, which samples a
batch whole in `finish`. With W generations holding batches t .. t + k:

  - a token of batch t was drawn at steps t - k .. t by weights of versions >= t - k - 1, and step
    t learns from version t - 1: no trained token is more than k versions old (each token's
    version is in `Batch.versions` when k > 0; the learn step logs the staleness it saw);
  - the curriculum's feedback on batch t reaches its state with step t's update (in `learn`), k
    steps after the selection; selection t + k reads the state after step t - 1's update;
  - with `wait` every selected group is trained, in selection order (slow groups are paced, not
    lost); with `drop` a group with a row that has not stopped by its step is discarded (it
    counts nowhere, like a skipped prompt), which favours the groups that finish fast;
  - with no budget, each step decodes every queued row to its end: a batch is drawn whole by one
    version, the step after it is queued. With a budget (partial rollouts), a step decodes at
    most b iterations, and with `wait` only while every slot has a row: a batch's long rows go
    on over the next steps beside the rows of the batches queued after it.

Every row plays an episode (`episode_steps`): a single-turn completion is an episode of one turn,
scored by its task; on an environment `finish` and `decode` alternate the engine with the
environments' replies. A batch is scored once its rows have all stopped, by its episodes' returns.
The engine behind it all is one door (`engines`): the static sampler, the continuous engine, or
the continuous engine whose rows come back after a turn.

With k > 0 everything in flight (the engine's rows, prompt keys and values, queue; each batch's
selection and scores) is in `RunState.rollouts`, so checkpoints hold it and a resumed run goes on
exactly; at k = 0 nothing outlives its step and `RunState.rollouts` is None between steps. A
rollback to an older checkpoint (`recovery`) restarts the pipeline: the batches in flight are
dropped and the next k are selected anew from the restored state.

References: Fu et al. (2025), "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning", arXiv:2505.24298 (staleness-bounded asynchronous RL, decoupled PPO); Kimi
Team (2025), "Kimi k1.5: Scaling Reinforcement Learning with LLMs", arXiv:2501.12599 (partial
rollouts).
"""

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train.learn.rl_types import Batch
from rl_curriculum.train.rollout import budget, checks as rollout_checks
from rl_curriculum.train.rollout import batches
from rl_curriculum.train.rollout import engines
from rl_curriculum.train.rollout import episode_steps
from rl_curriculum.train.rollout import episodes
from rl_curriculum.train.setup import builders
from rl_curriculum.train.setup.prepare import step_keys
from rl_curriculum.train.state import RunState
from rl_curriculum.types import Selection

__all__ = ["Records", "InFlight", "Side", "generations", "persists", "rollout_side",
           "empty_records", "attach", "restart", "rollout_policy", "queue", "finish",
           "complete_groups", "learn_batch", "learned", "decode", "score_stopped",
           "engine_counters", "decode_stats"]


class Records(NamedTuple):
  """What the learner side keeps of each generation's batch (replicated; W generations of S
  groups of G rows, R = S G)."""
  prompt_ids: jax.Array  # i32[W, S] pool indices
  arms: jax.Array        # i32[W, S] curriculum arms
  valid: jax.Array       # bool[W, S, G] completion slots sampled (`budget.slot_mask`)
  selected: jax.Array    # i32[W] the step whose curriculum state selected it (0: before step 1)
  batch_step: jax.Array  # i32[W] the step that learns from it (0: none)
  scored: jax.Array      # bool[W] its episodes scored
  complete: jax.Array    # bool[W, S] every sampled row of the group stopped (False: dropped)
  horizon: jax.Array     # i32[W] turns its episodes may take (1: one-turn episodes)
  played: episodes.Played  # [W, R, ...] its episodes once scored: returns, each turn's
                           # reward, successes, statistics


class InFlight(NamedTuple):
  """`RunState.rollouts` during a step (and between steps with k > 0)."""
  engine: Any      # the engine's state on the rollout mesh (`engines`)
  records: Records


class Side(NamedTuple):
  """Where the rollouts decode."""
  mesh: Any                 # the rollout mesh (the learner's own, the same devices in the
                            # engine's layout, or devices apart)
  layout: batches.RowLayout  # a batch's rows over its batch axes
  apart: bool               # on devices of their own (parallel.rollout_devices > 0)
  sent: dict                # under LoRA: {"of": the base last sent, "base": its copy there}
  moved: bool = False       # the engine decodes a copy of the policy (apart, or in a layout
                            # of its own: `programs.to_rollout`)


def generations(config: ml_collections.ConfigDict) -> int:
  """W = rl.max_staleness + 1: the batches in flight at a step (its own and the next k)."""
  return config.rl.max_staleness + 1


def persists(config: ml_collections.ConfigDict) -> bool:
  """Whether rows stay in flight between steps (k > 0): `RunState.rollouts` then outlives its
  step and checkpoints hold it."""
  return config.rl.max_staleness > 0


def rollout_side(config: ml_collections.ConfigDict, rollout_mesh, mesh) -> Side:
  """The rollout mesh (`prepare.rollout_mesh`; the learner's `mesh`, or apart) and the layout of
  a batch's rows on it.

  Raises:
    ConfigError: the rows or the decode slots do not split over its batch axes.
  """
  rollout_checks.check_decode_slots(config, mesh_lib.batch_size_of(rollout_mesh))
  apart = set(rollout_mesh.devices.flat) != set(mesh.devices.flat)
  return Side(mesh=rollout_mesh, layout=batches.row_layout(config, rollout_mesh), apart=apart,
              sent={}, moved=rollout_mesh is not mesh)


def empty_records(config: ml_collections.ConfigDict, width: int = 1) -> Records:
  """Records of W generations holding no batch (host arrays), for episodes of at most `width`
  turns."""
  w, s, g = generations(config), builders.sampled_prompts(config), budget.group_slots(config)
  return Records(prompt_ids=np.zeros((w, s), np.int32), arms=np.zeros((w, s), np.int32),
                 valid=np.zeros((w, s, g), bool), selected=np.zeros(w, np.int32),
                 batch_step=np.zeros(w, np.int32), scored=np.zeros(w, bool),
                 complete=np.zeros((w, s), bool), horizon=np.zeros(w, np.int32),
                 played=episodes.empty_played((w, s * g), width))


def _put_records(config: ml_collections.ConfigDict, programs: programs_lib.Programs,
                 state: RunState, records: Records) -> RunState:
  """`state` with `records`: replicated on the devices when rows stay in flight (checkpoints
  hold them), as host arrays when they live for one step (k = 0: no device round trips)."""
  if persists(config):
    records = distributed.place(records, jax.tree.map(lambda _: programs.replicated, records))
  return state._replace(rollouts=state.rollouts._replace(records=records))


def _host_records(state: RunState) -> Records:
  return jax.tree.map(lambda x: np.array(distributed.to_host(x)), state.rollouts.records)


def _with_engine(state: RunState, engine) -> RunState:
  return state._replace(rollouts=state.rollouts._replace(engine=engine))


def rollout_policy(loop, state: RunState) -> Any:
  """The policy's parameters where the rollouts decode: those of `state`, or the engine's copy
  (`programs.to_rollout`: resharded on the learner's devices, or sent to a rollout mesh apart;
  under LoRA the adapters every step, the frozen base when it changed: the first step, after a
  ReLoRA merge or a restore)."""
  params = programs_lib.policy(state)
  side, programs = loop.side, loop.programs
  if not side.moved:
    return params
  if state.base is None:
    return programs_lib.to_rollout(programs, params)
  if side.sent.get("of") is not state.base:
    side.sent.update({"of": state.base,
                      "base": programs_lib.to_rollout(programs, state.base, 1)})
  return programs_lib.to_rollout(programs, state.train.params, 0), side.sent["base"]


def _temperature(config: ml_collections.ConfigDict, state: RunState) -> jax.Array:
  """f32[] the rollouts' sampling temperature: config.rl.temperature, or under the adaptive
  controller the train state's (traced by the engines: a new value compiles nothing)."""
  if config.rl.temperature_target:
    return state.train.temperature
  return jnp.float32(config.rl.temperature)


def attach(config: ml_collections.ConfigDict, run, programs: programs_lib.Programs, side: Side,
           key: jax.Array, state: RunState) -> RunState:
  """`state` with nothing in flight: an empty engine on the rollout mesh (`engines.attach`: W
  generations for `run`'s prompt buffer, `key` standing for their keys until each is queued)
  and empty records."""
  width = episode_steps.turn_width(config, run.task)
  engine = engines.attach(config, programs, side, programs_lib.policy(state), key,
                          side.layout.num_rows, run.pool.tokens.shape[1], generations(config),
                          width)
  state = state._replace(rollouts=InFlight(engine=engine, records=None))
  return _put_records(config, programs, state, empty_records(config, width))


def queue(loop, state: RunState, params: Any, batch_step: int, now: int) -> RunState:
  """`state` with batch `batch_step` selected by the curriculum (its state as it is at step
  `now`), its horizon chosen, and its rows queued in generation batch_step mod W (the pages the
  generation's last batch kept given back first), prompts prefilled and first tokens drawn with
  `params` (of the train state's version)."""
  config, run, side = loop.config, loop.run, loop.side
  k_select, k_sample, _, _ = step_keys(loop.root, batch_step)
  selection, curriculum = loop.programs.select(state.curriculum, k_select)
  state = state._replace(curriculum=curriculum)
  valid = budget.slot_mask(config, selection, state.prompts)  # bool[S, G]
  prompt_ids = np.asarray(selection.prompt_ids)
  layout, g = side.layout, budget.group_slots(config)
  mine = np.repeat(prompt_ids, g)[layout.mine]
  to_global = lambda x: distributed.rows_to_global(x, layout.sharding, layout.num_rows)
  active = None if valid.all() else distributed.rows_to_global(
      valid.reshape(-1)[layout.mine], mesh_lib.batch_sharding(side.mesh, 1), layout.num_rows)
  j = batch_step % generations(config)
  horizon = episode_steps.step_horizon(config, state, loop.root, batch_step,
                                       episode_steps.turn_width(config, run.task))
  engine = engines.release(state.rollouts.engine, j, group=loop.programs.sampler["group"],
                           mesh=side.mesh)
  engine = engines.admit(loop, engine, params, to_global(run.pool.tokens[mine]),
                         to_global(run.pool.mask[mine]), k_sample, j, _temperature(config, state),
                         int(state.train.step), active, episode_steps.first_turn(config, side))
  records = _host_records(state)
  for field, value in (("prompt_ids", prompt_ids), ("arms", np.asarray(selection.arms)),
                       ("valid", valid), ("selected", now), ("batch_step", batch_step),
                       ("scored", False), ("complete", False), ("horizon", horizon)):
    getattr(records, field)[j] = value
  for field in records.played:
    field[j] = 0
  return _put_records(config, loop.programs, _with_engine(state, engine), records)


def restart(loop, state: RunState, params: Any, first: int, now: int) -> RunState:
  """`state` with a fresh pipeline filled as the k steps before step `first` would have left it:
  batches first .. first + k - 1 selected with the curriculum state of step `now` (a fresh run:
  first = 1, now = 0; after a rollback, the steps after it), each queued and followed by a
  step's decoding with `params`, so that every batch has had k steps' decoding when its step
  comes (with `drop` a batch queued without them would be dropped whole)."""
  config = loop.config
  state = attach(config, loop.run, loop.programs, loop.side, loop.root, state)
  version = int(state.train.step)
  for batch_step in range(first, min(first + config.rl.max_staleness, config.rl.steps + 1)):
    state = decode(loop, queue(loop, state, params, batch_step, now), params, version)
  return state


def complete_groups(done: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """bool[S]: the groups every sampled row of which stopped (`done` and `valid` bool[S, G]); a
  group with a sampled row that did not (evicted by `drop`) is incomplete and counts nowhere."""
  return np.all(done | ~valid, axis=1)


def _score(loop, state: RunState, generation: int) -> tuple[RunState, float]:
  """(`state` with generation `generation`'s batch scored on the host, each process its rows
  (`episode_steps.score`), the seconds it took): its complete groups' episodes in its records;
  the others (rows evicted by `drop`) count nowhere."""
  t0 = time.time()
  records = _host_records(state)
  played, complete = episode_steps.score(loop, state.rollouts.engine, records, generation)
  for field, value in zip(records.played, played):
    field[generation] = value
  records.complete[generation], records.scored[generation] = complete, True
  return _put_records(loop.config, loop.programs, state, records), time.time() - t0


def finish(loop, state: RunState, params: Any, step: int,
           version: int) -> tuple[RunState, float]:
  """(`state` with batch `step` scored, the seconds its scoring took): with `wait`, decoded with
  `params` (of `version`) until its rows have all stopped, the turns that ended answered; with
  `drop`, its rows that have not stopped evicted."""
  config = loop.config
  w = generations(config)
  generation = step % w
  records = _host_records(state)
  if records.scored[generation]:
    return state, 0.0
  engine = state.rollouts.engine
  if config.rl.admission == "drop":
    engine = engines.evict(engine, generation, group=loop.programs.sampler["group"])
  else:
    # Rows whose first token ended their turn were never queued: they are answered first.
    engine, _ = episode_steps.answer(loop, engine, records)
    if engines.pending(engine, generation):
      # With one generation the due batch is all there is: decode to the end, slots halving.
      engine = episode_steps.decode(
          loop, engine, records, params, version, _temperature(config, state),
          due=None if w == 1 else generation, shrink=config.rl.decode_shrink if w == 1 else 0)
  return _score(loop, _with_engine(state, engine), generation)


def learn_batch(loop, state: RunState, step: int, key_filter: jax.Array) -> tuple[Batch, dict]:
  """Batch `step` (scored: `finish`) as the learn step takes it (`batches.build_batch`), on the
  learner's mesh, with each token's policy version when rows stay in flight (k > 0); and host
  statistics of it for the log."""
  config, layout = loop.config, loop.layout
  generation = step % generations(config)
  records = _host_records(state)
  rows = engines.harvest(state.rollouts.engine, generation)
  keep = (rows.tokens, rows.logprobs, rows.mask) + ((rows.versions,) if persists(config) else ())
  keep = jax.device_put(keep, jax.tree.map(lambda _: layout.sharding, keep))
  valid = records.valid[generation] & records.complete[generation][:, None]
  played = episodes.Played(*(x[generation] for x in records.played))
  s, g = valid.shape
  scored = batches.Scored(prompt_ids=records.prompt_ids[generation],
                          arms=records.arms[generation], valid=valid,
                          rewards=played.rewards.reshape(s, g),
                          correct=played.correct.reshape(s, g),
                          turn_rewards=played.turn_rewards.reshape(s, g, -1),
                          cut=played.cut.reshape(s, g))
  batch = batches.build_batch(config, loop.run, layout, scored, keep[:3], key_filter,
                              state.prompts, keep[3] if len(keep) > 3 else None)
  selection = Selection(prompt_ids=scored.prompt_ids, arms=scored.arms)
  group_valid = np.asarray(batch.train_valid)
  stats = batches.batch_stats(config, loop.run.pool.num_arms, selection, scored.rewards, valid,
                              group_valid)
  stats.update(episode_steps.batch_stats(loop, records, step, int(state.train.step)))
  if rollout_checks.in_flight(config):
    groups = np.asarray(batch.train_groups)
    trained = valid.any(axis=1)[groups] & group_valid
    stats.update({
        "curriculum/feedback_delay": float(step - records.selected[generation]),
        "rollout/groups_dropped": float(np.sum(records.valid[generation].any(axis=1)
                                               & ~records.complete[generation])),
        "curriculum/arm_trained": np.bincount(scored.arms[groups][trained],
                                              minlength=loop.run.pool.num_arms
                                              ).astype(np.float32)})
  return batch, stats


def learned(loop, state: RunState, step: int, skipped: bool) -> RunState:
  """`state` after batch `step`'s update: the horizon bandit moved by its episodes when the
  update was kept (`episode_steps.update_horizon`); a discarded one teaches it nothing."""
  if skipped:
    return state
  return episode_steps.update_horizon(loop, state, _host_records(state), step)


def decode(loop, state: RunState, params: Any, version: int) -> RunState:
  """`state` after a step's decoding with `params` (of `version`) of the batches queued after the
  step's own (k > 0; nothing at k = 0). Whole batches (no rl.decode_budget): until every queued
  row's episode is over, the slots halving as the rows run out. Partial
  rollouts (rl.decode_budget = b): b loop iterations across turn ends; with `wait`, only while
  every slot has a row or a turn's answer queues one (the rows left go on at the next step,
  beside the next batch's, and the batch due then is decoded to its end anyway), with `drop`
  all b (a batch's rows have the budgets of the steps before its own to stop in)."""
  config = loop.config
  if not persists(config):
    return state
  b = config.rl.decode_budget
  whole = b <= 0
  engine = episode_steps.decode(
      loop, state.rollouts.engine, _host_records(state), params, version,
      _temperature(config, state), budget=None if whole else b,
      fed=not whole and config.rl.admission == "wait",
      shrink=config.rl.decode_shrink if whole else 0)
  return _with_engine(state, engine)


def score_stopped(loop, state: RunState) -> tuple[RunState, float]:
  """(`state` with every batch in flight whose rows have all stopped scored, the seconds it
  took): host work done while the learn step runs, rather than when its step comes. A batch's
  episodes are over once no row of it is queued or decoding: every turn that ended was
  answered when its round of decoding ended."""
  if not persists(loop.config):
    return state, 0.0
  records, seconds = _host_records(state), 0.0
  for generation in range(generations(loop.config)):
    if (records.batch_step[generation] > 0 and not records.scored[generation]
        and not engines.pending(state.rollouts.engine, generation)):
      state, took = _score(loop, state, generation)
      seconds += took
  return state, seconds


def engine_counters(state: RunState) -> np.ndarray:
  """i64[4] (tokens recorded, slot-steps computed, loop iterations, slot-steps that fed an
  occupied slot) of the engine so far."""
  return engines.counters(state.rollouts.engine)


def decode_stats(config: ml_collections.ConfigDict, before: np.ndarray, after: np.ndarray,
                 seconds: float) -> dict:
  """A step's decoding for the log, from `engine_counters` before and after it and the step's
  wall time: the slot-steps computed, the share of them that fed an occupied slot, tokens per
  second of the step; with rollouts in flight also the tokens recorded and loop iterations."""
  tokens, slot_steps, iterations, fed = (after - before).tolist()
  stats = {"rollout/slot_steps": float(slot_steps),
           "rollout/slot_utilisation": fed / max(slot_steps, 1),
           "tokens_per_s": tokens / max(seconds, 1e-9)}
  if rollout_checks.in_flight(config):
    stats.update({"rollout/tokens": float(tokens), "rollout/iterations": float(iterations)})
  return stats
