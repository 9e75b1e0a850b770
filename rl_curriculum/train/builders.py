"""From a config to the run's parts: the task, the curriculum, the model's shape, the optimizer
and the learn step's static hyperparameters.

Every function reads a config that `validation.validate` has checked. The curricula a config can
name are the one plain dict `CURRICULA` below; the post-rollout filters are `FILTERS`.
"""

from typing import Callable, Union

import ml_collections
import optax

from rl_curriculum import curriculum as cur
from rl_curriculum import tasks as tasks_lib
from rl_curriculum.curriculum import filters
from rl_curriculum.model.config import PRESETS, ModelConfig
from rl_curriculum.train import data
from rl_curriculum.train.rl_types import LearnConfig

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

# Post-rollout filters (`curriculum.filter`): none, or a mode of `filters.dynamic_filter`.
FILTERS = ("none",) + filters.FILTER_MODES
TOKENIZER_TYPES = ("unigram", "bpe")  # SentencePiece model types of a tokenizer trained here


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


def sampled_prompts(config: ml_collections.ConfigDict) -> int:
  """S: prompts rolled out a step, prompts_per_step x oversample (a whole number: `validate`)."""
  return int(round(config.rl.prompts_per_step * config.curriculum.oversample))


def build_curriculum(config: ml_collections.ConfigDict, pool: Union[cur.PromptPool, int],
                     batch_size: int) -> cur.Curriculum:
  """The configured curriculum for `batch_size` prompt slots a step.

  `pool` is the PromptPool the curriculum will select from (for PCL, one that carries the prompts'
  features: `PromptPool.with_features`), or its number of arms where no pool exists yet, as in
  `validation.validate`."""
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


def learn_config(config: ml_collections.ConfigDict) -> LearnConfig:
  """The learn step's static hyperparameters, every one from the config."""
  rl = config.rl
  return LearnConfig(
      algorithm=rl.algorithm, epochs=rl.epochs, minibatches=rl.minibatches,
      microbatches=rl.microbatches, logits_chunk=rl.logits_chunk,
      eps_low=rl.eps_low, eps_high=rl.eps_high, level=rl.level, aggregation=rl.aggregation,
      max_tokens=rl.max_new_tokens, temperature=float(rl.temperature), kl_coef=rl.kl_coef,
      kl_estimator=rl.kl_estimator, ratio_guard=rl.ratio_guard, max_kl=rl.max_kl or None,
      whiten_rewards=rl.whiten_rewards, curriculum_feedback=config.curriculum.feedback,
      gamma=rl.gamma, lam=rl.lam, vf_coef=rl.vf_coef, vf_clip=rl.vf_clip,
      value_detach=rl.value_detach, dual_clip=float(rl.dual_clip),
      entropy_coef=float(rl.entropy_coef), tis_cap=float(rl.tis_cap), proximal=rl.proximal,
      capo_positive_steps=rl.capo_positive_steps, capo_ramp_steps=rl.capo_ramp_steps,
      grpo_std=rl.grpo_std, kl_reward_coef=float(rl.kl_reward_coef), overlong=rl.overlong,
      overlong_cache=rl.overlong_cache,
      high_variance_only=bool(config.curriculum.high_variance_only),
      temperature_target=float(rl.temperature_target),
      temperature_rate=float(rl.temperature_rate), temperature_min=float(rl.temperature_min),
      temperature_max=float(rl.temperature_max))
