"""Rollouts in flight across steps: each step learns from a batch queued k steps before while the
next batches decode (rl.max_staleness = k), rows that have not stopped when a step's decoding ends
go on at the next step under its weights (rl.decode_budget: partial rollouts), a batch whose rows
are late when its step comes is waited for or dropped (rl.admission), and the rollouts may decode
on devices of their own (parallel.rollout_devices).

  side = rollout_side(config, programs)            # the rollout mesh and its rows
  state = attach(loop, state)                      # RunState.rollouts: an empty `InFlight`
  state = queue(loop, state, params, j, now)       # batch j selected and its rows queued
  state = finish(loop, state, params, t, version)  # batch t's rows stopped (or dropped), scored
  batch, stats = learn_batch(loop, state, t, key)  # batch t as the learn step takes it
  state = decode(loop, state, params, version)     # a step's decoding
  state = score_stopped(loop, state)               # every batch whose rows have all stopped

The loop (`loop.run_step`) runs step t as: queue batch t + k (selected with the curriculum state
after step t - 1's update), finish batch t, then learn on it and decode at once (on a rollout mesh
of its own the two run on different devices at the same time), then score what stopped. With
W = k + 1 generations of the engine (`sampling.inflight`) holding batches t .. t + k:

  - a token of batch t was drawn at steps t - k .. t by weights of versions >= t - k - 1, and step
    t learns from version t - 1: no trained token is more than k versions old (each token's
    version is in `Batch.versions`; the learn step logs the staleness it saw);
  - the curriculum's feedback on batch t reaches its state with step t's update (in `learn`), k
    steps after the selection; selection t + k reads the state after step t - 1's update;
  - with `wait` every selected group is trained, in selection order (slow groups are paced, not
    lost); with `drop` a group with a row that has not stopped by its step is discarded (it
    counts nowhere, like a skipped prompt), which favours the groups that finish fast;
  - k = 0 and no budget decode each batch to its end before learning from it: the synchronous
    schedule, through the engine;
  - with no budget, each step decodes every queued row to its end: a batch is drawn whole by one
    version, the step after it is queued. With a budget (partial rollouts), a step decodes at
    most b iterations, and with `wait` only while every slot has a row: a batch's long rows go
    on over the next steps beside the rows of the batches queued after it, the slots do not idle
    for a tail, and a step takes about one batch's decoding, not its longest completion's.

Everything in flight (the engine's rows, prompt keys and values, queue; each batch's selection
and scores) is in `RunState.rollouts`, so checkpoints hold it and a resumed run goes on exactly.
A rollback to an older checkpoint (`recovery`) restarts the pipeline: the batches in flight are
dropped and the next k are selected anew from the restored state.

References: Fu et al. (2025), "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning", arXiv:2505.24298 (staleness-bounded asynchronous RL, decoupled PPO); Kimi
Team (2025), "Kimi k1.5: Scaling Reinforcement Learning with LLMs", arXiv:2501.12599 (partial
rollouts).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import rewards as rewards_lib
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.train import budget, builders, programs as programs_lib, rollout_config
from rl_curriculum.train import rollouts
from rl_curriculum.train.prepare import step_keys
from rl_curriculum.train.rl_types import Batch
from rl_curriculum.train.state import RunState
from rl_curriculum.types import Selection

__all__ = ["Records", "InFlight", "Side", "generations", "rollout_side", "attach", "restart",
           "rollout_policy", "queue", "finish", "learn_batch", "decode", "score_stopped",
           "engine_counters", "decode_stats"]


class Records(NamedTuple):
  """What the learner side keeps of each generation's batch (replicated; W generations)."""
  prompt_ids: jax.Array  # i32[W, S] pool indices
  arms: jax.Array        # i32[W, S] curriculum arms
  valid: jax.Array       # bool[W, S, G] completion slots sampled (`budget.slot_mask`)
  selected: jax.Array    # i32[W] the step whose curriculum state selected it (0: before step 1)
  batch_step: jax.Array  # i32[W] the step that learns from it (0: none)
  scored: jax.Array      # bool[W] its completions scored
  rewards: jax.Array     # f32[W, S, G]
  correct: jax.Array     # bool[W, S, G]
  complete: jax.Array    # bool[W, S] every sampled row of the group stopped (False: dropped)


class InFlight(NamedTuple):
  """`RunState.rollouts` of a run with rollouts in flight."""
  engine: continuous.EngineState  # on the rollout mesh
  records: Records


class Side(NamedTuple):
  """Where the rollouts decode."""
  mesh: Any                 # the rollout mesh (the learner's own when not apart)
  layout: rollouts.RowLayout  # a batch's rows over its batch axes
  apart: bool               # on devices of their own (parallel.rollout_devices > 0)
  sent: dict                # under LoRA: {"of": the base last sent, "base": its copy there}


def generations(config: ml_collections.ConfigDict) -> int:
  """W = rl.max_staleness + 1: the batches in flight at a step (its own and the next k)."""
  return config.rl.max_staleness + 1


def rollout_side(config: ml_collections.ConfigDict, rollout_mesh, mesh) -> Side:
  """The rollout mesh (`prepare.rollout_mesh`; the learner's `mesh`, or apart) and the layout of
  a batch's rows on it.

  Raises:
    ConfigError: the rows or the decode slots do not split over its batch axes.
  """
  rollout_config.check_decode_slots(config, mesh_lib.batch_size_of(rollout_mesh))
  return Side(mesh=rollout_mesh, layout=rollouts.row_layout(config, rollout_mesh),
              apart=rollout_mesh is not mesh, sent={})


def _records(config: ml_collections.ConfigDict) -> Records:
  w, s, g = generations(config), builders.sampled_prompts(config), budget.group_slots(config)
  return Records(prompt_ids=np.zeros((w, s), np.int32), arms=np.zeros((w, s), np.int32),
                 valid=np.zeros((w, s, g), bool), selected=np.zeros(w, np.int32),
                 batch_step=np.zeros(w, np.int32), scored=np.zeros(w, bool),
                 rewards=np.zeros((w, s, g), np.float32), correct=np.zeros((w, s, g), bool),
                 complete=np.zeros((w, s), bool))


def _put_records(programs: programs_lib.Programs, state: RunState,
                 records: Records) -> RunState:
  rep = jax.tree.map(lambda _: programs.replicated, records)
  return state._replace(rollouts=state.rollouts._replace(
      records=distributed.place(records, rep)))


def _host_records(state: RunState) -> Records:
  return Records(*(np.array(distributed.to_host(x)) for x in state.rollouts.records))


def rollout_policy(loop, state: RunState) -> Any:
  """The policy's parameters where the rollouts decode: those of `state`, or on a rollout mesh
  apart a copy sent there (under LoRA the adapters every step, the frozen base when it changed:
  the first step, after a ReLoRA merge or a restore)."""
  params = programs_lib.policy(state)
  side = loop.side
  if not side.apart:
    return params
  shardings = loop.programs.rollout_shardings
  if state.base is None:
    return jax.device_put(params, shardings)
  if side.sent.get("of") is not state.base:
    side.sent.update({"of": state.base, "base": jax.device_put(state.base, shardings[1])})
  return jax.device_put(state.train.params, shardings[0]), side.sent["base"]


def _engine_options(programs: programs_lib.Programs, side: Side) -> dict:
  options = programs.sampler
  return dict(max_new_tokens=options["max_new_tokens"], pad_id=options["pad_id"],
              group=options["group"], mesh=side.mesh)


def _run_options(loop, shrink: int) -> dict:
  options = loop.programs.sampler
  return dict(stop_ids=tuple(sorted({options["eos_id"], *options["stop_ids"]})),
              pad_id=options["pad_id"], group=options["group"], mesh=loop.side.mesh,
              shrink=shrink)


def attach(config: ml_collections.ConfigDict, run, programs: programs_lib.Programs, side: Side,
           key: jax.Array, state: RunState) -> RunState:
  """`state` with nothing in flight: an empty engine of W generations on the rollout mesh (for
  `run`'s prompt buffer; `key` stands for the generations' keys until each is queued) and empty
  records."""
  engine = inflight.init(
      programs.graphdef, programs_lib.policy(state), key, rows=side.layout.num_rows,
      generations=generations(config), prompt_len=run.pool.tokens.shape[1],
      slots=config.rl.decode_slots, chunk=config.rl.prefill_chunk,
      **_engine_options(programs, side))
  state = state._replace(rollouts=InFlight(engine=engine, records=None))
  return _put_records(programs, state, _records(config))


def queue(loop, state: RunState, params: Any, batch_step: int, now: int) -> RunState:
  """`state` with batch `batch_step` selected by the curriculum (its state as it is at step
  `now`) and its rows queued in generation batch_step mod W, prefilled with `params`."""
  config, run, side = loop.config, loop.run, loop.side
  k_select, k_sample, _, _ = step_keys(loop.root, batch_step)
  selection, curriculum = loop.programs.select(state.curriculum, k_select)
  state = state._replace(curriculum=curriculum)
  valid = budget.slot_mask(config, selection, state.prompts)  # bool[S, G]
  prompt_ids = np.asarray(selection.prompt_ids)
  layout, g = side.layout, budget.group_slots(config)
  mine = np.repeat(prompt_ids, g)[layout.mine]
  to_global = lambda x: distributed.rows_to_global(x, layout.sharding, layout.num_rows)
  active = distributed.rows_to_global(valid.reshape(-1)[layout.mine],
                                      mesh_lib.batch_sharding(side.mesh, 1), layout.num_rows)
  j = batch_step % generations(config)
  engine = inflight.admit(loop.programs.graphdef, params, state.rollouts.engine,
                          to_global(run.pool.tokens[mine]), to_global(run.pool.mask[mine]),
                          k_sample, jnp.int32(j), active, chunk=config.rl.prefill_chunk,
                          **_engine_options(loop.programs, loop.side))
  records = _host_records(state)
  for field, value in (("prompt_ids", prompt_ids), ("arms", np.asarray(selection.arms)),
                       ("valid", valid), ("selected", now), ("batch_step", batch_step),
                       ("scored", False), ("rewards", 0.0), ("correct", False),
                       ("complete", False)):
    getattr(records, field)[j] = value
  state = state._replace(rollouts=state.rollouts._replace(engine=engine))
  return _put_records(loop.programs, state, records)


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


def _score(loop, state: RunState, generation: int) -> RunState:
  """`state` with generation `generation`'s batch scored on the host (each process its rows):
  its groups whose sampled rows all stopped get their rewards and correctness; the others (rows
  evicted by `drop`) are incomplete and count nowhere."""
  run, layout = loop.run, loop.side.layout
  rows = inflight.harvest(state.rollouts.engine, jnp.int32(generation))
  records = _host_records(state)
  valid = records.valid[generation]
  s, g = valid.shape
  done = np.asarray(distributed.to_host(rows.done)).reshape(s, g)
  complete = np.all(done | ~valid, axis=1)
  sampled = (valid & complete[:, None]).reshape(-1)
  prompt_rows = np.repeat(records.prompt_ids[generation], g)[layout.mine]
  mine = rollouts.score_completions(run.task, run.pool, prompt_rows,
                                    distributed.local_rows(rows.tokens), run.tokenizer.decode,
                                    sampled[layout.mine])
  rewards, correct = (distributed.gather_rows(x, layout.mine, layout.num_rows).reshape(s, g)
                      for x in mine)
  records.rewards[generation], records.correct[generation] = rewards, correct
  records.complete[generation], records.scored[generation] = complete, True
  return _put_records(loop.programs, state, records)


def finish(loop, state: RunState, params: Any, step: int, version: int) -> RunState:
  """`state` with batch `step` scored: with `wait`, decoded with `params` (of `version`) until
  its rows have all stopped; with `drop`, its rows that have not stopped evicted."""
  config = loop.config
  w = generations(config)
  generation = step % w
  if _host_records(state).scored[generation]:
    return state
  engine = state.rollouts.engine
  if config.rl.admission == "drop":
    engine = inflight.evict(engine, jnp.int32(generation))
  else:
    # With one generation the due batch is all there is: decode to the end, slots halving.
    due = None if w == 1 else jnp.int32(generation)
    engine = continuous.run(loop.programs.graphdef, params, engine,
                            jnp.float32(config.rl.temperature), jnp.int32(version), None, due,
                            **_run_options(loop, config.rl.decode_shrink if w == 1 else 0))
  state = state._replace(rollouts=state.rollouts._replace(engine=engine))
  return _score(loop, state, generation)


def learn_batch(loop, state: RunState, step: int, key_filter: jax.Array) -> tuple[Batch, dict]:
  """Batch `step` (scored: `finish`) as the learn step takes it, on the learner's mesh, with
  each token's policy version; and host statistics of it for the log."""
  config, run, layout = loop.config, loop.run, loop.layout
  generation = step % generations(config)
  records = _host_records(state)
  rows = inflight.harvest(state.rollouts.engine, jnp.int32(generation))._replace(done=None)
  rows = jax.device_put(rows, jax.tree.map(lambda _: layout.sharding, rows))
  prompt_ids, g = records.prompt_ids[generation], budget.group_slots(config)
  valid = records.valid[generation] & records.complete[generation][:, None]
  correct = records.correct[generation]
  mine = np.repeat(prompt_ids, g)[layout.mine]
  to_global = lambda x: distributed.rows_to_global(x, layout.sharding, layout.num_rows)
  groups, group_valid = rollouts.train_groups(config, correct, valid, config.rl.prompts_per_step,
                                              key_filter)
  baseline = None
  if config.rl.algorithm == "counterfactual":
    baseline = jnp.asarray(budget.success_mean(state.prompts, prompt_ids))
  stop = (run.tokenizer.eos_id, *run.stop_ids)
  batch = Batch(
      prompt_tokens=to_global(run.pool.tokens[mine]), prompt_mask=to_global(run.pool.mask[mine]),
      tokens=rows.tokens, mask=rows.mask, sampler_logprobs=rows.logprobs,
      prompt_ids=jnp.asarray(prompt_ids), arms=jnp.asarray(records.arms[generation]),
      rewards=jnp.asarray(records.rewards[generation]), correct=jnp.asarray(correct),
      valid=jnp.asarray(valid), train_groups=jnp.asarray(groups),
      train_valid=jnp.asarray(group_valid), baseline=baseline,
      truncated=rewards_lib.truncated_completions(rows.tokens, rows.mask, stop).reshape(-1, g),
      versions=rows.versions)
  selection = Selection(prompt_ids=prompt_ids, arms=records.arms[generation])
  stats = rollouts.batch_stats(config, run.pool.num_arms, selection,
                               records.rewards[generation], valid, group_valid)
  trained = valid.any(axis=1)[groups] & group_valid
  stats.update({
      "curriculum/feedback_delay": float(step - records.selected[generation]),
      "rollout/groups_dropped": float(np.sum(records.valid[generation].any(axis=1)
                                             & ~records.complete[generation])),
      "curriculum/arm_trained": np.bincount(records.arms[generation][groups][trained],
                                            minlength=run.pool.num_arms).astype(np.float32)})
  return batch, stats


def decode(loop, state: RunState, params: Any, version: int) -> RunState:
  """`state` after a step's decoding with `params` (of `version`). Whole batches (no
  rl.decode_budget): until every queued row stops, the slots halving as the rows run out.
  Partial rollouts (rl.decode_budget = b): b loop iterations; with `wait`, only while every slot
  has a row (the rows left go on at the next step, beside the next batch's, and the batch due
  then is decoded to its end anyway), with `drop` all b (a batch's rows have the budgets of the
  steps before its own to stop in)."""
  config = loop.config
  b = config.rl.decode_budget
  whole = b <= 0
  engine = continuous.run(loop.programs.graphdef, params, state.rollouts.engine,
                          jnp.float32(config.rl.temperature), jnp.int32(version),
                          None if whole else jnp.int32(b), None,
                          **_run_options(loop, config.rl.decode_shrink if whole else 0),
                          fed=not whole and config.rl.admission == "wait")
  return state._replace(rollouts=state.rollouts._replace(engine=engine))


def score_stopped(loop, state: RunState) -> RunState:
  """`state` with every batch in flight whose rows have all stopped scored (host work done while
  the learn step runs, rather than when its step comes)."""
  records = _host_records(state)
  for generation in range(generations(loop.config)):
    if (records.batch_step[generation] > 0 and not records.scored[generation]
        and not bool(inflight.pending(state.rollouts.engine, jnp.int32(generation)))):
      state = _score(loop, state, generation)
  return state


def engine_counters(state: RunState) -> np.ndarray:
  """i64[3] (tokens drawn, slot-steps, loop iterations) of the engine so far."""
  engine = state.rollouts.engine
  return np.asarray([int(engine.drawn), int(engine.slot_steps), int(engine.iterations)],
                    np.int64)


def decode_stats(before: np.ndarray, after: np.ndarray, seconds: float) -> dict:
  """A step's decoding for the log, from `engine_counters` before and after it and the step's
  wall time: tokens drawn, slot-steps, their share that drew a token, loop iterations."""
  tokens, slot_steps, iterations = (after - before).tolist()
  return {"rollout/tokens": float(tokens), "rollout/slot_steps": float(slot_steps),
          "rollout/slot_utilisation": tokens / max(slot_steps, 1),
          "rollout/iterations": float(iterations),
          "tokens_per_s": tokens / max(seconds, 1e-9)}
