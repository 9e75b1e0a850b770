"""Rollback to the newest healthy checkpoint after N skipped updates in a row (`recovery`)."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy
from rl_curriculum.rl import stability
from rl_curriculum.train.durable import checkpointing, recovery
from rl_curriculum.train.setup import validation
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
  health = recovery.Health(streak=1, origin=3, rollbacks=2, collapsed=2)
  config = toy.get_config()
  assert recovery.metrics(_with_rollback(config, 2), health) == {
      "rollbacks": 2.0, "skip_streak": 1.0, "collapse_streak": 2.0}
  config.checkpoint.collapse_after = 0
  assert recovery.metrics(config, health) == {}  # both off
  assert recovery.metrics(_with_rollback(config, 2), health) == {"rollbacks": 2.0,
                                                                 "skip_streak": 1.0}


# --- collapse -----------------------------------------------------------------------------------

_V = 16  # vocabulary: ln V = 2.77 nats
_HEALTHY = {"entropy": 1.2, "grad_norm": 0.3, "nonzero_adv_frac": 0.5, "steps_taken": 2.0,
            "reward_mean": 0.5}
_UNIFORM = {**_HEALTHY, "entropy": float(np.log(_V)), "grad_norm": 0.0, "nonzero_adv_frac": 0.0}


def _collapse_config(after=2, on_collapse="rollback"):
  c = toy.get_config()
  c.checkpoint.collapse_after = after
  c.checkpoint.on_collapse = on_collapse
  return c


def test_collapsed_steps_count_in_a_row_and_healthy_ones_feed_the_reward_mean():
  config, health, seen = _collapse_config(), recovery.Health(streak=0, origin=0, rollbacks=0), []
  for m in (_HEALTHY, {**_HEALTHY, "reward_mean": 0.7}, _UNIFORM, _UNIFORM, _HEALTHY):
    health, why = recovery.after_check(config, health, m, _V)
    seen.append((health.collapsed, why is not None, health.reward_mean))
  assert [c for c, _, _ in seen] == [1 - 1, 0, 1, 2, 0]
  assert [w for _, w, _ in seen] == [False, False, True, True, False]
  # 0.5, then 0.9 * 0.5 + 0.1 * 0.7 = 0.52; the collapsed steps leave it; then 0.9 * 0.52 + 0.05.
  np.testing.assert_allclose([r for _, _, r in seen], [0.5, 0.52, 0.52, 0.52, 0.518], rtol=1e-12)
  assert health.entropy_min == 1.2
  config.checkpoint.collapse_after = 0  # off: nothing is looked at
  assert recovery.after_check(config, health, _UNIFORM, _V) == (health, None)


def test_a_policy_uniform_from_its_first_step_is_not_collapsed():
  """An untrained model samples near-uniformly from the start: that is where it begins, not a
  collapse (its lowest entropy stays at ln V)."""
  config, health = _collapse_config(), recovery.Health(streak=0, origin=0, rollbacks=0)
  uniform_learning = {**_HEALTHY, "entropy": float(np.log(_V))}
  for _ in range(3):
    health, why = recovery.after_check(config, health, uniform_learning, _V)
    assert why is None and health.collapsed == 0
  assert health.entropy_min == pytest.approx(np.log(_V))


def test_periodic_saves_pause_while_steps_look_collapsed():
  health = recovery.Health(streak=0, origin=3, rollbacks=0, collapsed=1)
  assert not recovery.may_save(health, 0) and recovery.may_save(health._replace(collapsed=0), 0)
  metas = {2: _meta(0, 2), 3: recovery.meta(health._replace(origin=3))}
  assert recovery.target(metas, origin=4) == 2  # 3 was saved mid-collapse: not a target


def _save_healthy(manager, config, steps):
  for step in steps:
    checkpointing.save(manager, step, checkpoint_tree(config, _state(float(step), step)),
                       _meta(0, step))


def test_a_collapse_rolls_back_to_before_its_first_step_then_stops_when_it_recurs(tmp_path):
  """Checkpoints of steps 1-3 (states from their own updates). Steps 4 and 5 look collapsed:
  step 4 measured the state of update 3, so the newest state known healthy is update 2's."""
  config = _collapse_config(after=2)
  manager = checkpointing.make_manager(str(tmp_path / "ckpt"), max_to_keep=5)
  _save_healthy(manager, config, (1, 2, 3))
  lines, health = [], recovery.Health(streak=0, origin=5, rollbacks=0, collapsed=1)
  now = _state(9.0, step=5, health=health)
  assert recovery.act_on_collapse(config, manager, now, 4, "why", lines.append) is now  # 1 of 2
  now = now._replace(health=health._replace(collapsed=2))
  state = recovery.act_on_collapse(config, manager, now, 5, "entropy at ln V", lines.append)
  np.testing.assert_array_equal(np.asarray(state.train.params["w"]), np.full((2, 3), 2.0))
  assert state.health == recovery.Health(streak=0, origin=2, rollbacks=1, collapsed=0,
                                         collapse_target=2, collapse_at=5)
  assert lines[-1].startswith("the policy collapsed: entropy at ln V, 2 steps in a row since "
                              "step 4: rolled back to the checkpoint of step 2")
  # The same collapse again (steps 7, 8): step 3 was written on the way into the first one, so
  # it would roll back to step 2 once more: it stops.
  again = state._replace(health=state.health._replace(collapsed=2))
  stopped = recovery.act_on_collapse(config, manager, again, 8, "entropy at ln V", lines.append)
  assert stopped.train is again.train
  assert "stopped at step 8: the newest healthy checkpoint from before it is step 2 (the last " \
      "collapse rolled back there already)" in stopped.health.stopped
  # Healthy checkpoints written after the rollback are targets again: steps 9 and 10 collapse.
  _save_healthy(manager, config, (6, 7))
  later = recovery.act_on_collapse(config, manager, again, 10, "entropy at ln V", lines.append)
  np.testing.assert_array_equal(np.asarray(later.train.params["w"]), np.full((2, 3), 7.0))
  assert (later.health.collapse_target, later.health.rollbacks) == (7, 2)
  manager.close()


@pytest.mark.parametrize("on_collapse,kept", [("stop", (1, 2, 3)), ("rollback", (3,))])
def test_a_collapse_stops_when_configured_or_with_no_healthy_checkpoint(on_collapse, kept,
                                                                        tmp_path):
  config = _collapse_config(after=2, on_collapse=on_collapse)
  manager = checkpointing.make_manager(str(tmp_path / "ckpt"), max_to_keep=5)
  _save_healthy(manager, config, kept)
  now = _state(9.0, step=5, health=recovery.Health(streak=0, origin=5, rollbacks=0, collapsed=2))
  state = recovery.act_on_collapse(config, manager, now, 5, "gradient norm 0", lambda _: None)
  assert state.train is now.train and state.health.rollbacks == 0
  where = ("the newest healthy checkpoint from before it is step 2" if on_collapse == "stop"
           else "no healthy checkpoint from before it is kept")
  assert state.health.stopped == ("the policy collapsed: gradient norm 0, 2 steps in a row since "
                                  f"step 4; stopped at step 5: {where} (resuming with the same "
                                  "settings would repeat it: change them, e.g. rl.learning_rate, "
                                  "and pass --allow_config_change)")
  manager.close()
