"""Config checks (`validation.validate`): every component's options, before anything is built."""

import re

import pytest

from configs import scratch
from rl_curriculum.train.rollout import checks as rollout_checks
from rl_curriculum.train.setup import builders, validation
import test_util


def test_the_shipped_config_is_valid():
  validation.validate(scratch.get_config())


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
    (dict(sft__save_every=-1), "config.sft.save_every: must be a whole number >= 0"),
    (dict(model__source="/no/such/checkpoint", sft__steps=0), "config.model.source: nothing at"),
    (dict(model__lora_rank=4, model__lora_alpha=0.0), "config.model.lora_alpha"),
    (dict(rl__dual_clip=1.0), "config.rl.dual_clip: must be 0 (off) or > 1"),
    (dict(rl__entropy_coef=-0.01), "config.rl.entropy_coef: must be >= 0"),
    (dict(rl__tis_cap=-2.0), "config.rl.tis_cap: must be >= 0"),
    (dict(rl__proximal="forward"), "config.rl.proximal: must be one of"),
    (dict(rl__proximal="loglinear", rl__algorithm="ppo"), "config.rl.proximal: 'loglinear' runs"),
    (dict(rl__proximal="loglinear", rl__kl_reward_coef=0.1), "config.rl.proximal: 'loglinear'"),
    (dict(rl__capo_positive_steps=-1), "config.rl.capo_positive_steps: must be a whole number"),
    (dict(rl__capo_ramp_steps=-2), "config.rl.capo_ramp_steps: must be a whole number"),
    (dict(rl__grpo_std="unbiased"), "config.rl.grpo_std: must be one of ('population', 'sample')"),
    (dict(rl__kl_reward_coef=-0.1), "config.rl.kl_reward_coef: must be >= 0"),
    (dict(rl__temperature_target=-1.0), "config.rl.temperature_target: must be >= 0"),
    (dict(rl__temperature_target=1.0, rl__temperature_rate=0.0),
     "config.rl.temperature_rate: must be > 0"),
    (dict(rl__temperature_target=1.0, rl__temperature_min=1.2),
     "config.rl.temperature_min: must lie in (0, rl.temperature=1.0]"),
    (dict(rl__temperature_target=1.0, rl__temperature_min=0.0),
     "config.rl.temperature_min: must lie in (0, rl.temperature=1.0]"),
    (dict(rl__temperature_target=1.0, rl__temperature_max=0.9),
     "config.rl.temperature_max: must be >= rl.temperature=1.0"),
    # NaN passes every comparison: every number is checked to be finite first.
    (dict(rl__learning_rate=float("nan")), "config.rl.learning_rate: must be a finite number"),
    (dict(rl__max_kl=float("inf")), "config.rl.max_kl: must be a finite number, got inf"),
    (dict(curriculum__band=(0.0, float("nan"))), "config.curriculum.band: must be a finite"),
    (dict(task__eval_bins=()), "config.task.eval_bins: empty"),
    (dict(tokenizer__vocab_size=0), "config.tokenizer.vocab_size: must be a whole number above "
     "the 4 reserved ids"),
    (dict(checkpoint__collapse_after=-1), "config.checkpoint.collapse_after: must be a whole"),
    (dict(checkpoint__on_collapse="warn"), "config.checkpoint.on_collapse: must be one of"),
    (dict(checkpoint__collapse_entropy=-1.0), "config.checkpoint.collapse_entropy: must be >= 0"),
    (dict(checkpoint__collapse_reward_drop=1.0),
     "config.checkpoint.collapse_reward_drop: must lie in [0, 1)"),
    # Dr. GRPO's point is the constant normaliser; the message names both fields.
    (dict(rl__algorithm="dr_grpo"), "config.rl.aggregation: rl.algorithm='dr_grpo' needs "
     "rl.aggregation='seq_mean_token_sum_norm', got 'token_mean'"),
])
def test_bad_fields_are_named(fields, message):
  with pytest.raises(validation.ConfigError, match=re.escape(message)):
    validation.validate(test_util.scratch_config(**fields))


def test_a_whole_number_of_oversampled_prompts_is_accepted():
  c = test_util.scratch_config(curriculum__filter="all_equal", curriculum__oversample=1.5)  # 48 prompts
  validation.validate(c)
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
  c = scratch.get_config()
  c.curriculum.name = name
  c.curriculum.options = options
  with pytest.raises(validation.ConfigError, match="config.curriculum.options: " + message):
    validation.validate(c)


@pytest.mark.parametrize("fields,message", [
    (dict(tokenizer__model_type="word"), "config.tokenizer.model_type: must be one of "
     "('unigram', 'bpe')"),
    (dict(task__options={"zebra": {"num_shots": 1}}), "config.task.options: names ['zebra'], "
     "not tasks of task.name='arithmetic'"),
    (dict(curriculum__arms="pair"), "config.curriculum.arms: must be one of ('bin', 'task')"),
    # One task has no tasks to make arms of.
    (dict(curriculum__arms="task"), "config.curriculum.arms: 'task' makes one arm per task of a "
     "mixture, but task.name='arithmetic' is one task"),
    (dict(task__weights=(1.0,)), "config.task.weights: mixture weights need several tasks"),
    (dict(task__name="countdown+zebra", task__weights=(1.0, 2.0, 3.0)),
     "config.task.weights: must be empty (equal) or one weight > 0 per task of ('countdown', "
     "'zebra')"),
    (dict(task__name="countdown+zebra", task__weights=(1.0, 0.0)), "config.task.weights"),
])
def test_mixture_fields_are_named(fields, message):
  with pytest.raises(validation.ConfigError, match=re.escape(message)):
    validation.validate(test_util.scratch_config(**fields))


@pytest.mark.parametrize("fields,message", [
    (dict(rl__engine="paged"), "config.rl.engine: must be one of ('static', 'continuous')"),
    (dict(rl__engine="continuous", rl__decode_slots=0), "config.rl.decode_slots: must be a whole "
     "number >= 1"),
    (dict(rl__prefill_chunk=-4), "config.rl.prefill_chunk: must be a whole number >= 0"),
    (dict(rl__decode_shrink=-1), "config.rl.decode_shrink: must be a whole number >= 0"),
])
def test_engine_fields_are_named(fields, message):
  with pytest.raises(validation.ConfigError, match=re.escape(message)):
    validation.validate(test_util.scratch_config(**fields))


_IN_FLIGHT = dict(rl__engine="continuous", rl__max_staleness=1, rl__tis_cap=2.0)


@pytest.mark.parametrize("fields,message", [
    (dict(rl__max_staleness=-1), "config.rl.max_staleness: must be a whole number >= 0"),
    (dict(rl__decode_budget=-3), "config.rl.decode_budget: must be a whole number >= 0"),
    (dict(rl__admission="pace"), "config.rl.admission: must be one of ('wait', 'drop')"),
    (dict(parallel__rollout_devices=-1), "config.parallel.rollout_devices: must be a whole"),
    (dict(parallel__rollout_layout="fsdp"), "config.parallel.rollout_layout: must be one of "
     "('learner', 'replicated', 'tensor', 'auto')"),
    (dict(parallel__rollout_tensor=0), "config.parallel.rollout_tensor: must be a whole number"),
    (dict(_IN_FLIGHT, parallel__rollout_devices=1, parallel__rollout_layout="replicated"),
     "config.parallel.rollout_layout: a rollout mesh apart"),
    (dict(rl__max_staleness=2), "config.rl.engine: rollouts in flight across steps"),
    (dict(rl__decode_budget=8), "config.rl.engine: rollouts in flight across steps"),
    (dict(_IN_FLIGHT, rl__admission="drop"), "config.rl.admission: 'drop' evicts"),
    (dict(rl__engine="continuous", rl__decode_budget=4, rl__admission="drop"),
     "config.rl.admission: 'drop' evicts"),
    (dict(_IN_FLIGHT, rl__temperature_target=1.0), "config.rl.temperature_target: the adaptive"),
    (dict(_IN_FLIGHT, rl__off_policy_correction="some"),
     "config.rl.off_policy_correction: must be one of ('required', 'none')"),
    (dict(_IN_FLIGHT, rl__tis_cap=0.0), "config.rl.max_staleness: 1 trains tokens drawn by older "
     "weights with no correction for them: set rl.tis_cap > 0 (truncated importance sampling), "
     "rl.proximal='loglinear' (decoupled PPO), or rl.off_policy_correction='none'"),
])
def test_rollouts_in_flight_fields_are_named(fields, message):
  with pytest.raises(validation.ConfigError, match=re.escape(message)) as error:
    validation.validate(test_util.scratch_config(**fields))
  assert "\n" not in str(error.value)  # one line


def test_rollouts_in_flight_choose_how_stale_tokens_are_corrected():
  """k >= 1 with one optimizer step a batch trains stale tokens at ratio 1 unless a correction is
  named; each of the three choices passes, and so does k = 0 (every token of the current
  weights), partial rollouts included."""
  stale = dict(rl__engine="continuous", rl__max_staleness=2)
  for choice in (dict(rl__tis_cap=1.5), dict(rl__proximal="loglinear"),
                 dict(rl__off_policy_correction="none")):
    validation.validate(test_util.scratch_config(**stale, **choice))
  validation.validate(test_util.scratch_config(rl__engine="continuous", rl__decode_budget=4))
  with pytest.raises(validation.ConfigError, match=re.escape("config.rl.max_staleness: 2 trains")):
    validation.validate(test_util.scratch_config(**stale))


def test_the_rollout_devices_split_leaves_the_learner_devices_on_every_process():
  class Device:
    def __init__(self, i, process):
      self.id, self.process_index = i, process

  devices = [Device(i, i // 4) for i in range(8)]      # two processes of four devices
  split = lambda n, processes=2: rollout_checks.split_devices(
      test_util.scratch_config(parallel__rollout_devices=n), devices, processes)
  learner, rollout = split(2)
  assert [d.id for d in learner] == [0, 1, 2, 4, 5, 6] and [d.id for d in rollout] == [3, 7]
  assert split(0) == (devices, devices)
  for bad in (3, 8, 9):   # odd over two processes; no learner device left
    with pytest.raises(validation.ConfigError, match=re.escape("config.parallel.rollout_devices")):
      split(bad)
  uneven = devices[:3] + devices[4:5]  # process 1 has one device: none left to learn on
  with pytest.raises(validation.ConfigError, match="leave a process with no learner device"):
    rollout_checks.split_devices(test_util.scratch_config(parallel__rollout_devices=2), uneven, 2)
  validation.validate(test_util.scratch_config(**_IN_FLIGHT, rl__decode_budget=4, rl__admission="drop",
                              parallel__rollout_devices=1))


def test_engine_shapes_are_checked_against_the_mesh_and_the_prompt_buffer():
  c = test_util.scratch_config(rl__engine="continuous", rl__decode_slots=12, rl__prefill_chunk=16)
  rollout_checks.check_decode_slots(c, 4)
  with pytest.raises(validation.ConfigError, match=re.escape(
      "config.rl.decode_slots: 12 decode slots do not split over data x fsdp = 8 devices")):
    rollout_checks.check_decode_slots(c, 8)
  rollout_checks.check_prefill_chunk(c, 16)
  with pytest.raises(validation.ConfigError, match=re.escape(
      "config.rl.prefill_chunk: 16 is longer than the prompt buffer (12 tokens)")):
    rollout_checks.check_prefill_chunk(c, 12)
