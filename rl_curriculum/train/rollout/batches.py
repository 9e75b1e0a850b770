"""A step's rows on the host side: where they live, the `Batch` made of them once scored.

  layout = row_layout(config, mesh)                      # B = S x G rows over the batch axes
  batch = build_batch(config, run, layout, scored, rows, key_filter, prompt_stats, versions)
  stats = batch_stats(config, num_arms, selection, rewards, valid, group_valid)

Scoring runs on the host, each process its own rows, as episodes (`episodes.step_turns`: a
single-turn completion is a one-turn episode its task scores); `build_batch` is the one place a
`rl_types.Batch` is made, for the loop (`pipeline.learn_batch`) and the overlap benchmark alike:
the post-rollout filter (`curriculum.filter`) picks the trained groups there.
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum.curriculum import filters
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import rewards as rewards_lib
from rl_curriculum.train.learn.rl_types import Batch
from rl_curriculum.train.rollout import budget
from rl_curriculum.train.setup import builders, validation
from rl_curriculum.train.setup.prepare import Prepared
from rl_curriculum.types import Feedback, Selection

__all__ = ["RowLayout", "row_layout", "train_groups", "Scored",
           "build_batch", "batch_stats"]


class RowLayout(NamedTuple):
  """Where a step's B = S x G rollout rows live: over the mesh's batch axes, this process holding
  the rows `mine` (ascending)."""
  mesh: Any
  sharding: Any
  num_rows: int
  mine: np.ndarray


def row_layout(config: ml_collections.ConfigDict, mesh) -> RowLayout:
  """The run's RowLayout; a ConfigError when the rows do not split over the batch axes."""
  num_rows = builders.sampled_prompts(config) * budget.group_slots(config)
  if num_rows % mesh_lib.batch_size_of(mesh):
    raise validation.ConfigError(
        f"config.parallel.mesh_shape: {num_rows} rollout rows (prompts_per_step x oversample x "
        f"group_size, or allocation_max with an allocation) do not split over data x fsdp = "
        f"{mesh_lib.batch_size_of(mesh)} devices")
  sharding = mesh_lib.batch_sharding(mesh, 2)
  return RowLayout(mesh=mesh, sharding=sharding, num_rows=num_rows,
                   mine=distributed.local_row_indices(sharding, num_rows))


def train_groups(config: ml_collections.ConfigDict, correct: np.ndarray, valid: np.ndarray,
                 p: int, key):
  """Post-rollout filter on raw correctness bool[S, G] of the sampled completions (valid
  bool[S, G]): indices of the P groups to train on (a
  uniformly random subset of the survivors when more than P survive) and whether each slot holds
  a real group (short batches are padded with masked slots, never duplicates)."""
  if config.curriculum.filter == "none":
    return np.arange(p, dtype=np.int32), np.ones(p, bool)
  s, g = correct.shape
  fb = Feedback(prompt_ids=jnp.zeros(s, jnp.int32), arms=jnp.zeros(s, jnp.int32),
                rewards=jnp.zeros((s, g)), correct=jnp.asarray(correct),
                advantages=jnp.zeros((s, g)), valid=jnp.asarray(valid))
  kwargs = {}
  if config.curriculum.filter == "accuracy_band":
    kwargs = dict(lo=config.curriculum.band[0], hi=config.curriculum.band[1])
  result = filters.dynamic_filter(fb, mode=config.curriculum.filter, **kwargs)
  indices, slot_valid = filters.compact_indices(result.keep, p, key)
  return np.asarray(indices, np.int32), np.asarray(slot_valid, bool)


class Scored(NamedTuple):
  """One batch's host record once its episodes are scored (S prompts x G completion slots)."""
  prompt_ids: np.ndarray  # i32[S] pool indices
  arms: np.ndarray        # i32[S] curriculum arms
  valid: np.ndarray       # bool[S, G] completions sampled, scored and kept (a dropped group's:
                          # none)
  rewards: np.ndarray     # f32[S, G] the episodes' returns
  correct: np.ndarray     # bool[S, G]
  turn_rewards: Optional[np.ndarray] = None  # f32[S, G, H] each turn's reward (None: unknown)
  cut: Optional[np.ndarray] = None  # bool[S, G] episodes a turn or position limit ended


def build_batch(config: ml_collections.ConfigDict, run: Prepared, layout: RowLayout,
                scored: Scored, rows: tuple, key_filter: jax.Array, prompt_stats,
                versions: Optional[jax.Array] = None) -> Batch:
  """The `rl_types.Batch` the learn step takes: a scored batch's completions `rows` = (tokens
  i32[R, T], log-probs f32[R, T], mask f32[R, T]) over the learner's rows (`layout`), their
  prompts from the pool, the groups the post-rollout filter keeps (`train_groups`, drawn with
  `key_filter`), the counterfactual baseline from `prompt_stats` (the per-prompt statistics
  before this batch), which rows a limit cut (the last drawn token no stop id, or the episode
  `cut`), each turn's reward, and `versions` (i32[R, T], the policy version of each token;
  None: every token of the version the update starts from)."""
  g = budget.group_slots(config)
  tokens, logprobs, mask = rows
  mine = np.repeat(scored.prompt_ids, g)[layout.mine]
  to_global = lambda x: distributed.rows_to_global(x, layout.sharding, layout.num_rows)
  groups, group_valid = train_groups(config, scored.correct, scored.valid,
                                     config.rl.prompts_per_step, key_filter)
  baseline = None
  if config.rl.algorithm == "counterfactual":
    baseline = jnp.asarray(budget.success_mean(prompt_stats, scored.prompt_ids))
  stop = (run.tokenizer.eos_id, *run.stop_ids)
  truncated = rewards_lib.truncated_completions(tokens, mask, stop).reshape(-1, g)
  if scored.cut is not None:
    truncated = truncated | jnp.asarray(scored.cut)
  return Batch(
      prompt_tokens=to_global(run.pool.tokens[mine]), prompt_mask=to_global(run.pool.mask[mine]),
      tokens=tokens, mask=mask, sampler_logprobs=logprobs,
      prompt_ids=jnp.asarray(scored.prompt_ids), arms=jnp.asarray(scored.arms),
      rewards=jnp.asarray(scored.rewards), correct=jnp.asarray(scored.correct),
      valid=jnp.asarray(scored.valid), train_groups=jnp.asarray(groups),
      train_valid=jnp.asarray(group_valid), baseline=baseline,
      truncated=truncated, versions=versions,
      turn_rewards=None if scored.turn_rewards is None else jnp.asarray(scored.turn_rewards))


def batch_stats(config: ml_collections.ConfigDict, num_arms: int, selection: Selection,
                rewards: np.ndarray, valid: np.ndarray, group_valid: np.ndarray) -> dict:
  """Host statistics of a scored batch for the log: the sampled reward, the curriculum's arms,
  the groups kept by the filter, rollouts sampled and saved, and an allocation's range."""
  arm_counts = np.bincount(np.asarray(selection.arms), minlength=num_arms)
  budgeted = builders.sampled_prompts(config) * config.rl.group_size
  stats = {"sampled_reward_mean": float(rewards[valid].mean()) if valid.any() else 0.0,
           "curriculum/arm_frac": arm_counts / arm_counts.sum(),
           "groups_kept": float(group_valid.sum()),
           "rollouts": float(valid.sum()), "rollouts_saved": float(budgeted - valid.sum())}
  if config.rl.allocation != "none":
    counts = valid.sum(axis=1)
    stats.update({"allocation/min": float(counts.min()), "allocation/max": float(counts.max())})
  return stats
