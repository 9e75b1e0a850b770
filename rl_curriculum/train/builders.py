"""From a config to the run's parts, and the checks that reject a bad config before compiling.

`validate(config)` raises `ConfigError` naming the offending field; it touches no device and
compiles nothing, so a typo costs a second, not a compile. The curricula a config can name are the
one plain dict `CURRICULA` below.
"""

import inspect
import os
from typing import Callable, Optional, Union

import ml_collections
import optax

from rl_curriculum import curriculum as cur
from rl_curriculum import tasks as tasks_lib
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import pretrained
from rl_curriculum.model.config import PRESETS, REMAT_POLICIES, ModelConfig
from rl_curriculum.train import budget
from rl_curriculum.train import data
from rl_curriculum.train import rl_step


class ConfigError(ValueError):
  """A config field has a value the run cannot use; the message names the field."""


# name -> constructor. Every constructor is `name(pool, *, batch_size, **options)`.
CURRICULA: dict[str, Callable[..., cur.Curriculum]] = {
    "sec": cur.sec,
    "uniform": cur.uniform,
    "easy_to_hard": cur.easy_to_hard,
    "hard_to_easy": cur.hard_to_easy,
    "linear_pacing": cur.linear_pacing,
    "cyclical": cur.cyclical,
    "mixed_replay": cur.mixed_replay,
    "dump": cur.dump,
    "alp_teacher": cur.alp_teacher,
    "mastering_rate": cur.mastering_rate,
    "vcrl": cur.vcrl,
    "vade": cur.vade,
    "greso": cur.greso,
    "adarft": cur.adarft,
    "pcl": cur.pcl,
    "hard_focus": cur.hard_focus,
}

FILTERS = ("none", "all_equal", "accuracy_band")
TOKENIZER_TYPES = ("unigram", "bpe")  # SentencePiece model types of a tokenizer trained here
ALGORITHMS = tuple(sorted(rl_step.ADVANTAGES)) + ("ppo",)
_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


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
  _validate_model(config.model, check_source)
  _validate_rl(config.rl)
  _validate_mixture(config)
  if task is not None:
    _validate_bins(config.task, task.num_difficulties, task.eval_only_bins)
  _validate_curriculum(config, task)
  _validate_task_and_sft(config, check_source)
  _validate_eval(config)


def mixture_names(config: ml_collections.ConfigDict) -> tuple:
  """The task names `config.task.name` joins with "+" (one name: a single task)."""
  return tuple(config.task.name.split(tasks_lib.SEPARATOR))


def task_options(config: ml_collections.ConfigDict) -> dict:
  """{task name: its constructor options} from `config.task.options`, as plain dicts."""
  return {name: dict(options) for name, options in config.task.options.items()}


def build_task(config: ml_collections.ConfigDict):
  """The configured task (a `tasks.MixtureTask` for names joined by "+").

  Raises:
    KeyError, ValueError, TypeError: an unknown task or a bad option (`tasks.get_task`).
  """
  return tasks_lib.get_task(config.task.name, template=config.task.template,
                            format_bonus=config.task.format_bonus,
                            task_options=task_options(config))


def num_arms(config: ml_collections.ConfigDict, task=None) -> int:
  """K, the curriculum's arms: one per training bin (`curriculum.arms` = "bin"), or one per task
  with a training bin ("task"; without the `task` object, one per task the name joins)."""
  if config.curriculum.arms == "task":
    if task is None:
      return len(mixture_names(config))
    return len(data.arms_of(task, config.task.train_bins, "task").names)
  return len(config.task.train_bins)


def _validate_mixture(c: ml_collections.ConfigDict) -> None:
  """config.curriculum.arms, config.task.weights and the keys of config.task.options, which a
  mixture of tasks (task names joined by "+") gives a meaning."""
  names = mixture_names(c)
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
  if rl.level not in ("token", "sequence"):
    _fail("rl.level", f"must be 'token' or 'sequence', got {rl.level!r}")
  if rl.aggregation not in _AGGREGATIONS:
    _fail("rl.aggregation", f"must be one of {_AGGREGATIONS}, got {rl.aggregation!r}")
  if rl.kl_estimator not in ("k1", "k2", "k3"):
    _fail("rl.kl_estimator", f"must be k1, k2 or k3, got {rl.kl_estimator!r}")
  if rl.kl_coef < 0:
    _fail("rl.kl_coef", f"must be >= 0, got {rl.kl_coef}")
  if rl.kl_coef > 0 and rl.kl_estimator not in rl_step.KL_LOSS_ESTIMATORS:
    _fail("rl.kl_estimator", f"{rl.kl_estimator} cannot be a loss term (rl.kl_coef > 0): its "
          "gradient on the policy's own samples is grad logp, whose mean is 0, so it "
          f"regularises nothing; use one of {rl_step.KL_LOSS_ESTIMATORS}")
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
  if rl.algorithm == "dr_grpo" and rl.aggregation != rl_step.DR_GRPO_AGGREGATION:
    _fail("rl.aggregation", f"rl.algorithm='dr_grpo' needs rl.aggregation="
          f"{rl_step.DR_GRPO_AGGREGATION!r}, got {rl.aggregation!r}: Dr. GRPO removes the "
          "per-completion length normalisation (every token sum is divided by one constant, "
          "rl.max_new_tokens)")
  if rl.dual_clip != 0 and not rl.dual_clip > 1:
    _fail("rl.dual_clip", f"must be 0 (off) or > 1, got {rl.dual_clip}")
  for field in ("entropy_coef", "tis_cap", "kl_reward_coef"):
    if getattr(rl, field) < 0:
      _fail(f"rl.{field}", f"must be >= 0 (0 = off), got {getattr(rl, field)}")
  for field in ("capo_positive_steps", "capo_ramp_steps"):
    value = getattr(rl, field)
    if not isinstance(value, int) or value < 0:
      _fail(f"rl.{field}", f"must be a whole number >= 0, got {value!r}")
  if rl.grpo_std not in rl_step.GRPO_STDS:
    _fail("rl.grpo_std", f"must be one of {rl_step.GRPO_STDS}, got {rl.grpo_std!r}")
  if rl.algorithm == "counterfactual" and rl.whiten_rewards:
    _fail("rl.whiten_rewards", "must be False with rl.algorithm='counterfactual': its baseline "
          "is a success rate, in the units of the raw rewards")
  if rl.overlong not in rl_step.OVERLONG:
    _fail("rl.overlong", f"must be one of {rl_step.OVERLONG}, got {rl.overlong!r}")
  if not isinstance(rl.overlong_cache, int) or rl.overlong_cache < 0:
    _fail("rl.overlong_cache", f"must be a whole number of tokens >= 0, got "
          f"{rl.overlong_cache!r}")
  if rl.overlong == "penalty" and not 1 <= rl.overlong_cache < rl.max_new_tokens:
    _fail("rl.overlong_cache", f"rl.overlong='penalty' needs 1 <= rl.overlong_cache < "
          f"rl.max_new_tokens={rl.max_new_tokens} (the lengths that are penalised), got "
          f"{rl.overlong_cache}")
  _validate_allocation(rl)
  _validate_adaptive_temperature(rl)


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
  if c.tokenizer.model_type not in TOKENIZER_TYPES:
    _fail("tokenizer.model_type", f"must be one of {TOKENIZER_TYPES}, got "
          f"{c.tokenizer.model_type!r}")
  if task.template not in ("plain", "chat", "chat_short"):
    _fail("task.template", f"must be plain, chat or chat_short, got {task.template!r}")
  if check_source and task.template != "plain" and not c.model.source:
    _fail("task.template", "chat prompts need a pretrained instruct model (config.model.source)")


def _validate_eval(c: ml_collections.ConfigDict) -> None:
  """config.eval and config.checkpoint: sizes, periods and the rollback."""
  if c.eval.min_held_out < 0:
    _fail("eval.min_held_out", f"must be >= 0, got {c.eval.min_held_out}")
  for group, name in (("eval", "every"), ("eval", "batch_size"), ("checkpoint", "every"),
                      ("checkpoint", "keep")):
    if c[group][name] < 1:
      _fail(f"{group}.{name}", f"must be >= 1, got {c[group][name]}")
  rollback_after = c.checkpoint.rollback_after
  if not isinstance(rollback_after, int) or rollback_after < 0:
    _fail("checkpoint.rollback_after", f"must be a whole number >= 0 (0 = off), got "
          f"{rollback_after!r}")


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


def sampled_prompts(config: ml_collections.ConfigDict) -> int:
  """S: prompts rolled out a step, prompts_per_step x oversample (a whole number: `validate`)."""
  return int(round(config.rl.prompts_per_step * config.curriculum.oversample))


def _validate_curriculum(c: ml_collections.ConfigDict, task=None) -> None:
  """The curriculum, its options and the post-rollout filter, checked by building the curriculum
  for the configured number of arms (`num_arms`; the constructors check every option's value)."""
  cur_config = c.curriculum
  name = cur_config.name
  if name not in CURRICULA:
    _fail("curriculum.name", f"unknown curriculum {name!r}; choose from {sorted(CURRICULA)}")
  allowed = _options_of(CURRICULA[name])
  for key in cur_config.options:
    if key not in allowed:
      _fail(f"curriculum.options.{key}", f"{name} takes no option {key!r}; it takes "
            f"{sorted(allowed)}")
  if cur_config.feedback not in rl_step.CURRICULUM_FEEDBACK:
    _fail("curriculum.feedback", f"must be one of {rl_step.CURRICULUM_FEEDBACK}, got "
          f"{cur_config.feedback!r}")
  if cur_config.filter not in FILTERS:
    _fail("curriculum.filter", f"unknown filter {cur_config.filter!r}; choose from {FILTERS}")
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
    build_curriculum(c, num_arms(c, task), sampled_prompts(c))
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.curriculum.options: {name}: {e}") from e


def build_curriculum(config: ml_collections.ConfigDict, pool: Union[cur.PromptPool, int],
                     batch_size: int) -> cur.Curriculum:
  """The configured curriculum for `batch_size` prompt slots a step.

  `pool` is the PromptPool the curriculum will select from (for PCL, one that carries the prompts'
  features: `PromptPool.with_features`), or its number of arms where no pool exists yet, as in
  `validate`."""
  constructor = CURRICULA[config.curriculum.name]
  return constructor(pool, batch_size=batch_size, **dict(config.curriculum.options))


def model_numerics(config: ml_collections.ConfigDict) -> dict:
  """The ModelConfig fields `config.model` sets on any model (preset or checkpoint): compute and
  storage dtypes, layer scan, rematerialisation."""
  m = config.model
  return dict(dtype=m.dtype, param_dtype=m.param_dtype, scan_layers=bool(m.scan_layers),
              remat=m.remat)


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
  """The ModelConfig of `config.model.preset` (the tiny model takes the tokenizer's vocabulary)."""
  preset = PRESETS[config.model.preset]
  if config.model.preset == "tiny":
    return preset(vocab_size=vocab_size, **model_numerics(config))
  return preset(**model_numerics(config))


def build_optimizer(learning_rate: float, *, max_grad_norm: float, warmup_steps: int = 0,
                    total_steps: int = 0) -> optax.GradientTransformation:
  """AdamW (no weight decay on a fine-tune by default) with global-norm clipping and warmup."""
  if warmup_steps and total_steps:
    warmup_steps = min(warmup_steps, total_steps // 2)  # a short run still decays
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, total_steps,
                                                  end_value=0.1 * learning_rate)
  else:
    schedule = learning_rate
  chain = [optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=0.0)]
  if max_grad_norm and max_grad_norm > 0:
    chain.insert(0, optax.clip_by_global_norm(max_grad_norm))
  return optax.chain(*chain)


def learn_config(config: ml_collections.ConfigDict) -> rl_step.LearnConfig:
  """The learn step's static hyperparameters, every one from the config."""
  rl = config.rl
  return rl_step.LearnConfig(
      algorithm=rl.algorithm, epochs=rl.epochs, minibatches=rl.minibatches,
      microbatches=rl.microbatches, logits_chunk=rl.logits_chunk,
      eps_low=rl.eps_low, eps_high=rl.eps_high, level=rl.level, aggregation=rl.aggregation,
      max_tokens=rl.max_new_tokens, temperature=float(rl.temperature), kl_coef=rl.kl_coef,
      kl_estimator=rl.kl_estimator, ratio_guard=rl.ratio_guard, max_kl=rl.max_kl or None,
      whiten_rewards=rl.whiten_rewards, curriculum_feedback=config.curriculum.feedback,
      gamma=rl.gamma, lam=rl.lam, vf_coef=rl.vf_coef, vf_clip=rl.vf_clip,
      value_detach=rl.value_detach, dual_clip=float(rl.dual_clip),
      entropy_coef=float(rl.entropy_coef), tis_cap=float(rl.tis_cap),
      capo_positive_steps=rl.capo_positive_steps, capo_ramp_steps=rl.capo_ramp_steps,
      grpo_std=rl.grpo_std, kl_reward_coef=float(rl.kl_reward_coef), overlong=rl.overlong,
      overlong_cache=rl.overlong_cache,
      high_variance_only=bool(config.curriculum.high_variance_only),
      temperature_target=float(rl.temperature_target),
      temperature_rate=float(rl.temperature_rate), temperature_min=float(rl.temperature_min),
      temperature_max=float(rl.temperature_max))
