"""Phases 1-3 of a run: config checks, data and tokenizer, model and SFT warm start.

  run = prepare(config, workdir)     # a `Prepared`: task, tokenizer, pools, the policy

  1. config checks   every field and option (`validation.checked_task`), before data,
                     tokenizer, SFT or compiling
  2. data            task problems per bin: RL pool, SFT set, held-out sets whose prompts neither
                     trains on; tokenizer (`data`)
  3. model           tiny preset from scratch or a pretrained checkpoint; SFT warm start cached in
                     the workdir; LoRA adapters (`warm_start`)
"""

import os
from typing import Any, NamedTuple, Optional

import jax
import ml_collections

from rl_curriculum.model import pretrained
from rl_curriculum.model import transformer
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.parallel import rollout_layout as layout_lib
from rl_curriculum.tasks.data import TaskPool
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train.learn import forward
from rl_curriculum.train.rollout import checks as rollout_checks
from rl_curriculum.train.rollout import episodes
from rl_curriculum.train.setup import builders, data
from rl_curriculum.train.setup import validation, warm_start

__all__ = ["Prepared", "run_mesh", "prepare", "rl_root_key", "token_ids"]


class Prepared(NamedTuple):
  """Everything `prepare` builds: data, tokenizer and the warm-started policy."""
  task: Any                   # rl_curriculum.tasks.Task
  tokenizer: Any              # encode/decode/pad_id/eos_id (SentencePiece or HF)
  pool: TaskPool              # the RL pool; arms as config.curriculum.arms lays them out
  arm_names: tuple            # name of each curriculum arm (a bin, or a task of a mixture)
  eval_sets: dict             # {bin name: TaskPool} held-out sets
  ood: list                   # names of the evaluation-only bins among them
  held_out_sizes: dict        # {bin name: problems in its held-out set} (small bins have fewer)
  model: programs_lib.Model   # the policy: graph, trainable parameters (LoRA adapters under
                              # LoRA), frozen base (or None)
  stop_ids: tuple             # token ids that end a completion besides EOS
  framing: Any = None         # episodes.Framing of the observations between turns (None:
                              # episodes of one turn, which have none)


def run_mesh(config: ml_collections.ConfigDict):
  """The run's (learner's) device mesh: config.parallel.mesh_shape over the devices of every
  process, less those `parallel.rollout_devices` gives the rollout mesh (`rollout_mesh`)."""
  learner, _ = rollout_checks.split_devices(config, jax.devices(), jax.process_count())
  try:
    return mesh_lib.make_mesh(tuple(config.parallel.mesh_shape), learner)
  except ValueError as e:
    raise validation.ConfigError(f"config.parallel.mesh_shape: {e}") from e


def rollout_layout(config: ml_collections.ConfigDict, mesh, model=None,
                   device_bytes: Optional[int] = None) -> tuple[str, int]:
  """(layout, tensor size) of the engine's copy of the weights on the learner's `mesh`
  (`parallel.rollout_layout`; "auto" resolved by `rollout_layout.choose` from the copy's bytes,
  which need `model` (arrays or shapes), and `device_bytes`, default what the first device
  reports; "learner" with rollout devices apart)."""
  parallel = config.parallel
  if parallel.rollout_devices or parallel.rollout_layout == "learner":
    return "learner", 1
  if parallel.rollout_layout == "replicated":
    return "replicated", 1
  if parallel.rollout_layout == "tensor":
    return "tensor", int(parallel.rollout_tensor)
  if model is None:
    raise ValueError("parallel.rollout_layout='auto' needs the model to size the engine's copy")
  devices = list(mesh.devices.flat)
  copy = layout_lib.copy_bytes(forward.model_params(model.trainable, model.frozen),
                               config.model.dtype)
  memory = layout_lib.device_memory(devices) if device_bytes is None else device_bytes
  whole = mesh.shape["fsdp"] == 1 and mesh.shape["tensor"] == 1
  return layout_lib.choose(copy, memory, len(devices), learner_whole=whole)


def rollout_mesh(config: ml_collections.ConfigDict, mesh, model=None,
                 device_bytes: Optional[int] = None):
  """The mesh the rollouts decode on: with `parallel.rollout_devices` > 0 a data-parallel mesh
  over those devices; otherwise the learner's devices as `rollout_layout` arranges them (the
  learner's `mesh` itself under "learner").

  Raises:
    validation.ConfigError: a tensor axis that does not divide the learner's devices.
  """
  if config.parallel.rollout_devices == 0:
    layout, tensor = rollout_layout(config, mesh, model, device_bytes)
    try:
      return layout_lib.layout_mesh(mesh, layout, tensor)
    except ValueError as e:
      raise validation.ConfigError(f"config.parallel.rollout_tensor: {e}") from e
  _, devices = rollout_checks.split_devices(config, jax.devices(), jax.process_count())
  return mesh_lib.make_mesh((-1, 1, 1), devices)


def prepare(config: ml_collections.ConfigDict, workdir: str, log=print, task=None,
            mesh=None) -> Prepared:
  """Phases 1-3: config checks, data and tokenizer, model and SFT warm start (cached in workdir).

  `task` is the configured task when the caller has already checked the config with it
  (`validation.checked_task`); None checks the config here. The SFT warm start is trained and
  placed on `mesh` (None: `run_mesh(config)`; a process that holds a mesh of its own among
  several, e.g. `benchmarks.overlap`'s sampler, passes its own).

  Raises:
    validation.ConfigError: a config field the run cannot use (before anything compiles).
    ValueError: the workdir's caches were made with other settings.
  """
  # 1. Config checks: nothing below compiles until these pass.
  if task is None:
    task = validation.checked_task(config)
  os.makedirs(workdir, exist_ok=True)
  record = os.path.join(workdir, warm_start.RECORD)
  fresh = not os.path.exists(record)
  warm_start.check_workdir(config, workdir)

  # 2. Data and tokenizer (trained on the task's problems, or the checkpoint's own).
  train_bins = tuple(config.task.train_bins)
  arms = data.arms_of(task, train_bins, config.curriculum.arms)
  splits = _splits(config, task)
  policy = None
  if config.model.source:
    policy = pretrained.load_pretrained(config.model.source, **builders.model_numerics(config))
    tok = policy.tokenizer
  else:
    try:
      tok = data.workdir_tokenizer(workdir, data.tokenizer_corpus(splits),
                                   config.tokenizer.vocab_size, config.tokenizer.model_type)
    except ValueError as e:  # a vocabulary the trainer rejects for this task's text
      if fresh and os.path.exists(record):  # the next run, with another size, starts clean
        os.remove(record)
      raise validation.ConfigError(f"config.tokenizer.vocab_size: {e}") from e
  framing = _framing(config, task, tok)
  pools = data.make_pools(splits, task, tok, train_bins, template=config.task.template,
                          bin_arms=arms.of_bin, framing=framing,
                          observation_tokens=config.rl.observation_tokens)
  log(f"data: {len(splits.rl)} RL prompts in {len(train_bins)} bins ({len(arms.names)} arms), "
      f"{len(splits.sft)} SFT, "
      f"{sum(map(len, splits.held_out.values()))} held out, none of them in training; vocab "
      f"{tok.vocab_size}, prompt length {pools.prompt_len}\n  {splits.describe(task.bin_names)}")
  rollout_checks.check_prefill_chunk(config, pools.prompt_len)

  # 3. Model, SFT warm start, adapters.
  init = None
  if policy is not None:
    graphdef, params = policy.graphdef, policy.params
  elif config.sft.steps and warm_start.has_sft(workdir):
    # The values come from the saved warm start: the shapes are all a restore needs, and a
    # random initialisation would first compile each initialiser (seconds in a fresh process).
    model_config = builders.model_config(config, tok.vocab_size)
    graphdef, params = transformer.abstract_model(model_config)

    def init():  # the values SFT starts from, should the saved warm start be damaged
      return transformer.init_model(model_config, seed=config.seed)[1]
  else:
    graphdef, params = transformer.init_model(builders.model_config(config, tok.vocab_size),
                                              seed=config.seed)
  log(f"model: {config.model.source or config.model.preset}, "
      f"{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M parameters")
  if config.sft.steps:
    params = warm_start.sft_params(config, workdir, graphdef, params, pools,
                                   run_mesh(config) if mesh is None else mesh, log, init=init)
  graphdef, trainable, frozen = warm_start.attach_lora(config, graphdef, params)
  return Prepared(task=task, tokenizer=tok, pool=pools.rl, arm_names=arms.names,
                  eval_sets=pools.eval_sets,
                  ood=[task.bin_names[b] for b in config.task.eval_bins
                       if b in task.eval_only_bins],
                  held_out_sizes={task.bin_names[b]: size.count
                                  for b, size in splits.sizes.items()},
                  model=programs_lib.Model(graphdef=graphdef, trainable=trainable, frozen=frozen),
                  stop_ids=tuple(getattr(tok, "stop_ids", ())), framing=framing)


def _framing(config: ml_collections.ConfigDict, task, tok) -> Optional[episodes.Framing]:
  """The observations' framing of a run whose episodes take more than one turn (None: one turn,
  no observation), its cap checked against it.

  Raises:
    validation.ConfigError: a chat template that cannot frame an observation, or an
      rl.observation_tokens too small for the framing.
  """
  if rollout_checks.turn_width(config, task) == 1:
    return None
  try:
    framing = episodes.make_framing(tok, config.task.template, getattr(tok, "stop_ids", ()))
  except ValueError as e:
    raise validation.ConfigError(f"config.task.template: {e}") from e
  episodes.check_observation_cap(config.rl.observation_tokens, framing)
  return framing


def _splits(config: ml_collections.ConfigDict, task) -> data.Splits:
  """The task's problems per split: the RL pool (mixture weights applied), the SFT set when SFT
  runs, the held-out sets (`data.make_splits`)."""
  train_bins = tuple(config.task.train_bins)
  return data.make_splits(task, train_bins, tuple(config.task.eval_bins),
                          train_per_bin=data.pool_sizes(task, train_bins,
                                                        config.task.train_per_bin,
                                                        tuple(config.task.weights)),
                          sft_per_bin=config.task.sft_per_bin if config.sft.steps else 0,
                          eval_per_bin=config.task.eval_per_bin,
                          held_out_fraction=config.task.held_out_fraction,
                          held_out_split=config.task.held_out_split)


def rl_root_key(config: ml_collections.ConfigDict) -> jax.Array:
  """Root of the RL phase's randomness (curriculum, rollouts, minibatches): the run's seed, with
  `config.rl.seed` folded in when nonzero. Runs that differ only in rl.seed share the data, the
  tokenizer and the SFT warm start, which is what seeds of a curricula comparison should vary."""
  key = jax.random.PRNGKey(config.seed)
  return jax.random.fold_in(key, config.rl.seed) if config.rl.seed else key


def step_keys(root: jax.Array, step: int) -> jax.Array:
  """The keys of RL step `step` (select, sample, learn, filter): split from fold_in(root, step).
  With rollouts in flight (`pipeline`), batch j is selected, sampled and filtered with step j's
  keys whenever it is queued."""
  return jax.random.split(jax.random.fold_in(root, step), 4)


def token_ids(run: Prepared) -> programs_lib.TokenIds:
  """The tokenizer's ids the sampler stops and pads with."""
  return programs_lib.TokenIds(eos_id=run.tokenizer.eos_id, pad_id=run.tokenizer.pad_id,
                               stop_ids=run.stop_ids)
