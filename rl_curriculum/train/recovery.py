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

`Health` is host-side (Python ints) and a field of the run state (`state.RunState`); every
checkpoint's metadata holds it (`meta`), and a resumed run continues from it (`from_meta`).
"""

from typing import Callable, NamedTuple, Optional

import ml_collections
import orbax.checkpoint as ocp

from rl_curriculum.train import checkpointing
from rl_curriculum.train.state import RunState, checkpoint_tree, with_checkpoint

__all__ = ["Health", "from_meta", "meta", "after_update", "due", "may_save", "target",
           "roll_back", "roll_back_if_due", "metrics"]


class Health(NamedTuple):
  """The loop's record of skipped updates and rollbacks."""
  streak: int     # skipped updates in a row, up to the last step
  origin: int     # step of the accepted update the train state comes from (0: the initial state)
  rollbacks: int  # rollbacks so far


def from_meta(meta: dict, step: int) -> Health:
  """The Health a checkpoint of `step` recorded in its metadata; one without a record (a
  checkpoint written before Health existed) counts as healthy, its state from `step`."""
  record = meta.get("health")
  return Health(**record) if record else Health(streak=0, origin=step, rollbacks=0)


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
  """Whether a periodic checkpoint is written: always without rollbacks, else outside a streak."""
  return rollback_after <= 0 or health.streak == 0


def target(metas: dict[int, dict], origin: int) -> Optional[int]:
  """The newest checkpoint step among `metas` ({step: metadata}) saved healthy with a state from
  before `origin`, or None."""
  good = [step for step, m in metas.items()
          if from_meta(m, step).streak == 0 and from_meta(m, step).origin < origin]
  return max(good) if good else None


def roll_back(manager: ocp.CheckpointManager, config: ml_collections.ConfigDict,
              state: RunState, log: Callable[[str], None]) -> RunState:
  """The run state after a rollback from `state`.

  Restores the `target` checkpoint into `state`'s structure and shardings
  (`state.checkpoint_tree`: the train and curriculum states, and what else the run checkpoints),
  keeping the current `step` and `skipped` counters of the train state; the streak ends and
  `rollbacks` counts one more. Without a target the state stays, the streak ends, and a line says
  so.
  """
  manager.wait_until_finished()
  health = state.health
  step = target(checkpointing.metadata(manager), health.origin)
  if step is None:
    log(f"{health.streak} updates in a row skipped; no healthy checkpoint from before step "
        f"{health.origin} to roll back to: continuing")
    return state._replace(health=health._replace(streak=0))
  _, restored, restored_meta = checkpointing.restore(manager, step,
                                                     checkpoint_tree(config, state))
  train = restored["train"]._replace(step=state.train.step, skipped=state.train.skipped)
  origin = from_meta(restored_meta, step).origin
  log(f"{health.streak} updates in a row skipped: rolled back to the checkpoint of step {step} "
      f"(its state from step {origin}); rollback {health.rollbacks + 1}")
  return with_checkpoint(state, {**restored, "train": train})._replace(
      health=Health(streak=0, origin=origin, rollbacks=health.rollbacks + 1))


def roll_back_if_due(config: ml_collections.ConfigDict, manager: ocp.CheckpointManager,
                     state: RunState, log: Callable[[str], None]) -> RunState:
  """`roll_back` after `checkpoint.rollback_after` skipped updates in a row (`due`), else
  `state` as it is."""
  if not due(state.health, config.checkpoint.rollback_after):
    return state
  return roll_back(manager, config, state, log)


def metrics(health: Health) -> dict:
  """The logged "rollbacks" (so far) and "skip_streak" (skipped updates in a row)."""
  return {"rollbacks": float(health.rollbacks), "skip_streak": float(health.streak)}
