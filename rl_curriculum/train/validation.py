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
from rl_curriculum.model.config import PRESETS, REMAT_POLICIES
from rl_curriculum.model.tokenizer import NUM_RESERVED
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import losses
from rl_curriculum.rl import surrogate
from rl_curriculum.sampling.continuous import ENGINES
from rl_curriculum.tasks.base import TEMPLATES
from rl_curriculum.train import budget, builders, data
from rl_curriculum.train.recovery import ON_COLLAPSE
from rl_curriculum.train.rl_types import (ALGORITHMS, CURRICULUM_FEEDBACK, DR_GRPO_AGGREGATION,
                                          KL_LOSS_ESTIMATORS, OVERLONG, PROXIMAL)

__all__ = ["ConfigError", "validate", "checked_task"]


class ConfigError(ValueError):
  """A config field has a value the run cannot use; the message names the field."""


def _fail(field: str, message: str):
  raise ConfigError(f"config.{field}: {message}")


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
  _validate_mixture(config)
  if task is not None:
    _validate_bins(config.task, task.num_difficulties, task.eval_only_bins)
  _validate_curriculum(config, task)
  _validate_task_and_sft(config, check_source)
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
    _fail(path, f"must be a finite number, got {node}")


def _validate_model(model: ml_collections.ConfigDict, check_source: bool) -> None:
  """config.model: preset, numerics, rematerialisation, checkpoint source and LoRA."""
  if model.preset not in PRESETS:
    _fail("model.preset", f"unknown preset {model.preset!r}; choose from {sorted(PRESETS)}")
  for field in ("dtype", "param_dtype"):
    if model[field] not in ("float32", "bfloat16"):
      _fail(f"model.{field}", f"must be float32 or bfloat16, got {model[field]!r}")
  if model.remat not in REMAT_POLICIES:
    _fail("model.remat", f"must be one of {REMAT_POLICIES}, got {model.remat!r}")
  if not isinstance(model.scan_layers, bool):
    _fail("model.scan_layers", f"must be True or False, got {model.scan_layers!r}")
  if model.lora_rank < 0:
    _fail("model.lora_rank", f"must be >= 0 (0 = full fine-tuning), got {model.lora_rank}")
  if check_source and model.source and model.source not in pretrained.NAMED_CHECKPOINTS:
    if not os.path.exists(os.path.expanduser(model.source)):
      _fail("model.source", f"nothing at {model.source!r}: give an HF checkpoint folder, a "
            f".gguf file, or one of {sorted(pretrained.NAMED_CHECKPOINTS)}")
  merge_every = model.lora_merge_every
  if not isinstance(merge_every, int) or merge_every < 0:
    _fail("model.lora_merge_every", f"must be a whole number >= 0 (0 = off), got {merge_every!r}")
  if merge_every > 0 and model.lora_rank <= 0:
    _fail("model.lora_merge_every", f"merges LoRA adapters every {merge_every} steps, but "
          "model.lora_rank = 0 (full fine-tuning) trains none: set model.lora_rank > 0 or "
          "lora_merge_every = 0")
  if model.lora_rank > 0:
    if not model.lora_alpha > 0:
      _fail("model.lora_alpha", f"must be > 0, got {model.lora_alpha}")
    unknown = [t for t in model.lora_targets if t not in lora_lib.TARGETS]
    if unknown or not model.lora_targets:
      _fail("model.lora_targets", f"{list(unknown) or 'empty'}: the model has the projections "
            f"{sorted(lora_lib.TARGETS)}")


def _validate_rl(rl: ml_collections.ConfigDict) -> None:
  """config.rl: algorithm, batch shapes, sampling, loss, KL and optimiser fields."""
  if rl.algorithm not in ALGORITHMS:
    _fail("rl.algorithm", f"unknown algorithm {rl.algorithm!r}; choose from {ALGORITHMS}")
  for field in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "epochs",
                "minibatches", "microbatches"):
    if getattr(rl, field) < 1:
      _fail(f"rl.{field}", f"must be >= 1, got {getattr(rl, field)}")
  if rl.group_size < 2 and rl.algorithm in ("rloo", "grpo", "dr_grpo"):
    _fail("rl.group_size", f"{rl.algorithm} needs at least 2 completions per prompt")
  if rl.prompts_per_step % rl.minibatches:
    _fail("rl.minibatches", f"rl.prompts_per_step={rl.prompts_per_step} does not divide into "
          f"{rl.minibatches} minibatches of whole groups")
  if (rl.prompts_per_step // rl.minibatches) % rl.microbatches:
    _fail("rl.microbatches", f"a minibatch of {rl.prompts_per_step // rl.minibatches} prompts "
          f"does not divide into {rl.microbatches} microbatches of whole groups")
  if rl.logits_chunk < 0:
    _fail("rl.logits_chunk", f"must be >= 0 (0 = the whole completion at once), got "
          f"{rl.logits_chunk}")
  if rl.temperature <= 0:
    _fail("rl.temperature", f"must be > 0, got {rl.temperature}")
  if rl.level not in surrogate.LEVELS:
    _fail("rl.level", f"must be one of {surrogate.LEVELS}, got {rl.level!r}")
  if rl.aggregation not in losses.AGGREGATIONS:
    _fail("rl.aggregation", f"must be one of {losses.AGGREGATIONS}, got {rl.aggregation!r}")
  if rl.kl_estimator not in losses.KL_ESTIMATORS:
    _fail("rl.kl_estimator", f"must be one of {losses.KL_ESTIMATORS}, got {rl.kl_estimator!r}")
  if rl.kl_coef < 0:
    _fail("rl.kl_coef", f"must be >= 0, got {rl.kl_coef}")
  if rl.kl_coef > 0 and rl.kl_estimator not in KL_LOSS_ESTIMATORS:
    _fail("rl.kl_estimator", f"{rl.kl_estimator} cannot be a loss term (rl.kl_coef > 0): its "
          "gradient on the policy's own samples is grad logp, whose mean is 0, so it "
          f"regularises nothing; use one of {KL_LOSS_ESTIMATORS}")
  if rl.learning_rate <= 0:
    _fail("rl.learning_rate", f"must be > 0, got {rl.learning_rate}")
  if rl.seed < 0:
    _fail("rl.seed", f"must be >= 0, got {rl.seed}")
  for field in ("gamma", "lam"):
    if not 0.0 <= getattr(rl, field) <= 1.0:
      _fail(f"rl.{field}", f"must lie in [0, 1], got {getattr(rl, field)}")
  for field in ("eps_low", "eps_high", "ratio_guard", "max_kl", "max_grad_norm", "vf_coef",
                "vf_clip"):
    if getattr(rl, field) < 0:
      _fail(f"rl.{field}", f"must be >= 0, got {getattr(rl, field)}")
  _validate_rl_methods(rl)


def _validate_rl_methods(rl: ml_collections.ConfigDict) -> None:
  """config.rl's optional methods: dual clip, entropy bonus, truncated importance sampling, CAPO,
  GRPO's std, Dr. GRPO's aggregation, the KL in the reward, the counterfactual baseline, the
  handling of completions cut at rl.max_new_tokens, the adaptive temperature and the rollout
  allocation."""
  if rl.algorithm == "dr_grpo" and rl.aggregation != DR_GRPO_AGGREGATION:
    _fail("rl.aggregation", f"rl.algorithm='dr_grpo' needs rl.aggregation="
          f"{DR_GRPO_AGGREGATION!r}, got {rl.aggregation!r}: Dr. GRPO removes the "
          "per-completion length normalisation (every token sum is divided by one constant, "
          "rl.max_new_tokens)")
  if rl.dual_clip != 0 and not rl.dual_clip > 1:
    _fail("rl.dual_clip", f"must be 0 (off) or > 1, got {rl.dual_clip}")
  for field in ("entropy_coef", "tis_cap", "kl_reward_coef"):
    if getattr(rl, field) < 0:
      _fail(f"rl.{field}", f"must be >= 0 (0 = off), got {getattr(rl, field)}")
  if rl.proximal not in PROXIMAL:
    _fail("rl.proximal", f"must be one of {PROXIMAL}, got {rl.proximal!r}")
  if rl.proximal == "loglinear" and (rl.algorithm == "ppo" or rl.kl_reward_coef != 0):
    _fail("rl.proximal", "'loglinear' runs no old-policy pass, which PPO's values and a KL in "
          "the reward (rl.kl_reward_coef) read: use 'recompute' with them")
  for field in ("capo_positive_steps", "capo_ramp_steps"):
    value = getattr(rl, field)
    if not isinstance(value, int) or value < 0:
      _fail(f"rl.{field}", f"must be a whole number >= 0, got {value!r}")
  if rl.grpo_std not in adv_lib.GRPO_STDS:
    _fail("rl.grpo_std", f"must be one of {adv_lib.GRPO_STDS}, got {rl.grpo_std!r}")
  if rl.algorithm == "counterfactual" and rl.whiten_rewards:
    _fail("rl.whiten_rewards", "must be False with rl.algorithm='counterfactual': its baseline "
          "is a success rate, in the units of the raw rewards")
  if rl.overlong not in OVERLONG:
    _fail("rl.overlong", f"must be one of {OVERLONG}, got {rl.overlong!r}")
  if not isinstance(rl.overlong_cache, int) or rl.overlong_cache < 0:
    _fail("rl.overlong_cache", f"must be a whole number of tokens >= 0, got "
          f"{rl.overlong_cache!r}")
  if rl.overlong == "penalty" and not 1 <= rl.overlong_cache < rl.max_new_tokens:
    _fail("rl.overlong_cache", f"rl.overlong='penalty' needs 1 <= rl.overlong_cache < "
          f"rl.max_new_tokens={rl.max_new_tokens} (the lengths that are penalised), got "
          f"{rl.overlong_cache}")
  _validate_allocation(rl)
  _validate_adaptive_temperature(rl)
  _validate_engine(rl)


def _validate_engine(rl: ml_collections.ConfigDict) -> None:
  """config.rl's rollout engine: a known engine, positive decode slots, halvings and a prefill
  chunk >= 0 (the mesh and the prompt buffer are checked where they are known:
  `check_decode_slots`, `check_prefill_chunk`)."""
  if rl.engine not in ENGINES:
    _fail("rl.engine", f"must be one of {ENGINES}, got {rl.engine!r}")
  if not isinstance(rl.decode_slots, int) or rl.decode_slots < 1:
    _fail("rl.decode_slots", f"must be a whole number >= 1 (decode slots of the continuous "
          f"engine), got {rl.decode_slots!r}")
  if not isinstance(rl.decode_shrink, int) or rl.decode_shrink < 0:
    _fail("rl.decode_shrink", f"must be a whole number >= 0 (halvings of the decode slots, 0 = "
          f"fixed), got {rl.decode_shrink!r}")
  if not isinstance(rl.prefill_chunk, int) or rl.prefill_chunk < 0:
    _fail("rl.prefill_chunk", f"must be a whole number >= 0 (0 = the whole prompt), got "
          f"{rl.prefill_chunk!r}")


def check_decode_slots(config: ml_collections.ConfigDict, batch_shards: int) -> None:
  """The continuous engine's decode slots against the mesh's data x fsdp = `batch_shards`."""
  rl = config.rl
  if rl.engine == "continuous" and rl.decode_slots % batch_shards:
    _fail("rl.decode_slots", f"{rl.decode_slots} decode slots do not split over data x fsdp = "
          f"{batch_shards} devices (use a multiple of {batch_shards})")


def check_prefill_chunk(config: ml_collections.ConfigDict, prompt_len: int) -> None:
  """The prefill chunk against the prompt buffer of `prompt_len` tokens (known once the data
  is built)."""
  if config.rl.prefill_chunk > prompt_len:
    _fail("rl.prefill_chunk", f"{config.rl.prefill_chunk} is longer than the prompt buffer "
          f"({prompt_len} tokens); use at most {prompt_len}, or 0 for the whole prompt")


def _validate_allocation(rl: ml_collections.ConfigDict) -> None:
  """config.rl.allocation and its per-prompt bounds."""
  if rl.allocation not in budget.ALLOCATIONS:
    _fail("rl.allocation", f"must be one of {budget.ALLOCATIONS}, got {rl.allocation!r}")
  if rl.allocation == "none":
    return
  if not isinstance(rl.allocation_max, int) or rl.allocation_max < rl.group_size:
    _fail("rl.allocation_max", f"must be a whole number >= rl.group_size={rl.group_size} (the "
          f"completion slots of a prompt), got {rl.allocation_max!r}")
  least = 2 if rl.algorithm in ("rloo", "grpo", "dr_grpo") else 1
  if not isinstance(rl.allocation_min, int) or not least <= rl.allocation_min <= rl.group_size:
    _fail("rl.allocation_min", f"must be a whole number in [{least}, rl.group_size="
          f"{rl.group_size}] ({rl.algorithm} needs {least} completions per prompt), got "
          f"{rl.allocation_min!r}")


def _validate_adaptive_temperature(rl: ml_collections.ConfigDict) -> None:
  """config.rl's adaptive sampling temperature: off at temperature_target = 0; on, a positive
  gain and 0 < temperature_min <= temperature <= temperature_max."""
  if rl.temperature_target < 0:
    _fail("rl.temperature_target", f"must be >= 0 (0 = off; nats per token), got "
          f"{rl.temperature_target}")
  if rl.temperature_target == 0:
    return
  if not rl.temperature_rate > 0:
    _fail("rl.temperature_rate", f"must be > 0 with rl.temperature_target > 0, got "
          f"{rl.temperature_rate}")
  if not 0 < rl.temperature_min <= rl.temperature:
    _fail("rl.temperature_min", f"must lie in (0, rl.temperature={rl.temperature}], got "
          f"{rl.temperature_min}")
  if not rl.temperature <= rl.temperature_max:
    _fail("rl.temperature_max", f"must be >= rl.temperature={rl.temperature}, got "
          f"{rl.temperature_max}")


def _validate_mixture(c: ml_collections.ConfigDict) -> None:
  """config.curriculum.arms, config.task.weights and the keys of config.task.options, which a
  mixture of tasks (task names joined by "+") gives a meaning."""
  names = builders.mixture_names(c)
  stray = sorted(set(c.task.options) - set(names))
  if stray:
    _fail("task.options", f"names {stray}, not tasks of task.name={c.task.name!r}: give "
          "{task name: {option: value}} for the tasks it names")
  if c.curriculum.arms not in data.ARM_LAYOUTS:
    _fail("curriculum.arms", f"must be one of {data.ARM_LAYOUTS}, got {c.curriculum.arms!r}")
  if c.curriculum.arms == "task" and len(names) < 2:
    _fail("curriculum.arms", f"'task' makes one arm per task of a mixture, but task.name="
          f"{c.task.name!r} is one task: name several joined by '+' (e.g. 'countdown+zebra') "
          "or use 'bin'")
  weights = tuple(c.task.weights)
  if weights and len(names) < 2:
    _fail("task.weights", f"mixture weights need several tasks in task.name (joined by '+'), "
          f"got the single task {c.task.name!r}; leave task.weights empty")
  if weights and (len(weights) != len(names) or min(weights) <= 0):
    _fail("task.weights", f"must be empty (equal) or one weight > 0 per task of {names}, got "
          f"{list(weights)}")


def _validate_task_and_sft(c: ml_collections.ConfigDict, check_source: bool) -> None:
  """config.task's reward and pool sizes, config.sft, and the prompt template."""
  task = c.task
  if not 0.0 <= task.format_bonus < 1.0:
    _fail("task.format_bonus", f"must lie in [0, 1) (a right answer earns 1), got "
          f"{task.format_bonus}")
  if not 0.0 < task.held_out_fraction < 1.0:
    _fail("task.held_out_fraction", f"must lie in (0, 1), got {task.held_out_fraction}")
  for field in ("train_per_bin", "eval_per_bin"):
    if getattr(task, field) < 1:
      _fail(f"task.{field}", f"must be >= 1, got {getattr(task, field)}")
  if c.sft.steps < 0:
    _fail("sft.steps", f"must be >= 0, got {c.sft.steps}")
  if c.sft.steps:
    for field in ("batch_size", "learning_rate"):
      if getattr(c.sft, field) <= 0:
        _fail(f"sft.{field}", f"must be > 0, got {getattr(c.sft, field)}")
    if task.sft_per_bin < 1:
      _fail("task.sft_per_bin", f"must be >= 1 with an SFT warm start, got {task.sft_per_bin}")
  if check_source and c.model.source and c.sft.steps:
    _fail("sft.steps", "must be 0 with a pretrained model (config.model.source): the SFT "
          "targets are plain-template completions for models trained here")
  if not task.eval_bins:
    _fail("task.eval_bins", "empty: give the bins whose held-out accuracy the run reports")
  if not c.model.source and (not isinstance(c.tokenizer.vocab_size, int)
                             or c.tokenizer.vocab_size <= NUM_RESERVED):
    _fail("tokenizer.vocab_size", f"must be a whole number above the {NUM_RESERVED} reserved ids "
          f"(and at least the task text's distinct characters + {NUM_RESERVED}), got "
          f"{c.tokenizer.vocab_size!r}")
  if c.tokenizer.model_type not in builders.TOKENIZER_TYPES:
    _fail("tokenizer.model_type", f"must be one of {builders.TOKENIZER_TYPES}, got "
          f"{c.tokenizer.model_type!r}")
  if task.template not in TEMPLATES:
    _fail("task.template", f"must be one of {TEMPLATES}, got {task.template!r}")
  if check_source and task.template != "plain" and not c.model.source:
    _fail("task.template", "chat prompts need a pretrained instruct model (config.model.source)")


def _validate_eval(c: ml_collections.ConfigDict) -> None:
  """config.eval and config.checkpoint: sizes, periods, the rollback and collapse handling."""
  if c.eval.min_held_out < 0:
    _fail("eval.min_held_out", f"must be >= 0, got {c.eval.min_held_out}")
  for group, name in (("eval", "every"), ("eval", "batch_size"), ("checkpoint", "every"),
                      ("checkpoint", "keep")):
    if c[group][name] < 1:
      _fail(f"{group}.{name}", f"must be >= 1, got {c[group][name]}")
  for name in ("rollback_after", "collapse_after"):
    value = c.checkpoint[name]
    if not isinstance(value, int) or value < 0:
      _fail(f"checkpoint.{name}", f"must be a whole number >= 0 (0 = off), got {value!r}")
  if c.checkpoint.on_collapse not in ON_COLLAPSE:
    _fail("checkpoint.on_collapse", f"must be one of {ON_COLLAPSE}, got "
          f"{c.checkpoint.on_collapse!r}")
  if not c.checkpoint.collapse_entropy >= 0:
    _fail("checkpoint.collapse_entropy", f"must be >= 0 (0 = off), got "
          f"{c.checkpoint.collapse_entropy}")
  if not 0 <= c.checkpoint.collapse_reward_drop < 1:
    _fail("checkpoint.collapse_reward_drop", f"must lie in [0, 1) (0 = off), got "
          f"{c.checkpoint.collapse_reward_drop}")


def _validate_bins(task: ml_collections.ConfigDict, num_task_bins: int, eval_only_bins) -> None:
  """config.task.train_bins and eval_bins against the task's `num_task_bins` bins."""
  bad = [b for b in task.train_bins if not 0 <= b < num_task_bins or b in eval_only_bins]
  if bad or not task.train_bins:
    _fail("task.train_bins", f"{list(bad) or 'empty'}: training bins must lie in "
          f"[0, {num_task_bins}) and not be evaluation-only {tuple(eval_only_bins)}")
  if len(set(task.train_bins)) != len(task.train_bins):
    _fail("task.train_bins", f"{list(task.train_bins)} lists a bin twice")
  bad = [b for b in task.eval_bins if not 0 <= b < num_task_bins]
  if bad:
    _fail("task.eval_bins", f"{bad} outside [0, {num_task_bins})")
  if len(set(task.eval_bins)) != len(task.eval_bins):
    _fail("task.eval_bins", f"{list(task.eval_bins)} lists a bin twice")


def _validate_curriculum(c: ml_collections.ConfigDict, task=None) -> None:
  """The curriculum, its options and the post-rollout filter, checked by building the curriculum
  for the configured number of arms (`num_arms`; the constructors check every option's value)."""
  cur_config = c.curriculum
  name = cur_config.name
  if name not in builders.CURRICULA:
    _fail("curriculum.name", f"unknown curriculum {name!r}; choose from "
          f"{sorted(builders.CURRICULA)}")
  allowed = _options_of(builders.CURRICULA[name])
  for key in cur_config.options:
    if key not in allowed:
      _fail(f"curriculum.options.{key}", f"{name} takes no option {key!r}; it takes "
            f"{sorted(allowed)}")
  if cur_config.feedback not in CURRICULUM_FEEDBACK:
    _fail("curriculum.feedback", f"must be one of {CURRICULUM_FEEDBACK}, got "
          f"{cur_config.feedback!r}")
  if cur_config.filter not in builders.FILTERS:
    _fail("curriculum.filter", f"unknown filter {cur_config.filter!r}; choose from "
          f"{builders.FILTERS}")
  p, factor = c.rl.prompts_per_step, cur_config.oversample
  if cur_config.filter == "none":
    if factor != 1:
      _fail("curriculum.oversample", "over-sampling only makes sense with a post-rollout filter "
            f"(curriculum.filter is 'none'), got {factor}")
  else:
    if not factor > 1:
      _fail("curriculum.oversample", f"must be > 1 with the {cur_config.filter!r} filter (a "
            f"filter can only shrink the batch), got {factor}")
    if not float(p * factor).is_integer():
      _fail("curriculum.oversample", f"rl.prompts_per_step x oversample = {p} x {factor} must be "
            "a whole number of prompts")
  band = tuple(cur_config.band)
  if len(band) != 2 or not 0.0 <= band[0] <= band[1] <= 1.0:
    _fail("curriculum.band", f"must be (lo, hi) with 0 <= lo <= hi <= 1, got {band}")
  if not isinstance(cur_config.high_variance_only, bool):
    _fail("curriculum.high_variance_only", f"must be True or False, got "
          f"{cur_config.high_variance_only!r}")
  if cur_config.high_variance_only and name != "vcrl":
    _fail("curriculum.high_variance_only", f"needs curriculum.name='vcrl' (whose update marks "
          f"the high-variance groups), got {name!r}")
  if cur_config.features_every < 0:
    _fail("curriculum.features_every", f"must be >= 0, got {cur_config.features_every}")
  if cur_config.features_batch_size < 1:
    _fail("curriculum.features_batch_size", f"must be >= 1, got "
          f"{cur_config.features_batch_size}")
  if not c.task.train_bins:
    _fail("task.train_bins", "empty: the curriculum needs at least one arm")
  try:
    # No pool yet: the number of arms stands in for it (PCL's features come with the real pool).
    builders.build_curriculum(c, builders.num_arms(c, task), builders.sampled_prompts(c))
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.curriculum.options: {name}: {e}") from e
