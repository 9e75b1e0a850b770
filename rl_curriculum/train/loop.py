"""`train_and_evaluate(config, workdir)`: the whole experiment, in labelled phases.

  1. config checks       (every field and option, before data, tokenizer, SFT or compiling)
  2. data                (task problems per bin: RL pool, SFT set, held-out sets whose prompts
                          neither trains on (`data.make_splits`); tokenizer)
  3. model               (tiny preset from scratch; SFT warm start cached in the workdir)
  4. RL state            (optimizer, curriculum, checkpoint restore)
  5. loop                select -> sample -> score (host) -> learn (one jit) -> log / eval / save
  6. report              (before/after table, report.png, report.html, summary.json)

Per-step randomness is `fold_in(root_key, step)`, and every piece of state that evolves (train
state, curriculum state with its data cursors) is in the checkpoint, so a run killed at any point
and started again with the same command finishes with the same parameters and metrics.
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
from flax import nnx

from rl_curriculum import tasks as tasks_lib
from rl_curriculum.curriculum import filters
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import pretrained
from rl_curriculum.model import transformer
from rl_curriculum.model.tokenizer import SentencePieceTokenizer, train_sentencepiece
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import sampler
from rl_curriculum.tasks.data import TaskPool, make_pool
from rl_curriculum.train import builders, checkpointing, data, evaluation, forward, report
from rl_curriculum.train import rl_step, sft
from rl_curriculum.train.metrics import MetricsWriter, read_jsonl
from rl_curriculum.types import Feedback

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


def _tokenizer(workdir: str, corpus, vocab_size: int) -> SentencePieceTokenizer:
  path = os.path.join(workdir, "tokenizer.model")
  exists = os.path.exists(path)
  distributed.sync("tokenizer: looked")  # every process sees the same `exists`
  if exists:
    return SentencePieceTokenizer.load(path)
  if distributed.is_main():  # one process trains it, the others load that file
    train_sentencepiece(corpus, vocab_size=vocab_size).save(path)
  distributed.sync("tokenizer: saved")
  return SentencePieceTokenizer.load(path)


def _sft_fingerprint(config) -> dict:
  """The config fields that determine the SFT result; a cached warm start must match them."""
  return {"seed": config.seed, "task": config.task.to_dict(), "model": config.model.to_dict(),
          "tokenizer": config.tokenizer.to_dict(), "sft": config.sft.to_dict()}


def _check_workdir(config, workdir) -> None:
  """Records the settings behind the cached tokenizer and SFT warm start on first use; refuses a
  workdir whose caches were made with other settings (they would be silently wrong).

  Raises:
    ValueError: the workdir was made with different seed/task/model/tokenizer/SFT settings.
  """
  path = os.path.join(workdir, "warm_start.json")
  fingerprint = json.loads(json.dumps(_sft_fingerprint(config)))  # tuples as lists, like JSON
  exists = os.path.exists(path)
  distributed.sync("warm_start.json: looked")  # process 0 writes it only after every look
  if exists:
    with open(path) as f:
      if json.load(f) != fingerprint:
        raise ValueError(f"{workdir} holds a tokenizer and SFT warm start made with other "
                         f"seed/task/model/tokenizer/sft settings (see {path}); use a fresh "
                         "--workdir, or delete that file, tokenizer.model and sft/ to rebuild")
  elif distributed.is_main():
    with open(path, "w") as f:
      json.dump(fingerprint, f, indent=1)


def _sft_params(config, workdir, graphdef, params, sft_pool, targets, target_mask, log):
  """SFT warm start, cached in workdir/sft (restored when present; see `_check_workdir`)."""
  folder = os.path.join(workdir, "sft")
  params = distributed.place(params, mesh_lib.param_shardings(params, _mesh(config)))
  manager = checkpointing.make_manager(folder, max_to_keep=1, enable_async=False)
  restored = checkpointing.restore_latest(manager, params)
  if restored is not None:
    manager.close()
    log(f"SFT warm start restored from {folder}")
    return restored[1], None
  optimizer = builders.build_optimizer(config.sft.learning_rate, max_grad_norm=1.0,
                                       warmup_steps=config.sft.warmup_steps,
                                       total_steps=config.sft.steps)
  params, curve = sft.run_sft(params, graphdef, sft_pool, targets, target_mask,
                              steps=config.sft.steps, batch_size=config.sft.batch_size,
                              optimizer=optimizer, seed=config.seed, log=log)
  checkpointing.save(manager, config.sft.steps, params, {"loss_curve": curve[-10:]}, wait=True)
  manager.close()
  return params, curve


def _scored_batch(task, pool: TaskPool, prompt_rows, tokens, decode):
  """Host side: decode and score completions tokens i32[b, T] of the pool prompts prompt_rows
  i32[b] (this process's rows of the batch); returns rewards f32[b], correct bool[b].

  Raises:
    ValueError: a reward is not finite (a verifier bug; one NaN would reach every statistic that
      averages rewards), naming the task, the prompt and the completion.
  """
  texts = [decode(row) for row in np.asarray(tokens)]
  problems = [pool.problems[i] for i in prompt_rows]
  rewards, correct, _ = task.score_batch(problems, texts)
  rewards = np.asarray(rewards, np.float32)
  bad = np.flatnonzero(~np.isfinite(rewards))
  if bad.size:
    i = int(bad[0])
    raise ValueError(f"task {problems[i].task!r} scored {rewards[i]} (not finite) for prompt "
                     f"{problems[i].prompt!r} and completion {texts[i]!r} ({bad.size} of "
                     f"{rewards.size} rewards of this batch are not finite); rewards must be "
                     "finite numbers")
  return rewards, np.asarray(correct, bool)


def _mesh(config):
  """The run's device mesh: config.parallel.mesh_shape over the devices of every process."""
  try:
    return mesh_lib.make_mesh(tuple(config.parallel.mesh_shape))
  except ValueError as e:
    raise builders.ConfigError(f"config.parallel.mesh_shape: {e}") from e


def _select_groups(config, correct, p: int, key):
  """Post-rollout filter on raw correctness: indices of the P groups to train on (a uniformly
  random subset of the survivors when more than P survive) and whether each slot holds a real
  group (short batches are padded with masked slots, never duplicates)."""
  if config.curriculum.filter == "none":
    return np.arange(p, dtype=np.int32), np.ones(p, bool)
  s, g = correct.shape
  fb = Feedback(prompt_ids=jnp.zeros(s, jnp.int32), arms=jnp.zeros(s, jnp.int32),
                rewards=jnp.zeros((s, g)), correct=jnp.asarray(correct),
                advantages=jnp.zeros((s, g)))
  kwargs = {}
  if config.curriculum.filter == "accuracy_band":
    kwargs = dict(lo=config.curriculum.band[0], hi=config.curriculum.band[1])
  result = filters.dynamic_filter(fb, mode=config.curriculum.filter, **kwargs)
  indices, slot_valid = filters.compact_indices(result.keep, p, key)
  return np.asarray(indices, np.int32), np.asarray(slot_valid, bool)


class Prepared(NamedTuple):
  """Everything `prepare` builds: data, tokenizer and the warm-started policy."""
  task: Any                   # rl_curriculum.tasks.Task
  tokenizer: Any              # encode/decode/pad_id/eos_id (SentencePiece or HF)
  pool: TaskPool              # the RL pool; arms = index into config.task.train_bins
  eval_sets: dict             # {bin name: TaskPool} held-out sets
  ood: list                   # names of the evaluation-only bins among them
  held_out_sizes: dict        # {bin name: problems in its held-out set} (small bins have fewer)
  graphdef: Any               # model graph (with LoRA adapters when lora_rank > 0)
  trainable: Any              # parameters the optimizer updates
  frozen: Any                 # parameters that stay fixed (the base under LoRA), or None
  ref_params: Any             # KL reference for full fine-tuning (None under LoRA)
  stop_ids: tuple             # token ids that end a completion besides EOS


def _prompt_text(config, task, tok) -> Callable:
  if config.task.template in ("chat", "chat_short"):
    return lambda problem: tok.apply_chat_template(task.prompt_messages(problem))
  return lambda problem: problem.prompt


def prepare(config: ml_collections.ConfigDict, workdir: str, log=print) -> Prepared:
  """Phases 1-3: config checks, data and tokenizer, model and SFT warm start (cached in workdir).

  Raises:
    builders.ConfigError: a config field the run cannot use (before anything compiles).
    ValueError: the workdir's caches were made with other settings.
  """
  # 1. Config checks: nothing below compiles until these pass.
  builders.validate(config)
  try:
    task = tasks_lib.get_task(config.task.name, template=config.task.template,
                              format_bonus=config.task.format_bonus)
  except (KeyError, ValueError, TypeError) as e:
    raise builders.ConfigError(f"config.task: {e}") from e
  builders.validate(config, num_task_bins=task.num_difficulties,
                    eval_only_bins=task.eval_only_bins)
  os.makedirs(workdir, exist_ok=True)
  _check_workdir(config, workdir)

  # 2. Data and tokenizer (trained on the task corpus, or the checkpoint's own).
  train_bins, eval_bins = tuple(config.task.train_bins), tuple(config.task.eval_bins)
  splits = data.make_splits(task, train_bins, eval_bins, train_per_bin=config.task.train_per_bin,
                            sft_per_bin=config.task.sft_per_bin if config.sft.steps else 0,
                            eval_per_bin=config.task.eval_per_bin,
                            held_out_fraction=config.task.held_out_fraction)
  rl_problems, sft_problems = splits.rl, splits.sft
  all_eval = [p for ps in splits.held_out.values() for p in ps]
  policy = None
  if config.model.source:
    policy = pretrained.load_pretrained(config.model.source, **builders.model_numerics(config))
    tok = policy.tokenizer
  else:
    corpus = [p.prompt + p.target for p in rl_problems + sft_problems]
    tok = _tokenizer(workdir, corpus + [p.prompt for p in all_eval], config.tokenizer.vocab_size)
  text = _prompt_text(config, task, tok)
  prompt_len = max(len(tok.encode(text(p))) for p in rl_problems + sft_problems + all_eval)
  pool = make_pool(rl_problems, tok.encode, tok.pad_id, max_prompt_len=prompt_len,
                   bins=train_bins, prompt_fn=text)
  eval_sets = {task.bin_names[b]: make_pool(ps, tok.encode, tok.pad_id, max_prompt_len=prompt_len,
                                            prompt_fn=text)
               for b, ps in splits.held_out.items()}
  ood = [task.bin_names[b] for b in eval_bins if b in task.eval_only_bins]
  held_out_sizes = {task.bin_names[b]: size.count for b, size in splits.sizes.items()}
  log(f"data: {len(rl_problems)} RL prompts in {len(train_bins)} bins, {len(sft_problems)} SFT, "
      f"{len(all_eval)} held out, none of them in training; vocab {tok.vocab_size}, prompt "
      f"length {prompt_len}\n  {splits.describe(task.bin_names)}")

  # 3. Model and SFT warm start.
  if policy is not None:
    graphdef, params = policy.graphdef, policy.params
  else:
    graphdef, params = transformer.init_model(builders.model_config(config, tok.vocab_size),
                                              seed=config.seed)
  log(f"model: {config.model.source or config.model.preset}, "
      f"{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M parameters")
  if config.sft.steps:
    sft_pool = make_pool(sft_problems, tok.encode, tok.pad_id, max_prompt_len=prompt_len,
                         bins=train_bins)
    target_len = max(len(tok.encode(p.target)) for p in sft_problems) + 1
    targets, target_mask = sft.target_tokens([p.target for p in sft_problems], tok.encode,
                                             tok.eos_id, tok.pad_id, target_len)
    params, _ = _sft_params(config, workdir, graphdef, params, sft_pool, targets, target_mask,
                            log)
  if config.model.lora_rank > 0:
    model = nnx.merge(graphdef, params)
    lora_lib.attach(model, lora_lib.LoRAConfig(rank=config.model.lora_rank,
                                               alpha=config.model.lora_alpha,
                                               targets=tuple(config.model.lora_targets)),
                    rngs=nnx.Rngs(config.seed + 1))
    graphdef, trainable, frozen = lora_lib.split(model)
    ref_params = None  # the reference is the same model with its adapters switched off
  else:
    trainable, frozen, ref_params = params, None, params  # reference: the warm-started model
  return Prepared(task=task, tokenizer=tok, pool=pool, eval_sets=eval_sets, ood=ood,
                  held_out_sizes=held_out_sizes,
                  graphdef=graphdef, trainable=trainable, frozen=frozen, ref_params=ref_params,
                  stop_ids=tuple(getattr(tok, "stop_ids", ())))


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


def init_states(config: ml_collections.ConfigDict, run: Prepared):
  """Phase 4's fresh state: (optimizer, curriculum, train_state, curriculum_state)."""
  optimizer = builders.build_optimizer(config.rl.learning_rate,
                                       max_grad_norm=config.rl.max_grad_norm)
  features = None
  if config.curriculum.name == "pcl":
    features = pool_features(config, run, run.trainable)
  curriculum = builders.build_curriculum(config, run.pool.prompt_pool(),
                                         builders.sampled_prompts(config), features)
  value = None
  if config.rl.algorithm == "ppo":  # a value head on the policy's final hidden states
    width = jax.eval_shape(
        lambda params: transformer.forward_hidden(run.graphdef, params,
                                                  jnp.zeros((1, 1), jnp.int32),
                                                  jnp.ones((1, 1), bool)),
        forward.model_params(run.trainable, run.frozen)).shape[-1]
    value = rl_step.init_value_head(width)
  train_state = rl_step.init_train_state(run.trainable, optimizer, value)
  # Steps count from 1, so key 0 of the root is free for the curriculum's initial shuffle.
  cur_state = curriculum.init(run.pool.prompt_pool(), jax.random.fold_in(rl_root_key(config), 0))
  return optimizer, curriculum, train_state, cur_state


def restore_params(config: ml_collections.ConfigDict, run: Prepared, workdir: str):
  """(step, model params) of the newest RL checkpoint in workdir, or (0, the warm start)."""
  _, _, train_state, cur_state = init_states(config, run)
  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
  restored = checkpointing.restore_latest(manager, {"train": train_state, "curriculum": cur_state})
  manager.close()
  step = 0
  if restored is not None:
    step, train_state = restored[0], restored[1]["train"]
  return step, forward.model_params(train_state.params, run.frozen)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) the experiment described by `config` in `workdir`; returns a summary.

  Multi-process runs (config.parallel, docs/scaling.md) run this on every process; only process
  0 writes logs and reports, and the others return {"process_index": i}.
  """
  builders.validate(config)  # before anything starts: the mesh check below reads the config
  distributed.initialize(config.parallel.coordinator_address or None,
                         config.parallel.num_processes, config.parallel.process_id)
  mesh = _mesh(config)
  num_rows = builders.sampled_prompts(config) * config.rl.group_size
  if num_rows % mesh_lib.batch_size_of(mesh):
    raise builders.ConfigError(
        f"config.parallel.mesh_shape: {num_rows} rollout rows (prompts_per_step x oversample x "
        f"group_size) do not split over data x fsdp = {mesh_lib.batch_size_of(mesh)} devices")
  is_main = jax.process_index() == 0

  def log(text):
    if is_main:
      print(text, flush=True)

  run = prepare(config, workdir, log)
  if is_main:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json(indent=1))
  task, tok, pool, eval_sets, ood = run.task, run.tokenizer, run.pool, run.eval_sets, run.ood
  graphdef, frozen, ref_params = run.graphdef, run.frozen, run.ref_params
  train_bins = tuple(config.task.train_bins)
  use_lora = config.model.lora_rank > 0

  def policy(train_state):
    return forward.model_params(train_state.params, frozen)

  decode = lambda row: tok.decode(row)  # pylint: disable=unnecessary-lambda-assignment
  eval_kwargs = dict(batch_size=config.eval.batch_size, max_new_tokens=config.rl.max_new_tokens,
                     eos_id=tok.eos_id, pad_id=tok.pad_id, stop_ids=run.stop_ids)

  # 4. RL state: optimizer, curriculum, checkpoint.
  p, g = config.rl.prompts_per_step, config.rl.group_size
  optimizer, curriculum, train_state, cur_state = init_states(config, run)
  # Parameters and optimizer state by their logical axes; curriculum state replicated; rollout
  # rows over (data, fsdp), this process holding `my_rows` of them.
  log(mesh_lib.describe(mesh))
  state_shardings = mesh_lib.tree_shardings(train_state, mesh)
  rep = mesh_lib.replicated(mesh)
  train_state = distributed.place(train_state, state_shardings)
  cur_state = distributed.place(cur_state, jax.tree.map(lambda _: rep, cur_state))
  frozen = distributed.place(frozen, mesh_lib.param_shardings(frozen, mesh))
  ref_params = distributed.place(ref_params, mesh_lib.param_shardings(ref_params, mesh))
  row_sharding = mesh_lib.batch_sharding(mesh, 2)
  my_rows = distributed.local_row_indices(row_sharding, num_rows)
  root = rl_root_key(config)
  select = jax.jit(curriculum.select, out_shardings=rep)
  learn = rl_step.make_learn(graphdef=graphdef, optimizer=optimizer,
                             curriculum_update=curriculum.update,
                             config=builders.learn_config(config), use_lora=use_lora,
                             out_shardings=(state_shardings, rep, rep), mesh=mesh)

  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"),
                                       max_to_keep=config.checkpoint.keep)
  start = 0
  restored = checkpointing.restore_latest(manager, {"train": train_state, "curriculum": cur_state})
  before = None
  if restored is not None:
    start, state, meta = restored
    train_state, cur_state = state["train"], state["curriculum"]
    before = meta.get("before")
    log(f"resumed from step {start}")
  if before is None:
    before = evaluation.accuracy_by_bin(graphdef, policy(train_state), eval_sets, task, decode,
                                        **eval_kwargs)
  writer = MetricsWriter(workdir, total_steps=config.rl.steps, resume_step=start,
                         enabled=is_main, console_keys=("reward_mean", "correct_mean",
                                                        "nonzero_adv_frac"))
  if start == 0:
    writer.write(0, {f"eval/acc/{k}": v for k, v in before.items()})

  def save(step, wait=False):
    checkpointing.save(manager, step, {"train": train_state, "curriculum": cur_state},
                       {"before": before, "step": step}, wait=wait)

  refresh_features = config.curriculum.name == "pcl" and config.curriculum.features_every > 0

  # 5. The loop.
  with _Preemption() as preemption:
    for step in range(start + 1, config.rl.steps + 1):
      t0 = time.time()
      key = jax.random.fold_in(root, step)
      k_select, k_sample, k_learn, k_filter = jax.random.split(key, 4)
      selection, cur_state = select(cur_state, k_select)  # replicated: the same everywhere
      ids = np.asarray(selection.prompt_ids)
      rows = np.repeat(ids, g)
      prompts = distributed.rows_to_global(pool.tokens[rows[my_rows]], row_sharding, num_rows)
      prompt_mask = distributed.rows_to_global(pool.mask[rows[my_rows]], row_sharding, num_rows)
      rollout = sampler.sample(graphdef, policy(train_state), prompts, prompt_mask, k_sample,
                               max_new_tokens=config.rl.max_new_tokens, eos_id=tok.eos_id,
                               stop_ids=run.stop_ids, pad_id=tok.pad_id,
                               temperature=config.rl.temperature, group=g, mesh=mesh)
      rollout = distributed.place(rollout, jax.tree.map(lambda _: row_sharding, rollout))
      jax.block_until_ready(rollout.tokens)
      t1 = time.time()
      # Each process scores its own rows; the scores (B floats) are shared with every process.
      my_rewards, my_correct = _scored_batch(task, pool, rows[my_rows],
                                             distributed.local_rows(rollout.tokens), decode)
      rewards = distributed.gather_rows(my_rewards, my_rows, num_rows).reshape(len(ids), g)
      correct = distributed.gather_rows(my_correct, my_rows, num_rows).reshape(len(ids), g)
      t2 = time.time()
      groups, group_valid = _select_groups(config, correct, p, k_filter)
      batch = rl_step.Batch(
          prompt_tokens=rollout.prompt_tokens, prompt_mask=prompt_mask,
          tokens=rollout.tokens, mask=rollout.mask, sampler_logprobs=rollout.logprobs,
          prompt_ids=selection.prompt_ids, arms=selection.arms, rewards=jnp.asarray(rewards),
          correct=jnp.asarray(correct), valid=jnp.ones(rewards.shape, bool),
          train_groups=jnp.asarray(groups), train_valid=jnp.asarray(group_valid))
      train_state, cur_state, metrics = learn(train_state, cur_state, batch, k_learn, frozen,
                                              ref_params)
      if refresh_features and step % config.curriculum.features_every == 0:
        # PCL's value model reads the current policy's view of each prompt, not the warm start's.
        features = pool_features(config, run, train_state.params)
        cur_state = cur_state._replace(features=distributed.place(jnp.asarray(features), rep))
      if config.parallel.check_replicated:
        distributed.assert_replicated(cur_state, f"curriculum state after step {step}")
      metrics = jax.device_get(metrics)
      t3 = time.time()
      arm_counts = np.bincount(np.asarray(selection.arms), minlength=len(train_bins))
      metrics.update({
          "time/sample_s": t1 - t0, "time/score_s": t2 - t1, "time/learn_s": t3 - t2,
          "tokens_per_s": float(jnp.sum(rollout.mask)) / max(t1 - t0, 1e-9),
          "sampled_reward_mean": float(rewards.mean()),
          "curriculum/arm_frac": arm_counts / arm_counts.sum(),
          "groups_kept": float(group_valid.sum()),
      })
      if step % config.eval.every == 0 or step == config.rl.steps:
        acc = evaluation.accuracy_by_bin(graphdef, policy(train_state), eval_sets, task, decode,
                                         **eval_kwargs)
        metrics.update({f"eval/acc/{k}": v for k, v in acc.items()})
      writer.write(step, metrics)
      if jax.process_count() > 1:  # a SIGTERM that reached one host stops them all
        preemption.requested = distributed.any_process(preemption.requested)
      if step % config.checkpoint.every == 0 or step == config.rl.steps or preemption.requested:
        save(step, wait=preemption.requested)
      if preemption.requested:
        writer.print(f"SIGTERM: saved step {step}; run the same command to resume")
        manager.wait_until_finished()
        writer.close()
        return {"preempted_at": step}
  manager.wait_until_finished()
  writer.close()
  distributed.sync("metrics written")
  if not is_main:
    return {"process_index": jax.process_index()}

  # 6. Report.
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  after = {k: v for k, v in rows[-1].items() if k.startswith("eval/acc/")}
  after = {k[len("eval/acc/"):]: v for k, v in after.items()}
  # A bin is too small when its problem space, not the request, limits its held-out set.
  small = [name for name, n in run.held_out_sizes.items()
           if n < min(config.eval.min_held_out, config.task.eval_per_bin)]
  table = report.accuracy_table(before, after, ood=ood, sizes=run.held_out_sizes, small=small)
  summary = {"before": before, "after": after, "ood_bins": ood, "steps": config.rl.steps,
             "held_out_sizes": run.held_out_sizes, "small_bins": small,
             "final_metrics": {k: v for k, v in rows[-1].items()
                               if isinstance(v, (int, float))}}
  if is_main:
    report.write_report(workdir, rows, bin_names=list(eval_sets),
                        arm_names=[task.bin_names[b] for b in train_bins],
                        title=f"{config.task.name}: {config.rl.algorithm} + "
                              f"{config.curriculum.name}", table=table)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=1)
    log("\nHeld-out greedy accuracy per bin (%):\n" + table)
    log(f"report: {os.path.join(workdir, 'report.png')}")
  return summary
