"""Rollback to the newest healthy checkpoint after `checkpoint.rollback_after` skipped updates in
a row.

Reference: Haque, Islam and Karray (2026), "Towards Robust Reinforcement Learning for Small-Scale
Language Model Agents", IEEE SMC 2026 (no arXiv id): roll back to the last good state when
training goes wrong.

The learn step already undoes one bad update (non-finite, or KL(pi_old || pi_new) above
`rl.max_kl`): after a skipped update the state is the one from before it. So after N skips in a
row the run sits at the state that every one of those N updates failed from, the result of the
last accepted update. A rollback goes back beyond it, to the newest checkpoint that

  - was saved healthy: no skip streak when it was saved, and
  - holds a state from before that last accepted update (its `origin`, the step of the accepted
    update its parameters come from, is smaller than the current state's).

A second rollback from the restored state goes further back in the same way. The train state
(parameters, optimizer, whitening, a PPO value head), the curriculum state and, under LoRA
merging, the base weights are restored; the counters `TrainState.step` and `skipped` keep
counting what happened. The run continues at the current step number: steps draw their keys
from fold_in(root, step), so restarting at the checkpoint's step number would replay the same
selections, rollouts and minibatches from the same state, and with them the same failure.

While a skip streak lasts the periodic checkpoints are not written (the state is that of the
streak's start, which the checkpoint before it already holds; a resumed run replays the streak
exactly): otherwise `checkpoint.keep` would soon hold only the failing state. The final and the
preemption checkpoints are written regardless, marked with their streak.

  state = state._replace(health=recovery.after_update(state.health, step, skipped))
  state = recovery.roll_back_if_due(config, manager, state, log)

A collapsed policy (`collapse`: one that became uniform, no gradient although groups have an
advantage, optionally no entropy or a reward cliff) passes those checks, so its updates are
accepted. After `checkpoint.collapse_after` steps in a row that look collapsed, `act_on_collapse`
rolls back to the newest healthy checkpoint holding a state from before the first of them (a step's
metrics measure the policy its update started from, so the state of the update before that first
step is the last one known healthy; checkpoints written on the way into an earlier collapse are
passed over), or stops the run (`checkpoint.on_collapse = "stop"`, or "rollback" with no such
checkpoint, or when a second collapse would roll back to the checkpoint the first one did: the run
would only go round in a circle). Periodic checkpoints pause during such a streak as during a skip
streak.

`Health` is host-side (Python numbers) and a field of the run state (`state.RunState`); every
checkpoint's metadata holds it (`meta`), and a resumed run continues from it (`from_meta`).
"""

import math
from typing import Callable, Mapping, NamedTuple, Optional

import ml_collections
import orbax.checkpoint as ocp

from rl_curriculum.train.durable import checkpointing, collapse
from rl_curriculum.train.state import RunState, checkpoint_tree, with_checkpoint

__all__ = ["ON_COLLAPSE", "Health", "Collapsed", "from_meta", "meta", "after_update", "due",
           "may_save", "target", "roll_back", "roll_back_if_due", "after_check",
           "act_on_collapse", "metrics"]


ON_COLLAPSE = ("rollback", "stop")  # checkpoint.on_collapse


class Health(NamedTuple):
  """The loop's record of skipped updates, collapsed-looking steps and rollbacks."""
  streak: int     # skipped updates in a row, up to the last step
  origin: int     # step of the accepted update the train state comes from (0: the initial state)
  rollbacks: int  # rollbacks so far
  collapsed: int = 0              # steps in a row whose metrics look collapsed (`collapse`)
  reward_mean: Optional[float] = None  # running mean of the reward over the healthy steps
  collapse_target: int = -1       # checkpoint the last collapse rolled back to (-1: none)
  collapse_at: int = -1           # step at which it did
  entropy_min: Optional[float] = None  # lowest entropy of the healthy steps (None: none yet)
  stopped: str = ""               # why the run must stop now ("" = it goes on)


class Collapsed(RuntimeError):
  """The policy collapsed and the run stopped (`checkpoint.on_collapse`); the message says why
  and which checkpoint holds the last healthy state."""


def from_meta(meta: dict, step: int) -> Health:
  """The Health a checkpoint of `step` recorded in its metadata; one without a record (a
  checkpoint written before Health existed) counts as healthy, its state from `step`."""
  record = meta.get("health")
  return (Health(**record)._replace(stopped="") if record
          else Health(streak=0, origin=step, rollbacks=0))


def meta(health: Health) -> dict:
  """The checkpoint metadata entry of `health`."""
  return {"health": health._asdict()}


def after_update(health: Health, step: int, skipped: bool) -> Health:
  """Health after step `step`'s update: a skip lengthens the streak, an accepted update ends it
  and becomes the state's origin."""
  if skipped:
    return health._replace(streak=health.streak + 1)
  return health._replace(streak=0, origin=step)


def due(health: Health, rollback_after: int) -> bool:
  """Whether to roll back: `rollback_after` > 0 skipped updates in a row."""
  return rollback_after > 0 and health.streak >= rollback_after


def may_save(health: Health, rollback_after: int) -> bool:
  """Whether a periodic checkpoint is written: outside a run of collapsed-looking steps, and
  without rollbacks always, else outside a skip streak."""
  return health.collapsed == 0 and (rollback_after <= 0 or health.streak == 0)


def _healthy(m: dict, step: int) -> bool:
  h = from_meta(m, step)
  return h.streak == 0 and h.collapsed == 0


def target(metas: dict[int, dict], origin: int,
           abandoned: tuple[int, int] = (-1, -1)) -> Optional[int]:
  """The newest checkpoint step among `metas` ({step: metadata}) saved healthy (no skip streak,
  no collapsed-looking step) with a state from before `origin`, or None. Steps in
  (abandoned[0], abandoned[1]] are passed over: written on the way into a collapse that a
  rollback left."""
  good = [step for step, m in metas.items()
          if _healthy(m, step) and from_meta(m, step).origin < origin
          and not abandoned[0] < step <= abandoned[1]]
  return max(good) if good else None


def _restore(manager: ocp.CheckpointManager, config: ml_collections.ConfigDict, state: RunState,
             step: int) -> tuple[RunState, int]:
  """(`state` with checkpoint `step` restored, the origin of its state): the train and curriculum
  states and what else the run checkpoints (`state.checkpoint_tree`), in `state`'s structure and
  shardings, keeping the current `step` and `skipped` counters of the train state."""
  _, restored, restored_meta = checkpointing.restore(manager, step,
                                                     checkpoint_tree(config, state))
  train = restored["train"]._replace(step=state.train.step, skipped=state.train.skipped)
  return (with_checkpoint(state, {**restored, "train": train}),
          from_meta(restored_meta, step).origin)


def roll_back(manager: ocp.CheckpointManager, config: ml_collections.ConfigDict,
              state: RunState, log: Callable[[str], None]) -> RunState:
  """The run state after a rollback from `state` after a skip streak.

  Restores the `target` checkpoint (`_restore`); the streak ends and `rollbacks` counts one
  more. Without a target the state stays, the streak ends, and a line says so.
  """
  health = state.health
  step = target(checkpointing.metadata(manager), health.origin)
  if step is None:
    log(f"{health.streak} updates in a row skipped; no healthy checkpoint from before step "
        f"{health.origin} to roll back to: continuing")
    return state._replace(health=health._replace(streak=0))
  state, origin = _restore(manager, config, state, step)
  log(f"{health.streak} updates in a row skipped: rolled back to the checkpoint of step {step} "
      f"(its state from step {origin}); rollback {health.rollbacks + 1}")
  return state._replace(health=health._replace(streak=0, origin=origin,
                                               rollbacks=health.rollbacks + 1))


def roll_back_if_due(config: ml_collections.ConfigDict, manager: ocp.CheckpointManager,
                     state: RunState, log: Callable[[str], None]) -> RunState:
  """`roll_back` after `checkpoint.rollback_after` skipped updates in a row (`due`), else
  `state` as it is."""
  if not due(state.health, config.checkpoint.rollback_after):
    return state
  return roll_back(manager, config, state, log)


def after_check(config: ml_collections.ConfigDict, health: Health, metrics: Mapping,
                vocab_size: int) -> tuple[Health, Optional[str]]:
  """Health after looking at a step's metrics for a collapse (`collapse.reason`), and the reason
  when the step looks collapsed: a collapsed-looking step lengthens the run of them; a healthy
  one ends it and feeds the reward's running mean. Off (`checkpoint.collapse_after` = 0): as is."""
  c = config.checkpoint
  if c.collapse_after <= 0:
    return health, None
  why = collapse.reason(metrics, vocab_size=vocab_size, min_entropy=c.collapse_entropy,
                        reward_drop=c.collapse_reward_drop, reward_mean=health.reward_mean,
                        entropy_min=health.entropy_min)
  if why is not None:
    return health._replace(collapsed=health.collapsed + 1), why
  if float(metrics.get("steps_taken", 0.0)) <= 0 or not math.isfinite(
      float(metrics["reward_mean"])):
    return health._replace(collapsed=0), None
  entropy = float(metrics["entropy"])
  return health._replace(collapsed=0, reward_mean=collapse.reward_mean_after(
      health.reward_mean, metrics), entropy_min=entropy if health.entropy_min is None
                         else min(health.entropy_min, entropy)), None


def act_on_collapse(config: ml_collections.ConfigDict, manager: ocp.CheckpointManager,
                    state: RunState, step: int, why: Optional[str],
                    log: Callable[[str], None]) -> RunState:
  """After step `step`: nothing until `checkpoint.collapse_after` collapsed-looking steps in a
  row; then the rollback to the newest healthy checkpoint from before the first of them, or
  `health.stopped` set to the reason (the loop writes the step's metrics and raises
  `Collapsed`)."""
  health, c = state.health, config.checkpoint
  if why is not None:
    log(f"step {step} looks collapsed ({health.collapsed} of {c.collapse_after}): {why}")
  if c.collapse_after <= 0 or health.collapsed < c.collapse_after:
    return state
  first = step - health.collapsed + 1
  # Step `first` measured the state of the update before it: the update before that is the
  # last one known healthy.
  found = target(checkpointing.metadata(manager), first - 1,
                 abandoned=(health.collapse_target, health.collapse_at))
  head = f"the policy collapsed: {why}, {health.collapsed} steps in a row since step {first}"
  if c.on_collapse == "stop" or found is None or found == health.collapse_target:
    where = (f"the newest healthy checkpoint from before it is step {found}" if found is not None
             else "no healthy checkpoint from before it is kept")
    circle = (" (the last collapse rolled back there already)"
              if found is not None and found == health.collapse_target else "")
    return state._replace(health=health._replace(
        stopped=f"{head}; stopped at step {step}: {where}{circle} (resuming with the same "
                f"settings would repeat it: change them, e.g. rl.learning_rate, and pass "
                f"--allow_config_change)"))
  state, origin = _restore(manager, config, state, found)
  log(f"{head}: rolled back to the checkpoint of step {found} (its state from step {origin}); "
      f"rollback {health.rollbacks + 1}")
  return state._replace(health=health._replace(
      streak=0, collapsed=0, origin=origin, rollbacks=health.rollbacks + 1,
      collapse_target=found, collapse_at=step))


def metrics(config: ml_collections.ConfigDict, health: Health) -> dict:
  """The logged "rollbacks" (so far), "skip_streak" (skipped updates in a row, with
  `checkpoint.rollback_after` on) and "collapse_streak" (collapsed-looking steps in a row, with
  `checkpoint.collapse_after` on)."""
  out = {}
  if config.checkpoint.rollback_after > 0:
    out["skip_streak"] = float(health.streak)
  if config.checkpoint.collapse_after > 0:
    out["collapse_streak"] = float(health.collapsed)
  if out:
    out["rollbacks"] = float(health.rollbacks)
  return out
