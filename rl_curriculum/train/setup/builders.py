"""From a config to the run's parts: the task, the curriculum, the model's shape, the optimizer
and the learn step's static hyperparameters.

Every function reads a config that `validation.validate` has checked. The curricula a config can
name are the one plain dict `CURRICULA` below; the post-rollout filters are `FILTERS`.
"""

from typing import Callable, Optional, Union

import jax
import ml_collections
import optax

from rl_curriculum import curriculum as cur
from rl_curriculum import tasks as tasks_lib
from rl_curriculum.curriculum import filters
from rl_curriculum.model.config import PRESETS, ModelConfig
from rl_curriculum.train.learn.rl_types import LearnConfig
from rl_curriculum.train.setup import data

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
    "learnability": cur.learnability,
    "vcrl": cur.vcrl,
    "vade": cur.vade,
    "greso": cur.greso,
    "adarft": cur.adarft,
    "pcl": cur.pcl,
    "hard_focus": cur.hard_focus,
}

# The numeric options each curriculum only computes with (its updates' step sizes, its selection's
# temperatures and shares), which the programs trace: a sweep over them compiles nothing new.
# The other options shape a curriculum's state or selection and are part of the programs.
TRACED_OPTIONS: dict[str, tuple[str, ...]] = {
    "sec": ("alpha", "temperature", "epsilon", "ucb_c"),
    "dump": ("temperature",),
    "alp_teacher": ("epsilon",),
    "mastering_rate": ("unlock_threshold", "mastery_threshold", "rate"),
    "learnability": ("alpha", "epsilon"),
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
  storage dtypes, layer scan, rematerialisation, attention kernels."""
  m = config.model
  return dict(dtype=m.dtype, param_dtype=m.param_dtype, scan_layers=bool(m.scan_layers),
              remat=m.remat, attention=m.attention, attention_block=m.attention_block,
              kv_dtype=m.kv_dtype)


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
  """The ModelConfig of `config.model.preset` (the tiny model takes the tokenizer's vocabulary)."""
  preset = PRESETS[config.model.preset]
  if config.model.preset == "tiny":
    return preset(vocab_size=vocab_size, **model_numerics(config))
  return preset(**model_numerics(config))


def build_optimizer(learning_rate: float, *, max_grad_norm: Optional[float],
                    warmup_steps: int = 0, total_steps: int = 0) -> optax.GradientTransformation:
  """AdamW (no weight decay on a fine-tune by default) with global-norm clipping (None or 0: off)
  and warmup. The learning rate and clipping norm may be traced (the learn program's)."""
  if warmup_steps and total_steps:
    warmup_steps = min(warmup_steps, total_steps // 2)  # a short run still decays
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, total_steps,
                                                  end_value=0.1 * learning_rate)
  else:
    schedule = learning_rate
  chain = [optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=0.0)]
  if max_grad_norm is not None and (isinstance(max_grad_norm, jax.core.Tracer)
                                    or max_grad_norm > 0):
    chain.insert(0, optax.clip_by_global_norm(max_grad_norm))
  return optax.chain(*chain)


def traced_options(config: ml_collections.ConfigDict) -> dict:
  """{option: float} of the configured curriculum's `TRACED_OPTIONS` the config sets (the
  constructor's defaults stand for the others)."""
  traced = TRACED_OPTIONS.get(config.curriculum.name, ())
  return {k: float(v) for k, v in config.curriculum.options.items() if k in traced}


def learn_config(config: ml_collections.ConfigDict) -> LearnConfig:
  """The learn program's settings (`LearnConfig.from_config`) with the curriculum's traced
  options."""
  return LearnConfig.from_config(config, curriculum=traced_options(config))
