"""Rollback to the newest healthy checkpoint after N skipped updates in a row (`recovery`)."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy
from rl_curriculum.rl import stability
from rl_curriculum.train import checkpointing, recovery, validation
from rl_curriculum.train.state import checkpoint_tree, RunState, TrainState


def _replay(skips, rollback_after):
  """(streak, origin, due) after each step 1, 2, ... of a run whose updates are skipped as
  `skips` says, when nothing rolls back."""
  health, out = recovery.Health(streak=0, origin=0, rollbacks=0), []
  for step, skipped in enumerate(skips, start=1):
    health = recovery.after_update(health, step, skipped)
    out.append((health.streak, health.origin, recovery.due(health, rollback_after)))
  return out


def test_a_streak_of_n_skips_is_due_and_accepted_updates_set_the_origin():
  assert _replay([False, True, True, False, True, True, True], 2) == [
      (0, 1, False), (1, 1, False), (2, 1, True), (0, 4, False), (1, 4, False), (2, 4, True),
      (3, 4, True)]
  assert not any(due for _, _, due in _replay([True] * 5, 0))  # 0: off


def test_periodic_saves_pause_during_a_streak_only_with_rollbacks_on():
  streak = recovery.Health(streak=1, origin=3, rollbacks=0)
  calm = streak._replace(streak=0)
  assert recovery.may_save(calm, 2) and recovery.may_save(streak, 0)
  assert not recovery.may_save(streak, 2)


def _meta(streak, origin, rollbacks=0):
  return recovery.meta(recovery.Health(streak=streak, origin=origin, rollbacks=rollbacks))


def test_target_is_the_newest_healthy_checkpoint_from_before_the_origin():
  metas = {1: _meta(0, 1), 2: _meta(0, 2), 3: _meta(1, 2), 4: _meta(0, 1, rollbacks=1),
           5: {"before": {}}}  # 5: written before Health existed: healthy, its state from 5
  assert recovery.target(metas, origin=2) == 4   # 4 holds step 1's state, restored once
  assert recovery.target(metas, origin=1) is None
  assert recovery.target({1: _meta(0, 1), 3: _meta(2, 1)}, origin=3) == 1  # 3 is mid-streak
  assert recovery.target(metas, origin=6) == 5
  assert recovery.from_meta({}, 7) == recovery.Health(streak=0, origin=7, rollbacks=0)
  assert recovery.from_meta(_meta(1, 2, 3), 9) == recovery.Health(streak=1, origin=2, rollbacks=3)


def _state(value, step=0, skipped=0, health=None):
  train = TrainState(step=jnp.asarray(step, jnp.int32), params={"w": jnp.full((2, 3), value)},
                     opt_state=(jnp.full((3,), -value),), whitening=stability.whitening_init(),
                     skipped=jnp.asarray(skipped, jnp.int32))
  return RunState(train=train, curriculum={"q": jnp.full((2,), 10 * value)}, base=None,
                  prompts=None, health=health)


def test_roll_back_restores_the_target_and_keeps_counting(tmp_path):
  config = toy.get_config()
  manager = checkpointing.make_manager(str(tmp_path / "ckpt"), max_to_keep=5)
  # Step 1 and 2 accepted (values 1, 2); step 3 skipped (a periodic save would pause, but the
  # final or a preemption save marks its streak).
  for step, value, skipped, meta in ((1, 1.0, 0, _meta(0, 1)), (2, 2.0, 0, _meta(0, 2)),
                                     (3, 2.0, 1, _meta(1, 2))):
    checkpointing.save(manager, step, checkpoint_tree(config, _state(value, step, skipped)), meta)
  lines = []
  now = _state(2.0, step=4, skipped=2, health=recovery.Health(streak=2, origin=2, rollbacks=0))
  assert recovery.roll_back_if_due(_with_rollback(config, 3), manager, now,
                                   lines.append) is now  # a streak of 2 < 3: not due
  state = recovery.roll_back_if_due(_with_rollback(config, 2), manager, now, lines.append)
  assert state.health == recovery.Health(streak=0, origin=1, rollbacks=1)
  np.testing.assert_array_equal(np.asarray(state.train.params["w"]), np.full((2, 3), 1.0))
  np.testing.assert_array_equal(np.asarray(state.train.opt_state[0]), np.full((3,), -1.0))
  np.testing.assert_array_equal(np.asarray(state.curriculum["q"]), np.full((2,), 10.0))
  assert int(state.train.step) == 4 and int(state.train.skipped) == 2  # counters kept
  assert lines == ["2 updates in a row skipped: rolled back to the checkpoint of step 1 (its "
                   "state from step 1); rollback 1"]
  # Failing again from step 1's state: nothing older is kept, so the arrays stay.
  again = recovery.roll_back(manager, config, state._replace(
      health=state.health._replace(streak=2)), lines.append)
  assert again.train is state.train and again.curriculum is state.curriculum
  assert again.health == recovery.Health(streak=0, origin=1, rollbacks=1)
  assert "no healthy checkpoint from before step 1" in lines[-1]
  manager.close()


def _with_rollback(config, rollback_after):
  config = config.copy_and_resolve_references()
  config.checkpoint.rollback_after = rollback_after
  return config


def test_bad_rollback_after_is_refused():
  c = toy.get_config()
  c.checkpoint.rollback_after = 2
  validation.validate(c)
  c.checkpoint.rollback_after = -1
  with pytest.raises(validation.ConfigError, match="config.checkpoint.rollback_after: must be a "
                     "whole number >= 0"):
    validation.validate(c)


def test_rollback_metrics():
  health = recovery.Health(streak=1, origin=3, rollbacks=2)
  assert recovery.metrics(health) == {"rollbacks": 2.0, "skip_streak": 1.0}
