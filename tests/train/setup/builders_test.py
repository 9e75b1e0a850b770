"""From a config to the run's parts (`builders`): the learn step's static hyperparameters and the
curriculum's arms."""

import pytest

from configs import scratch
from rl_curriculum.train.learn import rl_types
from rl_curriculum.train.setup import builders, validation
import test_util


def test_loss_side_methods_reach_the_learn_config():
  c = test_util.scratch_config(rl__algorithm="dr_grpo", rl__aggregation="seq_mean_token_sum_norm",
              rl__dual_clip=3.0, rl__entropy_coef=0.01, rl__tis_cap=2.0,
              rl__capo_positive_steps=5, rl__capo_ramp_steps=10, rl__grpo_std="sample",
              rl__kl_reward_coef=0.05)
  validation.validate(c)
  learn = builders.learn_config(c)
  assert (learn.algorithm, learn.aggregation, learn.dual_clip, learn.entropy_coef, learn.tis_cap,
          learn.capo_positive_steps, learn.capo_ramp_steps, learn.grpo_std,
          learn.kl_reward_coef) == ("dr_grpo", "seq_mean_token_sum_norm", 3.0, 0.01, 2.0, 5, 10,
                                    "sample", 0.05)
  # Every method is off in the shipped config: its switch is None (not a coefficient of 0).
  default = builders.learn_config(scratch.get_config())
  assert (default.dual_clip, default.entropy_coef, default.tis_cap, default.capo_positive_steps,
          default.capo_ramp_steps, default.kl_reward_coef) == (None,) * 6
  assert default.grpo_std == "population"


def test_adaptive_temperature_reaches_the_learn_config():
  # Off (target 0), the controller's other fields are not checked.
  validation.validate(test_util.scratch_config(rl__temperature_rate=0.0, rl__temperature_min=2.0))
  c = test_util.scratch_config(rl__temperature_target=1.5, rl__temperature_rate=0.05, rl__temperature_min=0.6,
              rl__temperature_max=1.2)
  validation.validate(c)
  learn = builders.learn_config(c)
  assert (learn.temperature_target, learn.temperature_rate, learn.temperature_min,
          learn.temperature_max) == (1.5, 0.05, 0.6, 1.2)
  assert not rl_types.adaptive_temperature(builders.learn_config(scratch.get_config()))
  assert rl_types.adaptive_temperature(learn)


def test_task_arms_are_counted_from_the_tasks_with_training_bins():
  from rl_curriculum.tasks import get_task  # pylint: disable=import-outside-toplevel
  task = get_task("countdown+zebra+arc1d")
  c = test_util.scratch_config(task__name=task.name, curriculum__arms="task",
              task__train_bins=(task.bin_of("countdown", "n3"), task.bin_of("countdown", "n4"),
                                task.bin_of("arc1d", "move_10")),
              task__eval_bins=(0,), task__weights=(1.0, 2.0, 1.0))
  # Without the task: one arm per named task; with it: the tasks that have a training bin.
  assert builders.num_arms(c) == 3 and builders.num_arms(c, task) == 2
  validation.validate(c, task=task)
  c.curriculum.arms = "bin"
  assert builders.num_arms(c) == builders.num_arms(c, task) == 3
  # The exact count reaches the curriculum's checks: mastering_rate's chain names its arms.
  c.curriculum.arms = "task"
  c.curriculum.name = "mastering_rate"
  c.curriculum.options = {"order": (0, 1, 2)}
  with pytest.raises(validation.ConfigError, match="mastering_rate"):
    validation.validate(c, task=task)
  c.curriculum.options = {"order": (1, 0)}
  validation.validate(c, task=task)
