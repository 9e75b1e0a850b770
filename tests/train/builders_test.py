"""Config checks (`builders.validate`): every component's options, before anything is built."""

import pytest

from configs import quickstart
from rl_curriculum.train import builders


def _config(**fields):
  c = quickstart.get_config()
  for path, value in fields.items():
    section, name = path.split("__")
    c[section][name] = value
  return c


def test_the_shipped_config_is_valid():
  builders.validate(quickstart.get_config())


@pytest.mark.parametrize("fields,message", [
    # A filter can only shrink the batch: without over-sampling it trains on fewer than P groups.
    (dict(curriculum__filter="all_equal", curriculum__oversample=1.0),
     "config.curriculum.oversample: must be > 1 with the 'all_equal' filter"),
    (dict(curriculum__filter="all_equal", curriculum__oversample=1.3),  # 32 x 1.3 = 41.6
     "config.curriculum.oversample: rl.prompts_per_step x oversample = 32 x 1.3"),
    (dict(curriculum__oversample=2.0), "config.curriculum.oversample: over-sampling only"),
    (dict(curriculum__filter="accuracy_band", curriculum__oversample=2.0,
          curriculum__band=(0.6, 0.2)), "config.curriculum.band"),
    (dict(curriculum__feedback="advantage"), "config.curriculum.feedback"),
    (dict(curriculum__features_every=-1), "config.curriculum.features_every"),
    (dict(rl__kl_coef=0.1, rl__kl_estimator="k1"), "config.rl.kl_estimator: k1 cannot be a loss"),
    (dict(rl__kl_coef=-0.1), "config.rl.kl_coef"),
    (dict(rl__eps_high=-0.2), "config.rl.eps_high"),
    (dict(task__format_bonus=1.5), "config.task.format_bonus"),
    (dict(task__held_out_fraction=0.0), "config.task.held_out_fraction"),
    (dict(eval__min_held_out=-1), "config.eval.min_held_out"),
    (dict(checkpoint__keep=0), "config.checkpoint.keep"),
    (dict(model__source="/no/such/checkpoint", sft__steps=0), "config.model.source: nothing at"),
    (dict(model__lora_rank=4, model__lora_alpha=0.0), "config.model.lora_alpha"),
])
def test_bad_fields_are_named(fields, message):
  with pytest.raises(builders.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    builders.validate(_config(**fields))


def test_a_whole_number_of_oversampled_prompts_is_accepted():
  c = _config(curriculum__filter="all_equal", curriculum__oversample=1.5)  # 48 prompts
  builders.validate(c)
  assert builders.sampled_prompts(c) == 48


@pytest.mark.parametrize("name,options,message", [
    ("sec", dict(alpha=2.0), "sec: alpha must lie in"),
    ("sec", dict(exploration="softmax"), "sec: exploration must be one of"),
    ("dump", dict(window=0), "dump: window must be a positive integer"),
    ("easy_to_hard", dict(order=(0, 1)), "easy_to_hard: order must be a permutation"),
    ("greso", dict(oversample=0.5), "greso: oversample must be >= 1"),
    ("pcl", dict(learning_rate=-1.0), "pcl: learning_rate must be > 0"),
    ("adarft", dict(beta=2.0), "adarft: beta must lie in"),
])
def test_curriculum_option_values_are_checked_by_building_it(name, options, message):
  c = quickstart.get_config()
  c.curriculum.name = name
  c.curriculum.options = options
  with pytest.raises(builders.ConfigError, match="config.curriculum.options: " + message):
    builders.validate(c)
