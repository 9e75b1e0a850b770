"""Which completion slots a step samples: pre-rollout skips and the rollout budget's allocation.

Every sampled prompt owns G_max = `group_slots(config)` completion slots (rows of the rollout,
fixed shapes); `slot_mask` marks the slots that are sampled, scored and trained on (`Batch.valid`):

  - a prompt the curriculum skipped before rollout (`Selection.active` False, GRESO) gets none;
  - with `rl.allocation` the S x `rl.group_size` completions of the step are spread over the S
    prompts, between `rl.allocation_min` and G_max = `rl.allocation_max` each
    (`curriculum.allocation`): uniformly, by the Beta posterior variance of each prompt's success
    (more where the outcome is least certain) or by difficulty (more where success is rare);
  - otherwise every slot of an active prompt (G_max = `rl.group_size`).

The posteriors come from the run's own per-prompt statistics (`prompt_stats.PromptStats` of every
earlier rollout, Beta(1, 1) prior), kept and checkpointed next to the curriculum's state when a
method reads them (`needs_prompt_stats`): the variance and difficulty allocations, and the
counterfactual baseline (`rl.algorithm="counterfactual"`, b[p] = the prompt's posterior mean
success before this step, 0.5 on its first visit).

Reference for budgets that follow each prompt's posterior: Zeng et al. (2025), "CurES: From
Gradient Analysis to Efficient Curriculum Learning for Reasoning LLMs", arXiv:2510.01037.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum.curriculum import allocation
from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.types import Feedback, Selection

ALLOCATIONS = ("none", "uniform", "variance", "difficulty")


def group_slots(config: ml_collections.ConfigDict) -> int:
  """G_max: completion slots (rollout rows) per sampled prompt."""
  if config.rl.allocation == "none":
    return config.rl.group_size
  return config.rl.allocation_max


def needs_prompt_stats(config: ml_collections.ConfigDict) -> bool:
  """Whether the run keeps per-prompt statistics (a posterior-driven allocation, or the
  counterfactual baseline)."""
  return (config.rl.allocation in ("variance", "difficulty")
          or config.rl.algorithm == "counterfactual")


def init_prompt_stats(config: ml_collections.ConfigDict,
                      num_prompts: int) -> Optional[prompt_stats.PromptStats]:
  """An empty store for the pool's prompts, or None when no method reads one."""
  return prompt_stats.init(num_prompts) if needs_prompt_stats(config) else None


def success_mean(stats: prompt_stats.PromptStats, prompt_ids) -> np.ndarray:
  """f32[S] posterior mean success a / (a + b) of each prompt (0.5 before its first visit)."""
  a = np.asarray(stats.beta_a)[np.asarray(prompt_ids)]
  b = np.asarray(stats.beta_b)[np.asarray(prompt_ids)]
  return (a / (a + b)).astype(np.float32)


def allocated_counts(config: ml_collections.ConfigDict, prompt_ids,
                     stats: Optional[prompt_stats.PromptStats]) -> np.ndarray:
  """i32[S] completions of each prompt under `rl.allocation` (summing to S x rl.group_size)."""
  rl, s = config.rl, len(prompt_ids)
  bounds = dict(budget=s * rl.group_size, max_per_prompt=group_slots(config),
                min_per_prompt=rl.allocation_min)
  if rl.allocation == "none":
    return np.full(s, rl.group_size, np.int32)
  if rl.allocation == "uniform":
    result = allocation.allocate_uniform(s, **bounds)
  elif rl.allocation == "variance":
    ids = np.asarray(prompt_ids)
    result = allocation.allocate_by_variance(jnp.asarray(np.asarray(stats.beta_a)[ids]),
                                             jnp.asarray(np.asarray(stats.beta_b)[ids]), **bounds)
  elif rl.allocation == "difficulty":
    result = allocation.allocate_by_difficulty(jnp.asarray(success_mean(stats, prompt_ids)),
                                               **bounds)
  else:
    raise ValueError(f"unknown allocation {rl.allocation!r}; choose from {ALLOCATIONS}")
  return np.asarray(result.counts, np.int32)


def slot_mask(config: ml_collections.ConfigDict, selection: Selection,
              stats: Optional[prompt_stats.PromptStats]) -> np.ndarray:
  """bool[S, G_max] the completion slots this step samples (module docstring)."""
  counts = allocated_counts(config, selection.prompt_ids, stats)
  mask = np.arange(group_slots(config))[None, :] < counts[:, None]
  if selection.active is not None:
    mask &= np.asarray(selection.active, bool)[:, None]
  return mask


def observe(stats: Optional[prompt_stats.PromptStats], batch,
            step: int) -> Optional[prompt_stats.PromptStats]:
  """The store after the sampled completions of `batch` (an `rl_types.Batch`), or None."""
  if stats is None:
    return None
  return _update(stats, np.asarray(batch.prompt_ids), np.asarray(batch.correct),
                 np.asarray(batch.valid), np.int32(step))


@jax.jit
def _update(stats: prompt_stats.PromptStats, prompt_ids: jax.Array,
                        correct: jax.Array, valid: jax.Array,
                        step: jax.Array) -> prompt_stats.PromptStats:
  """The store after one step's valid completions (raw correctness bool[S, G_max])."""
  zeros = jnp.zeros(correct.shape, jnp.float32)
  feedback = Feedback(prompt_ids=prompt_ids, arms=jnp.zeros_like(prompt_ids), rewards=zeros,
                      correct=correct, advantages=zeros, valid=valid)
  return prompt_stats.update(stats, feedback, step)
