"""`train_and_evaluate(config, workdir)`: the whole experiment, in labelled phases.

  1-3. preparation   config checks (once, before anything is built), the workdir locked and its
                     config compared with the one its checkpoints were made with (`workdir`),
                     data and tokenizer, model and SFT warm start (`prepare`)
  4. RL state        the run's programs (`programs.build`, the builder the memory planner uses
                     too), a fresh `RunState` placed on the mesh, or the newest checkpoint's
  5. loop            each step on the one `RunState` (`run_step`, one path for every schedule:
                     `pipeline`): queue the batch k = rl.max_staleness steps ahead (k = 0: this
                     step's) -> finish and score this step's -> learn (one jit) while the later
                     batches decode -> score what stopped -> log / evaluate / save
  6. report          before/after table, report.png, report.html, summary.json (`summary`)

Per-step randomness is `fold_in(root_key, step)`, and everything that evolves (the run state:
train and curriculum states, data cursors, per-prompt statistics, the base weights LoRA merging
changes, the health record of `recovery`) is in the checkpoint, so a run killed at any point and
started again with the same command finishes with the same parameters and metrics.
"""

import os
import signal
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import ml_collections

from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.plan import targets
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train.durable import checkpointing
from rl_curriculum.train.durable import recovery
from rl_curriculum.train.durable import workdir as workdir_lib
from rl_curriculum.train.learn import relora
from rl_curriculum.train.report import summary
from rl_curriculum.train.report.metrics import MetricsWriter
from rl_curriculum.train.rollout import budget, pipeline
from rl_curriculum.train.rollout import batches
from rl_curriculum.train.rollout import episode_steps
from rl_curriculum.curriculum import horizon
from rl_curriculum.train.setup import features
from rl_curriculum.train.setup import validation
from rl_curriculum.train.setup.prepare import (Prepared, prepare, rl_root_key, rollout_mesh, run_mesh,
                                        step_keys, token_ids)
from rl_curriculum.train.state import RunState, checkpoint_tree, with_checkpoint

__all__ = ["Loop", "fresh_state", "restore_params", "step_keys", "run_step",
           "train_and_evaluate"]


class _Preemption:
  """Turns SIGTERM into a flag the loop checks between steps (save, then exit cleanly)."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. a notebook worker): no handler
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class Loop(NamedTuple):
  """What the steps of a run share besides the run state, which they take and return."""
  config: ml_collections.ConfigDict
  run: Prepared
  programs: programs_lib.Programs
  layout: batches.RowLayout
  ref: Any                   # the KL reference's weights on the mesh, or None
  root: jax.Array            # the RL phase's root key (`prepare.rl_root_key`)
  manager: Any               # the checkpoint manager of workdir/checkpoints
  merge: Optional[Callable]  # ReLoRA's jitted merge (`relora.make_merge`), or None
  log: Callable[[str], None]  # prints on process 0
  workdir: str
  side: pipeline.Side        # where the rollouts decode (`pipeline.rollout_side`)
  plan_bound_s: Optional[float] = None  # the planner's bound on a step (`plan_bound`), or None


# ------------------------------------------------------------------------------------------------
# Phase 4: RL state.
# ------------------------------------------------------------------------------------------------

def fresh_state(config: ml_collections.ConfigDict, run: Prepared,
                mesh) -> tuple[programs_lib.Programs, RunState]:
  """The run's programs and its state before the first step (not yet placed, but for an empty
  pipeline's engine when rollouts are in flight): the curriculum over the RL pool (with PCL's
  features of the starting policy) initialised with key 0 of the root (steps count from 1, so
  no step draws it)."""
  pool = features.curriculum_pool(config, run)
  rollouts_on = rollout_mesh(config, mesh, run.model)
  programs = programs_lib.build(config, run.model, mesh, pool, token_ids(run), rollouts_on)
  state = programs_lib.init_run_state(config, programs, run.model, pool,
                                      jax.random.fold_in(rl_root_key(config), 0))
  if episode_steps.turn_width(config, run.task) > 1:  # horizons to choose among
    state = state._replace(horizon=horizon.init(config.rl.max_turns))
  if pipeline.persists(config):
    side = pipeline.rollout_side(config, rollouts_on, mesh)
    state = pipeline.attach(config, run, programs, side, rl_root_key(config), state)
  return programs, state


def restore_params(config: ml_collections.ConfigDict, run: Prepared, workdir: str, step=None):
  """(step, model params) of RL checkpoint `step` (None: the newest) in workdir, or (0, the warm
  start) when there is none."""
  _, state = fresh_state(config, run, run_mesh(config))
  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
  like = checkpoint_tree(config, state)
  restored = (checkpointing.restore_latest(manager, like, _main_process_print, set_aside=False)
              if step is None else checkpointing.restore(manager, step, like))
  manager.close()
  if restored is None:
    return 0, programs_lib.policy(state)
  return restored[0], programs_lib.policy(with_checkpoint(state, restored[1]))


def _main_process_print(text: str) -> None:
  if jax.process_index() == 0:
    print(text, flush=True)


def _restore(loop: Loop, state: RunState) -> tuple[int, RunState, Optional[dict]]:
  """(step, state, accuracy before RL) of the newest intact checkpoint, or (0, `state`, None)."""
  restored = checkpointing.restore_latest(loop.manager, checkpoint_tree(loop.config, state),
                                          loop.log)
  if restored is None:
    return 0, state, None
  step, tree, meta = restored
  state = with_checkpoint(state, tree)._replace(health=recovery.from_meta(meta, step))
  loop.log(f"resumed from step {step}")
  return step, state, meta.get("before")


def _save(loop: Loop, step: int, state: RunState, before: dict) -> None:
  checkpointing.save(loop.manager, step, checkpoint_tree(loop.config, state),
                     {"before": before, "step": step, **recovery.meta(state.health)})


def _start(config: ml_collections.ConfigDict, workdir: str,
           task) -> tuple[Loop, RunState, int, dict]:
  """Phases 2-4 (the config checked, the workdir locked): (loop, placed run state, step it
  continues after, held-out accuracy before RL, measured now on a fresh run)."""
  mesh = run_mesh(config)
  layout = batches.row_layout(config, mesh)
  if config.parallel.rollout_layout != "auto":  # checked before the warm start trains
    pipeline.rollout_side(config, rollout_mesh(config, mesh), mesh)
  log = _main_process_print
  run = prepare(config, workdir, log, task=task)
  programs, state = fresh_state(config, run, mesh)
  side = pipeline.rollout_side(config, programs.rollout_mesh, mesh)
  log(mesh_lib.describe(mesh))
  if side.moved and not side.apart:
    log(f"rollouts decode a copy of the weights made once a step: "
        f"{mesh_lib.describe(programs.rollout_mesh)}")
  merge = (relora.make_merge(programs.optimizer, programs.train_shardings,
                             programs.base_shardings)
           if config.model.lora_merge_every > 0 else None)
  loop = Loop(config=config, run=run, programs=programs, layout=layout,
              ref=programs_lib.place_reference(programs,
                                               programs_lib.reference(config, run.model)),
              root=rl_root_key(config), log=log, merge=merge, workdir=workdir,
              manager=checkpointing.make_manager(os.path.join(workdir, "checkpoints"),
                                                 max_to_keep=config.checkpoint.keep,
                                                 writer=True),
              side=side, plan_bound_s=plan_bound(config, run, log))
  start, state, before = _restore(loop, programs_lib.place(programs, state))
  if pipeline.persists(config) and start == 0:  # the batches of steps 1 .. k, selected before 1
    state = pipeline.restart(loop, state, pipeline.rollout_policy(loop, state), 1, 0)
  if jax.process_index() == 0:  # once the checkpoint fits: the config its next steps are made by
    workdir_lib.record_config(config, workdir)
  if before is None:
    before = summary.evaluate(config, run, programs_lib.policy(state), record=_record(loop, 0))
  return loop, state, start, before


def plan_bound(config: ml_collections.ConfigDict, run: Prepared,
               log: Callable[[str], None]) -> Optional[float]:
  """On TPU chips the planner knows (`targets.chip_of`) and with `eval.plan_bound`: the
  roofline bound on one step of this run, its programs compiled for these devices by the
  planner (`planner.plan`, at the pool's prompt length), logged once with the step's physical
  limit; each step's metrics then hold it beside the measured time. None elsewhere."""
  if not config.eval.plan_bound or targets.chip_of(jax.devices()[0]) is None:
    return None
  from rl_curriculum.plan import planner  # pylint: disable=import-outside-toplevel
  try:
    plan = planner.plan(config, prompt_len=int(run.pool.tokens.shape[1]))
  except Exception as e:  # pylint: disable=broad-except  (a log line must not stop the run)
    log(f"plan: could not plan this run's step ({type(e).__name__}: {str(e)[:200]}); no bound "
        "is logged beside its steps")
    return None
  bounds = plan["roofline"]
  if bounds["step_s"] is None:
    log("plan: a program did not compile for these devices; no bound on a step")
    return None
  limit = bounds["step_limit_s"]
  log(f"plan on {plan['devices']} {plan['chip']['name']} chips: a step takes at least "
      f"{bounds['step_s']:.3f} s by the compiler's counts (physical limit "
      f"{'-' if limit is None else f'{limit:.3f}'} s); each step logs time/step_s beside it")
  return bounds["step_s"]


def _record(loop: Loop, step: int) -> Optional[str]:
  """Where the evaluation after step `step` keeps its per-problem outcomes (process 0)."""
  return summary.outcomes_path(loop.workdir, step) if jax.process_index() == 0 else None


# ------------------------------------------------------------------------------------------------
# Phase 5: one step.
# ------------------------------------------------------------------------------------------------

def _learn(loop: Loop, state: RunState, batch, key: jax.Array, step: int) -> tuple[RunState,
                                                                                   dict]:
  """The learn half of step `step`: the per-prompt statistics observe the batch, the learn
  program updates the train and curriculum states, PCL's features follow the policy. The
  metrics are the program's, still on the devices (nothing waits for it to finish)."""
  config, rep = loop.config, loop.programs.replicated
  prompts = budget.observe(state.prompts, batch, step)
  state = state._replace(prompts=distributed.place(prompts, jax.tree.map(lambda _: rep, prompts)))
  train, curriculum, metrics = loop.programs.learn(
      *programs_lib.learn_inputs(loop.programs, state, batch, key, loop.ref))
  state = features.refresh_features(config, loop.run, step,
                                    state._replace(train=train, curriculum=curriculum), rep)
  if config.parallel.check_replicated:
    distributed.assert_replicated(state.curriculum, f"curriculum state after step {step}")
  return state, metrics


def _after_update(loop: Loop, state: RunState, step: int, learned: dict,
                  log: Callable[[str], None]) -> tuple[RunState, dict]:
  """The run state after step `step`'s update (`learned`: its metrics): its health record, a
  rollback when one is due (a skip streak, a collapse; a collapse may instead set
  `health.stopped`), a ReLoRA merge when one is due; and their metrics."""
  config = loop.config
  health = recovery.after_update(state.health, step, bool(learned["update_skipped"]))
  health, why = recovery.after_check(config, health, learned, loop.run.tokenizer.vocab_size)
  state = recovery.roll_back_if_due(config, loop.manager, state._replace(health=health), log)
  state = recovery.act_on_collapse(config, loop.manager, state, step, why, log)
  state, metrics = relora.maybe_merge(config, step, loop.root, state, loop.merge)
  metrics.update(recovery.metrics(config, state.health))
  return state, metrics


def run_step(loop: Loop, state: RunState, step: int,
             log: Callable[[str], None]) -> tuple[RunState, dict]:
  """One RL step on the run state, the one path for every schedule (`pipeline`; k =
  rl.max_staleness, 0 for the synchronous run): queue the batch of step `step` + k, finish and
  score batch `step`, learn from it while the batches queued after it decode (learn first when
  the rollouts have devices of their own, so that both run at once; else decode first, which
  reads the weights the learn step then donates), score the batches whose rows all stopped;
  then the health record, a rollback when one is due, a ReLoRA merge. Returns the state after
  the step and its metrics (held-out evaluation aside; the names are listed in
  docs/concepts.md#what-a-step-logs).

  A discarded update (`update_skipped`: the learn step's own rollback) leaves everything the
  step's batch would have taught as it was: the learn program keeps the train and curriculum
  states, the per-prompt statistics the batch updated are put back here, and the horizon bandit
  moves only with a kept update (`pipeline.learned`)."""
  config = loop.config
  _, _, k_learn, k_filter = step_keys(loop.root, step)
  t0 = time.time()
  version = int(state.train.step)
  params = pipeline.rollout_policy(loop, state)
  if state.rollouts is None:  # k = 0: nothing outlives a step
    state = pipeline.attach(config, loop.run, loop.programs, loop.side, loop.root, state)
  before = pipeline.engine_counters(state)
  if step + config.rl.max_staleness <= config.rl.steps:
    state = pipeline.queue(loop, state, params, step + config.rl.max_staleness, step)
  state, scoring = pipeline.finish(loop, state, params, step, version)
  batch, stats = pipeline.learn_batch(loop, state, step, k_filter)
  t1 = time.time()
  prompts = state.prompts
  if loop.side.apart:
    state, learned = _learn(loop, state, batch, k_learn, step)
    state = pipeline.decode(loop, state, params, version)
  else:
    state = pipeline.decode(loop, state, params, version)
    del params  # the engine's copy (rollout_layout) is not kept beside the learn step
    state, learned = _learn(loop, state, batch, k_learn, step)
  state, stopped = pipeline.score_stopped(loop, state)
  learned = jax.device_get(learned)
  t2 = time.time()
  counters = pipeline.engine_counters(state)
  state = pipeline.learned(loop, state, step, bool(learned["update_skipped"]))
  if not pipeline.persists(config):
    state = state._replace(rollouts=None)
  if learned["update_skipped"]:
    state = state._replace(prompts=prompts)
  metrics = {**learned, **stats, **pipeline.decode_stats(config, before, counters, t2 - t0),
             "time/sample_s": t1 - t0 - scoring, "time/score_s": scoring + stopped,
             "time/learn_s": t2 - t1 - stopped, "time/step_s": t2 - t0}
  if loop.plan_bound_s:
    metrics.update({"time/plan_bound_s": loop.plan_bound_s,
                    "time/step_over_plan_bound": (t2 - t0) / loop.plan_bound_s})
  rollbacks = state.health.rollbacks
  state, after = _after_update(loop, state, step, metrics, log)
  if pipeline.persists(config) and state.health.rollbacks != rollbacks:
    # The restored batches in flight are not this step's: select the next k anew.
    state = pipeline.restart(loop, state, pipeline.rollout_policy(loop, state), step + 1, step)
  return state, {**metrics, **after}


# ------------------------------------------------------------------------------------------------
# The experiment.
# ------------------------------------------------------------------------------------------------

def _save_due(config: ml_collections.ConfigDict, state: RunState, step: int) -> bool:
  """Whether step `step` writes a checkpoint: periodically outside a skip streak or a run of
  collapsed-looking steps (`recovery.may_save`), and the last."""
  periodic = (step % config.checkpoint.every == 0
              and recovery.may_save(state.health, config.checkpoint.rollback_after))
  return periodic or step == config.rl.steps


def _run_steps(loop: Loop, state: RunState, start: int, before: dict, writer: MetricsWriter,
               first: dict) -> Optional[int]:
  """Phase 5: steps start + 1 ... rl.steps, each logged (`first`: extra metrics of the first
  one) and saved when due. Returns the step a SIGTERM stopped after, or None.

  Raises:
    recovery.Collapsed: the policy collapsed and `checkpoint.on_collapse` stops the run (the
      step's metrics are written, its state is not saved).
  """
  config, run = loop.config, loop.run
  with _Preemption() as preemption:
    for step in range(start + 1, config.rl.steps + 1):
      state, metrics = run_step(loop, state, step, writer.print)
      accuracy = None
      if step % config.eval.every == 0 or step == config.rl.steps:
        accuracy = summary.evaluate(config, run, programs_lib.policy(state),
                                    record=_record(loop, step))
        metrics.update(summary.eval_metrics(config, run, accuracy, before))
      writer.write(step, {**metrics, **(first if step == start + 1 else {})})
      if accuracy is not None and step < config.rl.steps:  # the last one ends in the table
        writer.print(summary.eval_line(step, accuracy, before, run.ood))
      if state.health.stopped:
        raise recovery.Collapsed(state.health.stopped)
      if jax.process_count() > 1:  # a SIGTERM that reached one host stops them all
        preemption.requested = distributed.any_process(preemption.requested)
      if _save_due(config, state, step) or preemption.requested:
        _save(loop, step, state, before)
      if preemption.requested:
        writer.print(f"SIGTERM: saved step {step}; run the same command to resume")
        return step
  return None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       allow_config_change: bool = False) -> dict:
  """Runs (or resumes) the experiment described by `config` in `workdir`; returns a summary.

  The workdir is locked while the run writes it (`workdir.Lock`). A resumed run must have the
  config its checkpoints were made with, up to `workdir.SAFE_TO_CHANGE`; `allow_config_change`
  lets it go on with other values, logged in metrics.jsonl at the step they take effect.
  Multi-process runs (config.parallel, docs/scaling.md) run this on every process; only process
  0 writes logs and reports, and the others return {"process_index": i}.

  Raises:
    validation.ConfigError: a config field the run cannot use, before anything is built
      (`workdir.ConfigChanged`: a resumed run's config differs from its workdir's).
    workdir.WorkdirBusy: another process is writing the workdir.
    ValueError: the workdir's caches were made with other settings (`warm_start.check_workdir`).
    checkpointing.CheckpointError: a checkpoint could not be written (the run stops there).
    recovery.Collapsed: the policy collapsed (`checkpoint.on_collapse`).
  """
  task = validation.checked_task(config)  # the one check, before anything starts
  distributed.initialize(config.parallel.coordinator_address or None,
                         config.parallel.num_processes, config.parallel.process_id)
  is_main = jax.process_index() == 0
  with workdir_lib.Lock(workdir, enabled=is_main):
    changes = workdir_lib.check_config(config, workdir, allow_changes=allow_config_change)
    done = summary.finished(config, workdir) if is_main else None
    if distributed.any_process(done is not None):
      if not is_main:
        return {"process_index": jax.process_index()}
      _main_process_print(
          f"already finished: {workdir} holds all {config.rl.steps} RL steps of this config "
          f"(summary.json, report.png); nothing to do. A fresh --workdir, or a larger "
          f"--config.rl.steps, trains on.")
      if done.get("table"):
        _main_process_print("\nHeld-out greedy accuracy per bin (%):\n" + done["table"])
      return done
    loop, state, start, before = _start(config, workdir, task)
    first = {}
    if changes:
      first = {"config_change": workdir_lib.describe_changes(changes)}
      loop.log(f"resuming with a changed config: {first['config_change']}")
    writer = MetricsWriter(workdir, total_steps=config.rl.steps, resume_step=start,
                           enabled=is_main, console_keys=("reward_mean", "correct_mean",
                                                          "nonzero_adv_frac"))
    try:
      if start == 0:
        writer.write(0, summary.eval_metrics(config, loop.run, before, before))
      preempted_at = _run_steps(loop, state, start, before, writer, first)
    finally:
      writer.close()
    if preempted_at is not None:
      return {"preempted_at": preempted_at}
    distributed.sync("metrics written")
    if not is_main:
      return {"process_index": jax.process_index()}
    return summary.final_report(config, loop.run, workdir, before, loop.log)
