"""Phase 5 of a run, up to the learn step: from the curriculum's selection to a scored batch.

  layout = row_layout(config, mesh)
  batch, stats = collect(config, run, programs, layout, state, selection, key_sample, key_filter)

`collect` rolls out the selected prompts' completion slots (`budget.slot_mask`), scores the
sampled completions on the host (each process its own rows; verifiers never raise), applies the
post-rollout filter (`curriculum.filter`) and assembles the `rl_types.Batch` the learn step takes,
with host statistics of the rollout for the log.
"""

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum.curriculum import filters
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import rewards as rewards_lib
from rl_curriculum.tasks.data import TaskPool
from rl_curriculum.train import budget, builders, programs as programs_lib, validation
from rl_curriculum.train.prepare import Prepared
from rl_curriculum.train.rl_types import Batch
from rl_curriculum.train.state import RunState
from rl_curriculum.types import Feedback, Selection

__all__ = ["RowLayout", "row_layout", "score_completions", "train_groups", "collect",
           "batch_stats", "rollout_stats"]


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


def score_completions(task, pool: TaskPool, prompt_rows, tokens, decode, sampled=None):
  """Host side: decode and score completions tokens i32[b, T] of the pool prompts prompt_rows
  i32[b] (this process's rows of the batch); returns rewards f32[b], correct bool[b]. Rows where
  `sampled` (bool[b], None for all) is False hold no completion: reward 0, not correct, and the
  verifier never sees them.

  Raises:
    ValueError: a reward is not finite (a verifier bug; one NaN would reach every statistic that
      averages rewards), naming the task, the prompt and the completion.
  """
  keep = np.ones(len(prompt_rows), bool) if sampled is None else np.asarray(sampled, bool)
  texts = [decode(row) for row in np.asarray(tokens)[keep]]
  problems = [pool.problems[i] for i in np.asarray(prompt_rows)[keep]]
  rewards, correct = np.zeros(len(keep), np.float32), np.zeros(len(keep), bool)
  if not texts:
    return rewards, correct
  scored, right, _ = task.score_batch(problems, texts)
  scored = np.asarray(scored, np.float32)
  bad = np.flatnonzero(~np.isfinite(scored))
  if bad.size:
    i = int(bad[0])
    raise ValueError(f"task {problems[i].task!r} scored {scored[i]} (not finite) for prompt "
                     f"{problems[i].prompt!r} and completion {texts[i]!r} ({bad.size} of "
                     f"{scored.size} rewards of this batch are not finite); rewards must be "
                     "finite numbers")
  rewards[keep], correct[keep] = scored, np.asarray(right, bool)
  return rewards, correct


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


def _sample(run: Prepared, programs: programs_lib.Programs, layout: RowLayout, state: RunState,
            rows: np.ndarray, valid: np.ndarray, key: jax.Array, temperature: Any):
  """(rollout, prompt mask, decode slot-steps) of this process's rows `rows` (pool indices, i32[b]) of the step's
  R rows; rows whose slot `valid` bool[R] marks unsampled get no tokens."""
  to_global = lambda x: distributed.rows_to_global(x, layout.sharding, layout.num_rows)
  prompt_mask = to_global(run.pool.mask[rows])
  sampled = valid.reshape(-1)[layout.mine]
  active = None if valid.all() else distributed.rows_to_global(
      sampled, mesh_lib.batch_sharding(layout.mesh, 1), layout.num_rows)
  generation = programs_lib.sample(programs, programs_lib.policy(state),
                                   to_global(run.pool.tokens[rows]), prompt_mask, key,
                                   temperature, active)
  rollout = generation.rollout
  rollout = distributed.place(rollout, jax.tree.map(lambda _: layout.sharding, rollout))
  jax.block_until_ready(rollout.tokens)
  return rollout, prompt_mask, int(distributed.to_host(generation.slot_steps))


def collect(config: ml_collections.ConfigDict, run: Prepared, programs: programs_lib.Programs,
            layout: RowLayout, state: RunState, selection: Selection, key_sample: jax.Array,
            key_filter: jax.Array) -> tuple[Batch, dict]:
  """Rolls out the selected prompts' completion slots (`budget.slot_mask`: G each, or the
  allocation's counts, none for a prompt skipped before rollout) with the policy of `state`,
  scores the sampled ones on the host (each process its own rows) and picks the groups to train
  on; returns (the `rl_types.Batch` for the learn step, host statistics of the rollout for the
  log). The slots and the counterfactual baseline read `state.prompts`, the run's per-prompt
  statistics before this rollout; the sampling temperature is `config.rl.temperature`, or under
  the adaptive controller the train state's f32[] (traced by the sampler: a new value compiles
  nothing)."""
  g, tok = budget.group_slots(config), run.tokenizer
  t0 = time.time()
  valid = budget.slot_mask(config, selection, state.prompts)  # bool[S, G]
  rows = np.repeat(np.asarray(selection.prompt_ids), g)[layout.mine]
  temperature = (state.train.temperature if config.rl.temperature_target
                 else config.rl.temperature)
  rollout, prompt_mask, slot_steps = _sample(run, programs, layout, state, rows, valid,
                                             key_sample, temperature)
  t1 = time.time()
  # The scores (B floats) are shared with every process.
  my_rewards, my_correct = score_completions(run.task, run.pool, rows,
                                             distributed.local_rows(rollout.tokens), tok.decode,
                                             valid.reshape(-1)[layout.mine])
  rewards = distributed.gather_rows(my_rewards, layout.mine, layout.num_rows).reshape(-1, g)
  correct = distributed.gather_rows(my_correct, layout.mine, layout.num_rows).reshape(-1, g)
  t2 = time.time()
  groups, group_valid = train_groups(config, correct, valid, config.rl.prompts_per_step,
                                     key_filter)
  baseline = None
  if config.rl.algorithm == "counterfactual":
    baseline = jnp.asarray(budget.success_mean(state.prompts, selection.prompt_ids))
  truncated = rewards_lib.truncated_completions(rollout.tokens, rollout.mask,
                                                (tok.eos_id, *run.stop_ids)).reshape(-1, g)
  batch = Batch(
      prompt_tokens=rollout.prompt_tokens, prompt_mask=prompt_mask,
      tokens=rollout.tokens, mask=rollout.mask, sampler_logprobs=rollout.logprobs,
      prompt_ids=selection.prompt_ids, arms=selection.arms, rewards=jnp.asarray(rewards),
      correct=jnp.asarray(correct), valid=jnp.asarray(valid),
      train_groups=jnp.asarray(groups), train_valid=jnp.asarray(group_valid), baseline=baseline,
      truncated=truncated)
  return batch, rollout_stats(config, run.pool.num_arms, selection, rollout.mask, rewards, valid,
                              group_valid, (t1 - t0, t2 - t1), slot_steps)


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


def rollout_stats(config: ml_collections.ConfigDict, num_arms: int, selection: Selection,
                  mask: jax.Array, rewards: np.ndarray, valid: np.ndarray,
                  group_valid: np.ndarray, seconds: tuple, slot_steps: int = 0) -> dict:
  """`batch_stats`, and the sampling and scoring time (`seconds` = (sample, score)), tokens per
  second, the decode slot-steps the engine computed and the share of them that kept a token."""
  sample_s, score_s = seconds
  tokens = float(jnp.sum(mask))
  return {**batch_stats(config, num_arms, selection, rewards, valid, group_valid),
          "time/sample_s": sample_s, "time/score_s": score_s,
          "tokens_per_s": tokens / max(sample_s, 1e-9), "rollout/slot_steps": float(slot_steps),
          "rollout/slot_utilisation": tokens / max(slot_steps, 1)}
