"""`train_and_evaluate(config, workdir)`: the whole experiment, in labelled phases.

  1. config checks   every field and option, before data, tokenizer, SFT or compiling
  2. data            task problems per bin: RL pool, SFT set, held-out sets whose prompts neither
                     trains on; tokenizer (`data`)
  3. model           tiny preset from scratch or a pretrained checkpoint; SFT warm start cached in
                     the workdir; LoRA adapters (`warm_start`)
  4. RL state        optimizer, curriculum, shardings, checkpoint restore
  5. loop            select -> `collect` (sample, score on the host, filter) -> learn (one jit)
                     -> log / evaluate / save
  6. report          before/after table, report.png, report.html, summary.json

Per-step randomness is `fold_in(root_key, step)`, and every piece of state that evolves (train
state, curriculum state with its data cursors, the base weights LoRA merging changes, the skip
streak and rollbacks of `recovery`) is in the checkpoint, so a run killed at any point and started
again with the same command finishes with the same parameters and metrics.
"""

import json
import os
import signal
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum import tasks as tasks_lib
from rl_curriculum.curriculum import filters
from rl_curriculum.model import pretrained
from rl_curriculum.model import transformer
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import sampler
from rl_curriculum.tasks.data import TaskPool
from rl_curriculum.train import budget, builders, checkpointing, data, evaluation, forward, report
from rl_curriculum.train import recovery, relora, rl_step, warm_start
from rl_curriculum.train.metrics import MetricsWriter, read_jsonl
from rl_curriculum.types import Feedback, Selection


class _Preemption:
  """Turns SIGTERM into a flag the loop checks between steps (save, then exit cleanly)."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. a notebook worker): no handler
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def run_mesh(config: ml_collections.ConfigDict):
  """The run's device mesh: config.parallel.mesh_shape over the devices of every process."""
  try:
    return mesh_lib.make_mesh(tuple(config.parallel.mesh_shape))
  except ValueError as e:
    raise builders.ConfigError(f"config.parallel.mesh_shape: {e}") from e


# ------------------------------------------------------------------------------------------------
# Phases 1-3: config checks, data, model.
# ------------------------------------------------------------------------------------------------

class Prepared(NamedTuple):
  """Everything `prepare` builds: data, tokenizer and the warm-started policy."""
  task: Any                   # rl_curriculum.tasks.Task
  tokenizer: Any              # encode/decode/pad_id/eos_id (SentencePiece or HF)
  pool: TaskPool              # the RL pool; arms as config.curriculum.arms lays them out
  arm_names: tuple            # name of each curriculum arm (a bin, or a task of a mixture)
  eval_sets: dict             # {bin name: TaskPool} held-out sets
  ood: list                   # names of the evaluation-only bins among them
  held_out_sizes: dict        # {bin name: problems in its held-out set} (small bins have fewer)
  graphdef: Any               # model graph (with LoRA adapters when lora_rank > 0)
  trainable: Any              # parameters the optimizer updates
  frozen: Any                 # parameters that stay fixed (the base under LoRA), or None
  ref_params: Any             # KL reference for full fine-tuning (None under LoRA)
  stop_ids: tuple             # token ids that end a completion besides EOS


def _checked_task(config: ml_collections.ConfigDict):
  """The configured task, after every config check that needs it (phase 1)."""
  builders.validate(config)
  try:
    task = builders.build_task(config)
  except (KeyError, ValueError, TypeError) as e:
    raise builders.ConfigError(f"config.task: {e}") from e
  builders.validate(config, task=task)
  return task


def prepare(config: ml_collections.ConfigDict, workdir: str, log=print) -> Prepared:
  """Phases 1-3: config checks, data and tokenizer, model and SFT warm start (cached in workdir).

  Raises:
    builders.ConfigError: a config field the run cannot use (before anything compiles).
    ValueError: the workdir's caches were made with other settings.
  """
  # 1. Config checks: nothing below compiles until these pass.
  task = _checked_task(config)
  os.makedirs(workdir, exist_ok=True)
  warm_start.check_workdir(config, workdir)

  # 2. Data and tokenizer (trained on the task's problems, or the checkpoint's own).
  train_bins = tuple(config.task.train_bins)
  arms = data.arms_of(task, train_bins, config.curriculum.arms)
  splits = data.make_splits(task, train_bins, tuple(config.task.eval_bins),
                            train_per_bin=data.pool_sizes(task, train_bins,
                                                          config.task.train_per_bin,
                                                          tuple(config.task.weights)),
                            sft_per_bin=config.task.sft_per_bin if config.sft.steps else 0,
                            eval_per_bin=config.task.eval_per_bin,
                            held_out_fraction=config.task.held_out_fraction)
  policy = None
  if config.model.source:
    policy = pretrained.load_pretrained(config.model.source, **builders.model_numerics(config))
    tok = policy.tokenizer
  else:
    tok = data.workdir_tokenizer(workdir, data.tokenizer_corpus(splits),
                                 config.tokenizer.vocab_size, config.tokenizer.model_type)
  pools = data.make_pools(splits, task, tok, train_bins, template=config.task.template,
                          bin_arms=arms.of_bin)
  log(f"data: {len(splits.rl)} RL prompts in {len(train_bins)} bins ({len(arms.names)} arms), "
      f"{len(splits.sft)} SFT, "
      f"{sum(map(len, splits.held_out.values()))} held out, none of them in training; vocab "
      f"{tok.vocab_size}, prompt length {pools.prompt_len}\n  {splits.describe(task.bin_names)}")

  # 3. Model, SFT warm start, adapters.
  if policy is not None:
    graphdef, params = policy.graphdef, policy.params
  else:
    graphdef, params = transformer.init_model(builders.model_config(config, tok.vocab_size),
                                              seed=config.seed)
  log(f"model: {config.model.source or config.model.preset}, "
      f"{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M parameters")
  if config.sft.steps:
    params = warm_start.sft_params(config, workdir, graphdef, params, pools, run_mesh(config),
                                   log)
  graphdef, trainable, frozen, ref_params = warm_start.attach_lora(config, graphdef, params)
  return Prepared(task=task, tokenizer=tok, pool=pools.rl, arm_names=arms.names,
                  eval_sets=pools.eval_sets,
                  ood=[task.bin_names[b] for b in config.task.eval_bins
                       if b in task.eval_only_bins],
                  held_out_sizes={task.bin_names[b]: size.count
                                  for b, size in splits.sizes.items()},
                  graphdef=graphdef, trainable=trainable, frozen=frozen, ref_params=ref_params,
                  stop_ids=tuple(getattr(tok, "stop_ids", ())))


# ------------------------------------------------------------------------------------------------
# Phase 4: RL state.
# ------------------------------------------------------------------------------------------------

def rl_root_key(config: ml_collections.ConfigDict) -> jax.Array:
  """Root of the RL phase's randomness (curriculum, rollouts, minibatches): the run's seed, with
  `config.rl.seed` folded in when nonzero. Runs that differ only in rl.seed share the data, the
  tokenizer and the SFT warm start, which is what seeds of a curricula comparison should vary."""
  key = jax.random.PRNGKey(config.seed)
  return jax.random.fold_in(key, config.rl.seed) if config.rl.seed else key


def pool_features(config: ml_collections.ConfigDict, run: Prepared, trainable) -> np.ndarray:
  """f32[N, D] the pool prompts' features for PCL: the policy's mean-pooled final hidden states,
  computed `config.curriculum.features_batch_size` prompts at a time."""
  return forward.prompt_features(run.graphdef, forward.model_params(trainable, run.frozen),
                                 run.pool.tokens, run.pool.mask,
                                 batch_size=config.curriculum.features_batch_size)


def _value_head(config: ml_collections.ConfigDict, run: Prepared):
  """PPO's value head on the policy's final hidden states (None for critic-free algorithms)."""
  if config.rl.algorithm != "ppo":
    return None
  width = jax.eval_shape(
      lambda params: transformer.forward_hidden(run.graphdef, params,
                                                jnp.zeros((1, 1), jnp.int32),
                                                jnp.ones((1, 1), bool)),
      forward.model_params(run.trainable, run.frozen)).shape[-1]
  return rl_step.init_value_head(width)


def init_states(config: ml_collections.ConfigDict, run: Prepared):
  """Phase 4's fresh state: (optimizer, curriculum, train_state, curriculum_state, prompt_stats);
  prompt_stats is the run's per-prompt statistics when a method reads them, else None
  (`budget.needs_prompt_stats`)."""
  optimizer = builders.build_optimizer(config.rl.learning_rate,
                                       max_grad_norm=config.rl.max_grad_norm)
  pool = run.pool.prompt_pool()
  if config.curriculum.name == "pcl":  # PCL's value model reads the policy's prompt features
    pool = pool.with_features(pool_features(config, run, run.trainable))
  curriculum = builders.build_curriculum(config, pool, builders.sampled_prompts(config))
  train_state = rl_step.init_train_state(run.trainable, optimizer, _value_head(config, run),
                                         temperature=config.rl.temperature)
  # Steps count from 1, so key 0 of the root is free for the curriculum's initial shuffle.
  cur_state = curriculum.init(pool, jax.random.fold_in(rl_root_key(config), 0))
  prompts = budget.init_prompt_stats(config, pool.size)
  return optimizer, curriculum, train_state, cur_state, prompts


def checkpoint_state(config: ml_collections.ConfigDict, train_state, cur_state, frozen,
                     prompts=None) -> dict:
  """The arrays a checkpoint holds: the train and curriculum states; the per-prompt statistics
  when the run keeps them (`budget`); and the base weights under LoRA merging
  (`model.lora_merge_every` > 0), which changes them (otherwise the base is the warm start's,
  which a resumed run rebuilds)."""
  state = {"train": train_state, "curriculum": cur_state}
  if prompts is not None:
    state["prompts"] = prompts
  if config.model.lora_merge_every > 0:
    state["base"] = frozen
  return state


def restore_params(config: ml_collections.ConfigDict, run: Prepared, workdir: str, step=None):
  """(step, model params) of RL checkpoint `step` (None: the newest) in workdir, or (0, the warm
  start) when there is none."""
  _, _, train_state, cur_state, prompts = init_states(config, run)
  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
  like = checkpoint_state(config, train_state, cur_state, run.frozen, prompts)
  restored = (checkpointing.restore_latest(manager, like) if step is None
              else checkpointing.restore(manager, step, like))
  manager.close()
  step, frozen = 0, run.frozen
  if restored is not None:
    step, train_state = restored[0], restored[1]["train"]
    frozen = restored[1].get("base", frozen)
  return step, forward.model_params(train_state.params, frozen)


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
    raise builders.ConfigError(
        f"config.parallel.mesh_shape: {num_rows} rollout rows (prompts_per_step x oversample x "
        f"group_size, or allocation_max with an allocation) do not split over data x fsdp = "
        f"{mesh_lib.batch_size_of(mesh)} devices")
  sharding = mesh_lib.batch_sharding(mesh, 2)
  return RowLayout(mesh=mesh, sharding=sharding, num_rows=num_rows,
                   mine=distributed.local_row_indices(sharding, num_rows))


class Stepper(NamedTuple):
  """The jitted halves of an RL step and the state layout they expect."""
  select: Callable            # (cur_state, key) -> (Selection, cur_state), replicated
  learn: Callable             # rl_step.make_learn's program
  state_shardings: Any        # of the train state
  replicated: Any             # sharding of the curriculum state and metrics


def build_stepper(config: ml_collections.ConfigDict, run: Prepared, mesh, optimizer,
                  curriculum, train_state) -> Stepper:
  """Parameters and optimizer state by their logical axes, curriculum state replicated, rollout
  rows over (data, fsdp); the select and learn programs for that layout."""
  state_shardings = mesh_lib.tree_shardings(train_state, mesh)
  rep = mesh_lib.replicated(mesh)
  learn = rl_step.make_learn(graphdef=run.graphdef, optimizer=optimizer,
                             curriculum_update=curriculum.update,
                             config=builders.learn_config(config),
                             use_lora=config.model.lora_rank > 0,
                             out_shardings=(state_shardings, rep, rep), mesh=mesh)
  return Stepper(select=jax.jit(curriculum.select, out_shardings=rep), learn=learn,
                 state_shardings=state_shardings, replicated=rep)


# ------------------------------------------------------------------------------------------------
# Phase 5: one step's data, from a selection to a scored batch.
# ------------------------------------------------------------------------------------------------

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


def collect(config: ml_collections.ConfigDict, run: Prepared, layout: RowLayout, params,
            selection: Selection, key_sample: jax.Array, key_filter: jax.Array, prompts=None,
            temperature=None):
  """Rolls out the selected prompts' completion slots (`budget.slot_mask`: G each, or the
  allocation's counts, none for a prompt skipped before rollout), scores the sampled ones on the
  host (each process its own rows) and picks the groups to train on; returns (the `rl_step.Batch`
  for the learn step, host statistics of the rollout for the log). `prompts`: the run's
  per-prompt statistics before this rollout (`budget`), or None when it keeps none.
  `temperature`: the sampling temperature, f32[] from the train state under the adaptive
  controller (traced by the sampler: a new value compiles nothing), or None for
  `config.rl.temperature`."""
  g, tok = budget.group_slots(config), run.tokenizer
  t0 = time.time()
  valid = budget.slot_mask(config, selection, prompts)  # bool[S, G]
  rows = np.repeat(np.asarray(selection.prompt_ids), g)[layout.mine]
  sampled = valid.reshape(-1)[layout.mine]
  to_global = lambda x: distributed.rows_to_global(x, layout.sharding, layout.num_rows)
  prompt_mask = to_global(run.pool.mask[rows])
  rollout = sampler.sample(run.graphdef, params, to_global(run.pool.tokens[rows]), prompt_mask,
                           key_sample, max_new_tokens=config.rl.max_new_tokens, eos_id=tok.eos_id,
                           stop_ids=run.stop_ids, pad_id=tok.pad_id,
                           temperature=(config.rl.temperature if temperature is None
                                        else temperature), group=g, mesh=layout.mesh,
                           active=None if valid.all() else distributed.rows_to_global(
                               sampled, mesh_lib.batch_sharding(layout.mesh, 1), layout.num_rows))
  rollout = distributed.place(rollout, jax.tree.map(lambda _: layout.sharding, rollout))
  jax.block_until_ready(rollout.tokens)
  t1 = time.time()
  # The scores (B floats) are shared with every process.
  my_rewards, my_correct = score_completions(run.task, run.pool, rows,
                                             distributed.local_rows(rollout.tokens), tok.decode,
                                             sampled)
  rewards = distributed.gather_rows(my_rewards, layout.mine, layout.num_rows).reshape(-1, g)
  correct = distributed.gather_rows(my_correct, layout.mine, layout.num_rows).reshape(-1, g)
  t2 = time.time()
  groups, group_valid = train_groups(config, correct, valid, config.rl.prompts_per_step,
                                     key_filter)
  baseline = None
  if config.rl.algorithm == "counterfactual":
    baseline = jnp.asarray(budget.success_mean(prompts, selection.prompt_ids))
  truncated = rl_step.truncated_completions(rollout.tokens, rollout.mask,
                                            (tok.eos_id, *run.stop_ids)).reshape(-1, g)
  batch = rl_step.Batch(
      prompt_tokens=rollout.prompt_tokens, prompt_mask=prompt_mask,
      tokens=rollout.tokens, mask=rollout.mask, sampler_logprobs=rollout.logprobs,
      prompt_ids=selection.prompt_ids, arms=selection.arms, rewards=jnp.asarray(rewards),
      correct=jnp.asarray(correct), valid=jnp.asarray(valid),
      train_groups=jnp.asarray(groups), train_valid=jnp.asarray(group_valid), baseline=baseline,
      truncated=truncated)
  arm_counts = np.bincount(np.asarray(selection.arms), minlength=run.pool.num_arms)
  budgeted = builders.sampled_prompts(config) * config.rl.group_size
  stats = {"time/sample_s": t1 - t0, "time/score_s": t2 - t1,
           "tokens_per_s": float(jnp.sum(rollout.mask)) / max(t1 - t0, 1e-9),
           "sampled_reward_mean": float(rewards[valid].mean()) if valid.any() else 0.0,
           "curriculum/arm_frac": arm_counts / arm_counts.sum(),
           "groups_kept": float(group_valid.sum()),
           "rollouts": float(valid.sum()), "rollouts_saved": float(budgeted - valid.sum())}
  if config.rl.allocation != "none":
    counts = valid.sum(axis=1)
    stats.update({"allocation/min": float(counts.min()), "allocation/max": float(counts.max())})
  return batch, stats


def evaluate(config: ml_collections.ConfigDict, run: Prepared, params) -> dict:
  """{bin name: greedy accuracy} over every held-out set."""
  tok = run.tokenizer
  return evaluation.accuracy_by_bin(run.graphdef, params, run.eval_sets, run.task, tok.decode,
                                    batch_size=config.eval.batch_size,
                                    max_new_tokens=config.rl.max_new_tokens, eos_id=tok.eos_id,
                                    pad_id=tok.pad_id, stop_ids=run.stop_ids)


def _eval_metrics(config: ml_collections.ConfigDict, run: Prepared, accuracy: dict,
                  before: dict) -> dict:
  """`eval/acc/<bin>` of every held-out set; on several tasks (`MixtureTask`) also
  `eval/<task>/accuracy` and the skill balance `eval/skill/min_gain` and `eval/skill/spread`
  (`evaluation.skill_balance`, gains against `before`, the accuracies before RL)."""
  metrics = {f"eval/acc/{k}": v for k, v in accuracy.items()}
  if isinstance(run.task, tasks_lib.MixtureTask):
    now, start = _task_accuracy(config, run, accuracy), _task_accuracy(config, run, before)
    metrics.update({f"eval/{t}/accuracy": v for t, v in now.items()})
    metrics.update({f"eval/skill/{k}": v
                    for k, v in evaluation.skill_balance(now, start).items()})
  return metrics


def _task_accuracy(config: ml_collections.ConfigDict, run: Prepared, accuracy: dict) -> dict:
  return evaluation.task_accuracy(accuracy, run.held_out_sizes,
                                  [run.task.bin_names[b] for b in config.task.train_bins])


def refresh_features(config: ml_collections.ConfigDict, run: Prepared, step: int, trainable,
                     cur_state, replicated):
  """PCL's value model reads the current policy's view of each prompt, not the warm start's: its
  features are recomputed every `curriculum.features_every` steps (0: never)."""
  every = config.curriculum.features_every
  if config.curriculum.name != "pcl" or every <= 0 or step % every:
    return cur_state
  features = pool_features(config, run, trainable)
  return cur_state._replace(features=distributed.place(jnp.asarray(features), replicated))


def roll_back_if_due(config: ml_collections.ConfigDict, manager, health: recovery.Health,
                     train_state, cur_state, frozen, prompts, log):
  """(train_state, cur_state, frozen, prompts, health): restored from the newest healthy
  checkpoint after `checkpoint.rollback_after` skipped updates in a row (`recovery.roll_back`),
  else as given."""
  if not recovery.due(health, config.checkpoint.rollback_after):
    return train_state, cur_state, frozen, prompts, health
  state, health = recovery.roll_back(
      manager, checkpoint_state(config, train_state, cur_state, frozen, prompts), health, log)
  return (state["train"], state["curriculum"], state.get("base", frozen), state.get("prompts"),
          health)


# ------------------------------------------------------------------------------------------------
# Phase 6: report.
# ------------------------------------------------------------------------------------------------

def _report(config: ml_collections.ConfigDict, run: Prepared, workdir: str, before: dict,
            log) -> dict:
  """Before/after table, report.png/html and summary.json of a finished run (process 0)."""
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  after = {k[len("eval/acc/"):]: v for k, v in rows[-1].items() if k.startswith("eval/acc/")}
  # A bin is too small when its problem space, not the request, limits its held-out set.
  small = [name for name, n in run.held_out_sizes.items()
           if n < min(config.eval.min_held_out, config.task.eval_per_bin)]
  table = report.accuracy_table(before, after, ood=run.ood, sizes=run.held_out_sizes,
                                small=small)
  summary = {"before": before, "after": after, "ood_bins": run.ood, "steps": config.rl.steps,
             "held_out_sizes": run.held_out_sizes, "small_bins": small,
             "final_metrics": {k: v for k, v in rows[-1].items()
                               if isinstance(v, (int, float))}}
  if isinstance(run.task, tasks_lib.MixtureTask):
    tasks_before, tasks_after = (_task_accuracy(config, run, before),
                                 _task_accuracy(config, run, after))
    summary["tasks"] = {t: {"before": tasks_before[t], "after": tasks_after[t]}
                        for t in tasks_after}
    summary["skill_balance"] = evaluation.skill_balance(tasks_after, tasks_before)
  report.write_report(workdir, rows, bin_names=list(run.eval_sets),
                      arm_names=list(run.arm_names),
                      title=f"{config.task.name}: {config.rl.algorithm} + "
                            f"{config.curriculum.name}", table=table,
                      tasks=getattr(run.task, "task_names", ()))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  log("\nHeld-out greedy accuracy per bin (%):\n" + table)
  log(f"report: {os.path.join(workdir, 'report.png')}")
  return summary


# ------------------------------------------------------------------------------------------------
# The experiment.
# ------------------------------------------------------------------------------------------------

def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) the experiment described by `config` in `workdir`; returns a summary.

  Multi-process runs (config.parallel, docs/scaling.md) run this on every process; only process
  0 writes logs and reports, and the others return {"process_index": i}.
  """
  # ---------------------------------------------------------------------------- 1-3. preparation
  builders.validate(config)  # before anything starts: the mesh check below reads the config
  distributed.initialize(config.parallel.coordinator_address or None,
                         config.parallel.num_processes, config.parallel.process_id)
  mesh = run_mesh(config)
  layout = row_layout(config, mesh)
  is_main = jax.process_index() == 0

  def log(text):
    if is_main:
      print(text, flush=True)

  run = prepare(config, workdir, log)
  if is_main:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json(indent=1))

  # ---------------------------------------------------------------------------- 4. RL state
  optimizer, curriculum, train_state, cur_state, prompts = init_states(config, run)
  log(mesh_lib.describe(mesh))
  stepper = build_stepper(config, run, mesh, optimizer, curriculum, train_state)
  rep = stepper.replicated
  train_state = distributed.place(train_state, stepper.state_shardings)
  cur_state = distributed.place(cur_state, jax.tree.map(lambda _: rep, cur_state))
  prompts = distributed.place(prompts, jax.tree.map(lambda _: rep, prompts))
  frozen_shardings = mesh_lib.param_shardings(run.frozen, mesh)
  frozen = distributed.place(run.frozen, frozen_shardings)
  ref_params = distributed.place(run.ref_params, mesh_lib.param_shardings(run.ref_params, mesh))

  def policy(state):
    return forward.model_params(state.params, frozen)

  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"),
                                       max_to_keep=config.checkpoint.keep)
  start, before, health = 0, None, recovery.Health(streak=0, origin=0, rollbacks=0)
  restored = checkpointing.restore_latest(
      manager, checkpoint_state(config, train_state, cur_state, frozen, prompts))
  if restored is not None:
    start, state, meta = restored
    train_state, cur_state, before = state["train"], state["curriculum"], meta.get("before")
    prompts = state.get("prompts")
    frozen = state.get("base", frozen)  # the merged base under LoRA merging
    health = recovery.from_meta(meta, start)
    log(f"resumed from step {start}")
  if before is None:
    before = evaluate(config, run, policy(train_state))
  writer = MetricsWriter(workdir, total_steps=config.rl.steps, resume_step=start,
                         enabled=is_main, console_keys=("reward_mean", "correct_mean",
                                                        "nonzero_adv_frac"))
  if start == 0:
    writer.write(0, _eval_metrics(config, run, before, before))
  root = rl_root_key(config)
  merge = (relora.make_merge(optimizer, stepper.state_shardings, frozen_shardings)
           if config.model.lora_merge_every > 0 else None)

  # ---------------------------------------------------------------------------- 5. loop
  with _Preemption() as preemption:
    for step in range(start + 1, config.rl.steps + 1):
      k_select, k_sample, k_learn, k_filter = jax.random.split(jax.random.fold_in(root, step), 4)
      selection, cur_state = stepper.select(cur_state, k_select)  # the same on every process
      batch, stats = collect(config, run, layout, policy(train_state), selection, k_sample,
                             k_filter, prompts, temperature=(train_state.temperature
                                                     if config.rl.temperature_target else None))
      prompts = distributed.place(budget.observe(prompts, batch, step),
                                  jax.tree.map(lambda _: rep, prompts))
      t = time.time()
      train_state, cur_state, metrics = stepper.learn(train_state, cur_state, batch, k_learn,
                                                      frozen, ref_params)
      cur_state = refresh_features(config, run._replace(frozen=frozen), step, train_state.params,
                                   cur_state, rep)
      if config.parallel.check_replicated:
        distributed.assert_replicated(cur_state, f"curriculum state after step {step}")
      metrics = {**jax.device_get(metrics), **stats, "time/learn_s": time.time() - t}
      health = recovery.after_update(health, step, bool(metrics["update_skipped"]))
      train_state, cur_state, frozen, prompts, health = roll_back_if_due(
          config, manager, health, train_state, cur_state, frozen, prompts, writer.print)
      train_state, frozen, merged = relora.maybe_merge(config, step, root, train_state, frozen,
                                                       merge)
      metrics.update(merged)
      if config.checkpoint.rollback_after > 0:
        metrics.update(recovery.metrics(health))
      if step % config.eval.every == 0 or step == config.rl.steps:
        metrics.update(_eval_metrics(config, run, evaluate(config, run, policy(train_state)),
                                     before))
      writer.write(step, metrics)
      if jax.process_count() > 1:  # a SIGTERM that reached one host stops them all
        preemption.requested = distributed.any_process(preemption.requested)
      periodic = (step % config.checkpoint.every == 0
                  and recovery.may_save(health, config.checkpoint.rollback_after))
      if periodic or step == config.rl.steps or preemption.requested:
        checkpointing.save(manager, step,
                           checkpoint_state(config, train_state, cur_state, frozen, prompts),
                           {"before": before, "step": step, **recovery.meta(health)},
                           wait=preemption.requested)
      if preemption.requested:
        writer.print(f"SIGTERM: saved step {step}; run the same command to resume")
        manager.wait_until_finished()
        writer.close()
        return {"preempted_at": step}
  manager.wait_until_finished()
  writer.close()
  distributed.sync("metrics written")

  # ---------------------------------------------------------------------------- 6. report
  if not is_main:
    return {"process_index": jax.process_index()}
  return _report(config, run, workdir, before, log)
