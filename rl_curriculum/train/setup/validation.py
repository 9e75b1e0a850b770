"""The one check of a run's config: `validate` raises `ConfigError` naming the offending field.

  task = checked_task(config)                  # the configured task, after every check
  validate(config, check_source=False)         # the planner's check: shapes, no checkpoint

It touches no device and compiles nothing, so a typo costs a second, not a compile. It runs once,
before anything is built; the allowed values come from the modules that own them (the losses'
aggregations and KL estimators, the advantage estimators, the curricula and filters, the task
templates), and the curricula's own constructors check their options.
"""

import inspect
import math
import os
from typing import Callable

import ml_collections

from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import pretrained
from rl_curriculum.model.config import ATTENTION_BACKENDS, PRESETS, REMAT_POLICIES
from rl_curriculum.model.tokenizer import NUM_RESERVED
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import losses
from rl_curriculum.rl import surrogate
from rl_curriculum.tasks.base import TEMPLATES
from rl_curriculum.train.durable.recovery import ON_COLLAPSE
from rl_curriculum.train.rollout import budget, checks as rollout_checks
from rl_curriculum.train.setup import builders, data
from rl_curriculum.train.setup.errors import ConfigError, fail
from rl_curriculum.train.learn.rl_types import (ALGORITHMS, CURRICULUM_FEEDBACK, DR_GRPO_AGGREGATION,
                                          KL_LOSS_ESTIMATORS, OVERLONG, PROXIMAL)

__all__ = ["ConfigError", "validate", "checked_task"]


def _options_of(fn: Callable) -> dict[str, inspect.Parameter]:
  params = inspect.signature(fn).parameters
  return {n: p for n, p in params.items() if p.kind == inspect.Parameter.KEYWORD_ONLY
          and n != "batch_size"}


def validate(config: ml_collections.ConfigDict, *, task=None, check_source: bool = True) -> None:
  """Raises ConfigError for a config the run cannot use; returns None otherwise.

  `check_source=False` skips what depends on the checkpoint in `model.source` (that it exists,
  and the template and warm-start rules for pretrained models): the planner checks a config's
  shapes without weights. With the configured `task` (a `tasks.Task`) it also checks the
  training and evaluation bins against the task's, and builds the curriculum over the exact arms
  (`num_arms`)."""
  _validate_finite(config)
  _validate_model(config.model, check_source)
  _validate_rl(config.rl)
  rollout_checks.validate(config)
  _validate_mixture(config)
  if task is not None:
    _validate_bins(config.task, task.num_difficulties, task.eval_only_bins)
    rollout_checks.validate_episodes(config, rollout_checks.turn_width(config, task))
  _validate_curriculum(config, task)
  _validate_task_and_sft(config, check_source, task)
  _validate_eval(config)


def checked_task(config: ml_collections.ConfigDict):
  """The configured task (`builders.build_task`), after `validate` of the whole config with it.

  Raises:
    ConfigError: a field the run cannot use, or a task the config cannot build (an unknown name,
      a bad option), named.
  """
  try:
    task = builders.build_task(config)
  except (KeyError, ValueError, TypeError) as e:
    raise ConfigError(f"config.task: {e}") from e
  validate(config, task=task)
  return task


def _validate_finite(node, path: str = "") -> None:
  """Every number of the config is finite: NaN passes every comparison check below unseen."""
  if isinstance(node, ml_collections.ConfigDict):
    for key, value in node.items():
      _validate_finite(value, f"{path}.{key}" if path else key)
  elif isinstance(node, (tuple, list)):
    for value in node:
      _validate_finite(value, path)
  elif isinstance(node, float) and not math.isfinite(node):
    fail(path, f"must be a finite number, got {node}")


def _validate_model(model: ml_collections.ConfigDict, check_source: bool) -> None:
  """config.model: preset, numerics, rematerialisation, checkpoint source and LoRA."""
  if model.preset not in PRESETS:
    fail("model.preset", f"unknown preset {model.preset!r}; choose from {sorted(PRESETS)}")
  for field in ("dtype", "param_dtype"):
    if model[field] not in ("float32", "bfloat16"):
      fail(f"model.{field}", f"must be float32 or bfloat16, got {model[field]!r}")
  if model.remat not in REMAT_POLICIES:
    fail("model.remat", f"must be one of {REMAT_POLICIES}, got {model.remat!r}")
  if model.attention not in ATTENTION_BACKENDS:
    fail("model.attention", f"must be one of {ATTENTION_BACKENDS}, got {model.attention!r}")
  if (not isinstance(model.attention_block, int) or isinstance(model.attention_block, bool)
      or model.attention_block < 0):
    fail("model.attention_block", f"must be a whole number >= 0 (0 = scores whole), got "
         f"{model.attention_block!r}")
  if model.kv_dtype not in ("", "float32", "bfloat16"):
    fail("model.kv_dtype", f"must be '' (model.dtype), float32 or bfloat16, got "
         f"{model.kv_dtype!r}")
  if not isinstance(model.scan_layers, bool):
    fail("model.scan_layers", f"must be True or False, got {model.scan_layers!r}")
  if model.lora_rank < 0:
    fail("model.lora_rank", f"must be >= 0 (0 = full fine-tuning), got {model.lora_rank}")
  if check_source and model.source and model.source not in pretrained.NAMED_CHECKPOINTS:
    if not os.path.exists(os.path.expanduser(model.source)):
      fail("model.source", f"nothing at {model.source!r}: give an HF checkpoint folder, a "
            f".gguf file, or one of {sorted(pretrained.NAMED_CHECKPOINTS)}")
  merge_every = model.lora_merge_every
  if not isinstance(merge_every, int) or merge_every < 0:
    fail("model.lora_merge_every", f"must be a whole number >= 0 (0 = off), got {merge_every!r}")
  if merge_every > 0 and model.lora_rank <= 0:
    fail("model.lora_merge_every", f"merges LoRA adapters every {merge_every} steps, but "
          "model.lora_rank = 0 (full fine-tuning) trains none: set model.lora_rank > 0 or "
          "lora_merge_every = 0")
  if model.lora_rank > 0:
    if not model.lora_alpha > 0:
      fail("model.lora_alpha", f"must be > 0, got {model.lora_alpha}")
    unknown = [t for t in model.lora_targets if t not in lora_lib.TARGETS]
    if unknown or not model.lora_targets:
      fail("model.lora_targets", f"{list(unknown) or 'empty'}: the model has the projections "
            f"{sorted(lora_lib.TARGETS)}")


def _validate_rl(rl: ml_collections.ConfigDict) -> None:
  """config.rl: algorithm, batch shapes, sampling, loss, KL and optimiser fields."""
  if rl.algorithm not in ALGORITHMS:
    fail("rl.algorithm", f"unknown algorithm {rl.algorithm!r}; choose from {ALGORITHMS}")
  for field in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "epochs",
                "minibatches", "microbatches"):
    if getattr(rl, field) < 1:
      fail(f"rl.{field}", f"must be >= 1, got {getattr(rl, field)}")
  if rl.group_size < 2 and rl.algorithm in ("rloo", "grpo", "dr_grpo"):
    fail("rl.group_size", f"{rl.algorithm} needs at least 2 completions per prompt")
  if rl.prompts_per_step % rl.minibatches:
    fail("rl.minibatches", f"rl.prompts_per_step={rl.prompts_per_step} does not divide into "
          f"{rl.minibatches} minibatches of whole groups")
  per_minibatch = rl.prompts_per_step // rl.minibatches
  if per_minibatch % rl.microbatches and (rl.microbatches % per_minibatch or rl.group_size % (
      rl.microbatches // per_minibatch)):
    fail("rl.microbatches", f"a minibatch of {per_minibatch} prompts x {rl.group_size} "
         f"completions does not divide into {rl.microbatches} microbatches of whole groups or "
         "of equal parts of every group")
  if rl.logits_chunk < 0:
    fail("rl.logits_chunk", f"must be >= 0 (0 = the whole completion at once), got "
          f"{rl.logits_chunk}")
  if rl.temperature <= 0:
    fail("rl.temperature", f"must be > 0, got {rl.temperature}")
  if rl.level not in surrogate.LEVELS:
    fail("rl.level", f"must be one of {surrogate.LEVELS}, got {rl.level!r}")
  if rl.aggregation not in losses.AGGREGATIONS:
    fail("rl.aggregation", f"must be one of {losses.AGGREGATIONS}, got {rl.aggregation!r}")
  if rl.kl_estimator not in losses.KL_ESTIMATORS:
    fail("rl.kl_estimator", f"must be one of {losses.KL_ESTIMATORS}, got {rl.kl_estimator!r}")
  if rl.kl_coef < 0:
    fail("rl.kl_coef", f"must be >= 0, got {rl.kl_coef}")
  if rl.kl_coef > 0 and rl.kl_estimator not in KL_LOSS_ESTIMATORS:
    fail("rl.kl_estimator", f"{rl.kl_estimator} cannot be a loss term (rl.kl_coef > 0): its "
          "gradient on the policy's own samples is grad logp, whose mean is 0, so it "
          f"regularises nothing; use one of {KL_LOSS_ESTIMATORS}")
  if rl.learning_rate <= 0:
    fail("rl.learning_rate", f"must be > 0, got {rl.learning_rate}")
  if rl.seed < 0:
    fail("rl.seed", f"must be >= 0, got {rl.seed}")
  for field in ("gamma", "lam"):
    if not 0.0 <= getattr(rl, field) <= 1.0:
      fail(f"rl.{field}", f"must lie in [0, 1], got {getattr(rl, field)}")
  for field in ("eps_low", "eps_high", "ratio_guard", "max_kl", "max_grad_norm", "vf_coef",
                "vf_clip"):
    if getattr(rl, field) < 0:
      fail(f"rl.{field}", f"must be >= 0, got {getattr(rl, field)}")
  if rl.rollback not in ("step", "minibatch"):
    fail("rl.rollback", f"must be step or minibatch, got {rl.rollback!r}")
  if rl.rollback == "minibatch" and rl.max_kl > 0:
    fail("rl.rollback", "'minibatch' keeps each finite optimizer step as it goes, so nothing is "
         "left to roll back to when the step's KL passes rl.max_kl: use rl.rollback='step' or "
         "rl.max_kl=0")
  _validate_rl_methods(rl)


def _validate_rl_methods(rl: ml_collections.ConfigDict) -> None:
  """config.rl's optional methods: dual clip, entropy bonus, truncated importance sampling, CAPO,
  GRPO's std, Dr. GRPO's aggregation, the KL in the reward, the counterfactual baseline, the
  handling of completions cut at rl.max_new_tokens, the adaptive temperature and the rollout
  allocation."""
  if rl.algorithm == "dr_grpo" and rl.aggregation != DR_GRPO_AGGREGATION:
    fail("rl.aggregation", f"rl.algorithm='dr_grpo' needs rl.aggregation="
          f"{DR_GRPO_AGGREGATION!r}, got {rl.aggregation!r}: Dr. GRPO removes the "
          "per-completion length normalisation (every token sum is divided by one constant, "
          "rl.max_new_tokens)")
  if rl.dual_clip != 0 and not rl.dual_clip > 1:
    fail("rl.dual_clip", f"must be 0 (off) or > 1, got {rl.dual_clip}")
  for field in ("entropy_coef", "tis_cap", "kl_reward_coef"):
    if getattr(rl, field) < 0:
      fail(f"rl.{field}", f"must be >= 0 (0 = off), got {getattr(rl, field)}")
  if rl.proximal not in PROXIMAL:
    fail("rl.proximal", f"must be one of {PROXIMAL}, got {rl.proximal!r}")
  if rl.proximal == "loglinear" and (rl.algorithm == "ppo" or rl.kl_reward_coef != 0):
    fail("rl.proximal", "'loglinear' runs no old-policy pass, which PPO's values and a KL in "
          "the reward (rl.kl_reward_coef) read: use 'recompute' with them")
  for field in ("capo_positive_steps", "capo_ramp_steps"):
    value = getattr(rl, field)
    if not isinstance(value, int) or value < 0:
      fail(f"rl.{field}", f"must be a whole number >= 0, got {value!r}")
  if rl.grpo_std not in adv_lib.GRPO_STDS:
    fail("rl.grpo_std", f"must be one of {adv_lib.GRPO_STDS}, got {rl.grpo_std!r}")
  if rl.algorithm == "counterfactual" and rl.whiten_rewards:
    fail("rl.whiten_rewards", "must be False with rl.algorithm='counterfactual': its baseline "
          "is a success rate, in the units of the raw rewards")
  if rl.overlong not in OVERLONG:
    fail("rl.overlong", f"must be one of {OVERLONG}, got {rl.overlong!r}")
  if not isinstance(rl.overlong_cache, int) or rl.overlong_cache < 0:
    fail("rl.overlong_cache", f"must be a whole number of tokens >= 0, got "
          f"{rl.overlong_cache!r}")
  if rl.overlong == "penalty" and not 1 <= rl.overlong_cache < rl.max_new_tokens:
    fail("rl.overlong_cache", f"rl.overlong='penalty' needs 1 <= rl.overlong_cache < "
          f"rl.max_new_tokens={rl.max_new_tokens} (the lengths that are penalised), got "
          f"{rl.overlong_cache}")
  _validate_allocation(rl)
  _validate_adaptive_temperature(rl)


def _validate_allocation(rl: ml_collections.ConfigDict) -> None:
  """config.rl.allocation and its per-prompt bounds."""
  if rl.allocation not in budget.ALLOCATIONS:
    fail("rl.allocation", f"must be one of {budget.ALLOCATIONS}, got {rl.allocation!r}")
  if rl.allocation == "none":
    return
  if not isinstance(rl.allocation_max, int) or rl.allocation_max < rl.group_size:
    fail("rl.allocation_max", f"must be a whole number >= rl.group_size={rl.group_size} (the "
          f"completion slots of a prompt), got {rl.allocation_max!r}")
  least = 2 if rl.algorithm in ("rloo", "grpo", "dr_grpo") else 1
  if not isinstance(rl.allocation_min, int) or not least <= rl.allocation_min <= rl.group_size:
    fail("rl.allocation_min", f"must be a whole number in [{least}, rl.group_size="
          f"{rl.group_size}] ({rl.algorithm} needs {least} completions per prompt), got "
          f"{rl.allocation_min!r}")


def _validate_adaptive_temperature(rl: ml_collections.ConfigDict) -> None:
  """config.rl's adaptive sampling temperature: off at temperature_target = 0; on, a positive
  gain and 0 < temperature_min <= temperature <= temperature_max."""
  if rl.temperature_target < 0:
    fail("rl.temperature_target", f"must be >= 0 (0 = off; nats per token), got "
          f"{rl.temperature_target}")
  if rl.temperature_target == 0:
    return
  if not rl.temperature_rate > 0:
    fail("rl.temperature_rate", f"must be > 0 with rl.temperature_target > 0, got "
          f"{rl.temperature_rate}")
  if not 0 < rl.temperature_min <= rl.temperature:
    fail("rl.temperature_min", f"must lie in (0, rl.temperature={rl.temperature}], got "
          f"{rl.temperature_min}")
  if not rl.temperature <= rl.temperature_max:
    fail("rl.temperature_max", f"must be >= rl.temperature={rl.temperature}, got "
          f"{rl.temperature_max}")


def _validate_mixture(c: ml_collections.ConfigDict) -> None:
  """config.curriculum.arms, config.task.weights and the keys of config.task.options, which a
  mixture of tasks (task names joined by "+") gives a meaning."""
  names = builders.mixture_names(c)
  stray = sorted(set(c.task.options) - set(names))
  if stray:
    fail("task.options", f"names {stray}, not tasks of task.name={c.task.name!r}: give "
          "{task name: {option: value}} for the tasks it names")
  if c.curriculum.arms not in data.ARM_LAYOUTS:
    fail("curriculum.arms", f"must be one of {data.ARM_LAYOUTS}, got {c.curriculum.arms!r}")
  if c.curriculum.arms == "task" and len(names) < 2:
    fail("curriculum.arms", f"'task' makes one arm per task of a mixture, but task.name="
          f"{c.task.name!r} is one task: name several joined by '+' (e.g. 'countdown+zebra') "
          "or use 'bin'")
  weights = tuple(c.task.weights)
  if weights and len(names) < 2:
    fail("task.weights", f"mixture weights need several tasks in task.name (joined by '+'), "
          f"got the single task {c.task.name!r}; leave task.weights empty")
  if weights and (len(weights) != len(names) or min(weights) <= 0):
    fail("task.weights", f"must be empty (equal) or one weight > 0 per task of {names}, got "
          f"{list(weights)}")


def _validate_task_and_sft(c: ml_collections.ConfigDict, check_source: bool,
                           task_obj=None) -> None:
  """config.task's reward and pool sizes, config.sft, and the prompt template."""
  task = c.task
  if not 0.0 <= task.format_bonus < 1.0:
    fail("task.format_bonus", f"must lie in [0, 1) (a right answer earns 1), got "
          f"{task.format_bonus}")
  if not 0.0 < task.held_out_fraction < 1.0:
    fail("task.held_out_fraction", f"must lie in (0, 1), got {task.held_out_fraction}")
  if task.held_out_split not in data.HELD_OUT_PARTS:
    fail("task.held_out_split", f"must be one of {data.HELD_OUT_PARTS}, got "
          f"{task.held_out_split!r}")
  for field in ("train_per_bin", "eval_per_bin"):
    if getattr(task, field) < 1:
      fail(f"task.{field}", f"must be >= 1, got {getattr(task, field)}")
  if c.sft.steps < 0:
    fail("sft.steps", f"must be >= 0, got {c.sft.steps}")
  if c.sft.steps:
    for field in ("batch_size", "learning_rate"):
      if getattr(c.sft, field) <= 0:
        fail(f"sft.{field}", f"must be > 0, got {getattr(c.sft, field)}")
    if not isinstance(c.sft.save_every, int) or c.sft.save_every < 0:
      fail("sft.save_every", f"must be a whole number >= 0 (0 = never), got {c.sft.save_every!r}")
    if task.sft_per_bin < 1:
      fail("task.sft_per_bin", f"must be >= 1 with an SFT warm start, got {task.sft_per_bin}")
  if check_source and c.model.source and c.sft.steps and (
      task_obj is None or rollout_checks.turn_width(c, task_obj) == 1):
    fail("sft.steps", "must be 0 with a pretrained model (config.model.source) on a "
          "single-turn task: its SFT targets are plain-template completions for models trained "
          "here (an environment's solved episodes are a warm start for any model)")
  if not task.eval_bins:
    fail("task.eval_bins", "empty: give the bins whose held-out accuracy the run reports")
  if not c.model.source and (not isinstance(c.tokenizer.vocab_size, int)
                             or c.tokenizer.vocab_size <= NUM_RESERVED):
    fail("tokenizer.vocab_size", f"must be a whole number above the {NUM_RESERVED} reserved ids "
          f"(and at least the task text's distinct characters + {NUM_RESERVED}), got "
          f"{c.tokenizer.vocab_size!r}")
  if c.tokenizer.model_type not in builders.TOKENIZER_TYPES:
    fail("tokenizer.model_type", f"must be one of {builders.TOKENIZER_TYPES}, got "
          f"{c.tokenizer.model_type!r}")
  if task.template not in TEMPLATES:
    fail("task.template", f"must be one of {TEMPLATES}, got {task.template!r}")
  if check_source and task.template != "plain" and not c.model.source:
    fail("task.template", "chat prompts need a pretrained instruct model (config.model.source)")


def _validate_eval(c: ml_collections.ConfigDict) -> None:
  """config.eval and config.checkpoint: sizes, periods, the rollback and collapse handling."""
  if c.eval.min_held_out < 0:
    fail("eval.min_held_out", f"must be >= 0, got {c.eval.min_held_out}")
  for group, name in (("eval", "every"), ("eval", "batch_size"), ("checkpoint", "every"),
                      ("checkpoint", "keep")):
    if c[group][name] < 1:
      fail(f"{group}.{name}", f"must be >= 1, got {c[group][name]}")
  for name in ("rollback_after", "collapse_after"):
    value = c.checkpoint[name]
    if not isinstance(value, int) or value < 0:
      fail(f"checkpoint.{name}", f"must be a whole number >= 0 (0 = off), got {value!r}")
  if c.checkpoint.on_collapse not in ON_COLLAPSE:
    fail("checkpoint.on_collapse", f"must be one of {ON_COLLAPSE}, got "
          f"{c.checkpoint.on_collapse!r}")
  if not c.checkpoint.collapse_entropy >= 0:
    fail("checkpoint.collapse_entropy", f"must be >= 0 (0 = off), got "
          f"{c.checkpoint.collapse_entropy}")
  if not 0 <= c.checkpoint.collapse_reward_drop < 1:
    fail("checkpoint.collapse_reward_drop", f"must lie in [0, 1) (0 = off), got "
          f"{c.checkpoint.collapse_reward_drop}")


def _validate_bins(task: ml_collections.ConfigDict, num_task_bins: int, eval_only_bins) -> None:
  """config.task.train_bins and eval_bins against the task's `num_task_bins` bins."""
  bad = [b for b in task.train_bins if not 0 <= b < num_task_bins or b in eval_only_bins]
  if bad or not task.train_bins:
    fail("task.train_bins", f"{list(bad) or 'empty'}: training bins must lie in "
          f"[0, {num_task_bins}) and not be evaluation-only {tuple(eval_only_bins)}")
  if len(set(task.train_bins)) != len(task.train_bins):
    fail("task.train_bins", f"{list(task.train_bins)} lists a bin twice")
  bad = [b for b in task.eval_bins if not 0 <= b < num_task_bins]
  if bad:
    fail("task.eval_bins", f"{bad} outside [0, {num_task_bins})")
  if len(set(task.eval_bins)) != len(task.eval_bins):
    fail("task.eval_bins", f"{list(task.eval_bins)} lists a bin twice")


def _validate_curriculum(c: ml_collections.ConfigDict, task=None) -> None:
  """The curriculum, its options and the post-rollout filter, checked by building the curriculum
  for the configured number of arms (`num_arms`; the constructors check every option's value)."""
  cur_config = c.curriculum
  name = cur_config.name
  if name not in builders.CURRICULA:
    fail("curriculum.name", f"unknown curriculum {name!r}; choose from "
          f"{sorted(builders.CURRICULA)}")
  allowed = _options_of(builders.CURRICULA[name])
  for key in cur_config.options:
    if key not in allowed:
      fail(f"curriculum.options.{key}", f"{name} takes no option {key!r}; it takes "
            f"{sorted(allowed)}")
  if cur_config.feedback not in CURRICULUM_FEEDBACK:
    fail("curriculum.feedback", f"must be one of {CURRICULUM_FEEDBACK}, got "
          f"{cur_config.feedback!r}")
  if cur_config.filter not in builders.FILTERS:
    fail("curriculum.filter", f"unknown filter {cur_config.filter!r}; choose from "
          f"{builders.FILTERS}")
  p, factor = c.rl.prompts_per_step, cur_config.oversample
  if cur_config.filter == "none":
    if factor != 1:
      fail("curriculum.oversample", "over-sampling only makes sense with a post-rollout filter "
            f"(curriculum.filter is 'none'), got {factor}")
  else:
    if not factor > 1:
      fail("curriculum.oversample", f"must be > 1 with the {cur_config.filter!r} filter (a "
            f"filter can only shrink the batch), got {factor}")
    if not float(p * factor).is_integer():
      fail("curriculum.oversample", f"rl.prompts_per_step x oversample = {p} x {factor} must be "
            "a whole number of prompts")
  band = tuple(cur_config.band)
  if len(band) != 2 or not 0.0 <= band[0] <= band[1] <= 1.0:
    fail("curriculum.band", f"must be (lo, hi) with 0 <= lo <= hi <= 1, got {band}")
  if not isinstance(cur_config.high_variance_only, bool):
    fail("curriculum.high_variance_only", f"must be True or False, got "
          f"{cur_config.high_variance_only!r}")
  if cur_config.high_variance_only and name != "vcrl":
    fail("curriculum.high_variance_only", f"needs curriculum.name='vcrl' (whose update marks "
          f"the high-variance groups), got {name!r}")
  if cur_config.features_every < 0:
    fail("curriculum.features_every", f"must be >= 0, got {cur_config.features_every}")
  if cur_config.features_batch_size < 1:
    fail("curriculum.features_batch_size", f"must be >= 1, got "
          f"{cur_config.features_batch_size}")
  if not c.task.train_bins:
    fail("task.train_bins", "empty: the curriculum needs at least one arm")
  try:
    # No pool yet: the number of arms stands in for it (PCL's features come with the real pool).
    builders.build_curriculum(c, builders.num_arms(c, task), builders.sampled_prompts(c))
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.curriculum.options: {name}: {e}") from e
