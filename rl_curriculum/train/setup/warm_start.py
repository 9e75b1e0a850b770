"""The policy an RL run starts from: the SFT warm start (cached in the workdir) and LoRA adapters.

  check_workdir(config, workdir)               # refuse caches made with other settings
  params = sft_params(config, workdir, graphdef, params, pools, mesh, log)
  graphdef, trainable, frozen = attach_lora(config, graphdef, params)

A workdir caches the run's tokenizer and SFT warm start, so a resumed run, a second seed of a
comparison or an evaluation skips them. `warm_start.json` records the settings behind the caches
(`fingerprint`); a workdir made with other settings is refused rather than silently reused.
"""

import json
import os
import shutil
from typing import Any, Callable, Optional

import jax
import ml_collections
from flax import nnx

from rl_curriculum.model import lora as lora_lib
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.train.durable import checkpointing
from rl_curriculum.train.rollout import checks as rollout_checks
from rl_curriculum.train.setup import builders, sft
from rl_curriculum.train.setup.data import TOKENIZER_FILE, Pools

__all__ = ["RECORD", "SFT_DIR", "SFT_PROGRESS_DIR", "CACHES", "fingerprint", "check_workdir",
           "has_sft", "sft_params", "attach_lora"]

RECORD = "warm_start.json"  # the settings behind a workdir's caches (`fingerprint`)
SFT_DIR = "sft"             # the SFT warm start's checkpoint
SFT_PROGRESS_DIR = "sft_progress"  # SFT's progress while it trains (`sft_params`)
# Everything a workdir caches for the runs that start from it: a run with the same fingerprint
# may start from copies of these (seeds of a comparison share one warm start).
CACHES = (RECORD, TOKENIZER_FILE, SFT_DIR)

# Fields of the fingerprinted sections that leave the SFT result as it is: those that act in RL
# only (SFT never reads them) and how often SFT saves its progress.
_NO_SFT_EFFECT = {"model": ("lora_merge_every",), "task": ("format_bonus",),
                  "sft": ("save_every",)}


def link_caches(base: str, folder: str) -> str:
  """`folder` (made if missing) sharing the tokenizer and SFT warm start in workdir `base` by
  symbolic links, for runs that differ only in what the fingerprint leaves out (their RL
  fields: the seeds and methods of a comparison, the ways of a benchmark); returns `folder`."""
  os.makedirs(folder, exist_ok=True)
  for name in CACHES:
    src, dst = os.path.abspath(os.path.join(base, name)), os.path.join(folder, name)
    if os.path.exists(src) and not os.path.lexists(dst):
      os.symlink(src, dst)
  return folder


def fingerprint(config: ml_collections.ConfigDict) -> dict:
  """The config fields that determine the SFT result; a cached warm start must match them.
  (`rl.seed` is not among them: seeds of an RL comparison share one warm start; nor are
  `model.lora_merge_every` and `task.format_bonus`, which act in RL only: SFT imitates reference
  answers and never scores one; nor `sft.save_every`, which changes when SFT saves, not what it
  learns. Of the RL fields only `rl.observation_tokens` is, for episodes of several turns: it
  caps the replies inside the solved episodes SFT imitates.)"""
  record = {"seed": config.seed, "task": config.task.to_dict(), "model": config.model.to_dict(),
            "tokenizer": config.tokenizer.to_dict(), "sft": config.sft.to_dict()}
  if rollout_checks.turn_width(config, builders.build_task(config)) > 1:
    record["episodes"] = {"observation_tokens": config.rl.observation_tokens}
  return _sft_fields(record)


def _sft_fields(record: dict) -> dict:
  """`record` (a fingerprint, or one read back from warm_start.json) without the _NO_SFT_EFFECT
  fields."""
  return {section: ({k: v for k, v in fields.items() if k not in _NO_SFT_EFFECT[section]}
                    if section in _NO_SFT_EFFECT else fields)
          for section, fields in record.items()}


def check_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Records the settings behind the cached tokenizer and SFT warm start on first use; refuses a
  workdir whose caches were made with other settings (they would be silently wrong).

  Raises:
    ValueError: the workdir was made with different seed/task/model/tokenizer/SFT settings.
  """
  path = os.path.join(workdir, RECORD)
  expected = json.loads(json.dumps(fingerprint(config)))  # tuples as lists, like JSON
  exists = os.path.exists(path)
  distributed.sync("warm_start.json: looked")  # process 0 writes it only after every look
  if exists:
    with open(path) as f:  # older records may still hold an RL-only field: not compared
      recorded = _sft_fields(json.load(f))
    if recorded != expected:
      raise ValueError(f"{workdir} holds a tokenizer and SFT warm start made with other "
                       f"seed/task/model/tokenizer/sft settings (see {path}); use a fresh "
                       "--workdir, or delete that file, tokenizer.model and sft/ to rebuild")
  elif distributed.is_main():
    with open(path, "w") as f:
      json.dump(expected, f, indent=1)


def has_sft(workdir: str) -> bool:
  """Whether workdir/sft holds a saved warm start (intact or not: `sft_params` checks)."""
  folder = os.path.join(workdir, SFT_DIR)
  return os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder))


def sft_params(config: ml_collections.ConfigDict, workdir: str, graphdef, params: Any,
               pools: Pools, mesh, log: Callable[[str], None],
               init: Optional[Callable[[], Any]] = None) -> Any:
  """The SFT warm start of `params` on `pools.sft` (config.sft), restored from workdir/sft when
  it holds an intact one, trained and saved there otherwise (a damaged one is moved aside and
  trained again: SFT is deterministic). `params` may be shapes only (`transformer.abstract_model`)
  when `init()` makes the values SFT starts from: a restore reads only their shapes.

  Training saves its progress every `config.sft.save_every` steps in workdir/sft_progress and
  resumes from the newest intact save there, to the same result as an uninterrupted run; the
  folder is deleted once the warm start is saved.
  """
  folder = os.path.join(workdir, SFT_DIR)
  shardings = mesh_lib.param_shardings(params, mesh)
  manager = checkpointing.make_manager(folder, max_to_keep=1)
  like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params,
                      shardings)
  restored = checkpointing.restore_latest(manager, like, log)
  if restored is not None:
    manager.close()
    log(f"SFT warm start restored from {folder}")
    return restored[1]
  params = distributed.place(params if init is None else init(), shardings)
  optimizer = builders.build_optimizer(config.sft.learning_rate, max_grad_norm=1.0,
                                       warmup_steps=config.sft.warmup_steps,
                                       total_steps=config.sft.steps)
  opt_state = optimizer.init(params)
  progress_folder = os.path.join(workdir, SFT_PROGRESS_DIR)
  progress = checkpointing.make_manager(progress_folder, max_to_keep=1, writer=True)
  resumed = checkpointing.restore_latest(progress, (params, opt_state), log)  # into their layout
  done, curve = 0, []
  if resumed is not None:
    done, (params, opt_state), meta = resumed
    curve = meta["loss_curve"]
    log(f"SFT resumed after step {done} of {config.sft.steps} from {progress_folder}")

  def save_progress(step, params, opt_state, curve):
    checkpointing.save(progress, step, (params, opt_state), {"loss_curve": curve})

  targets, target_mask = pools.sft_targets
  params, curve = sft.run_sft(params, graphdef, pools.sft, targets, target_mask,
                              steps=config.sft.steps, batch_size=config.sft.batch_size,
                              optimizer=optimizer, seed=config.seed, log=log, done=done,
                              opt_state=opt_state, curve=curve,
                              save_every=config.sft.save_every, save=save_progress)
  checkpointing.save(manager, config.sft.steps, params, {"loss_curve": curve[-10:]})
  manager.close()
  progress.close()
  if distributed.is_main():
    shutil.rmtree(progress_folder, ignore_errors=True)
  distributed.sync("sft progress removed")
  return params


def attach_lora(config: ml_collections.ConfigDict, graphdef, params: Any) -> tuple:
  """(graphdef, trainable, frozen) of the RL policy.

  With `config.model.lora_rank` > 0: adapters on `model.lora_targets` (seeded by config.seed + 1)
  are the trainable parameters and the base is frozen (the KL reference is the same model with
  its adapters switched off). Otherwise every parameter trains and nothing is frozen (the KL
  reference, when a run needs one, is a copy of these starting weights: `programs.reference`).
  """
  if config.model.lora_rank <= 0:
    return graphdef, params, None
  model = nnx.merge(graphdef, params)
  lora_lib.attach(model, lora_lib.LoRAConfig(rank=config.model.lora_rank,
                                             alpha=config.model.lora_alpha,
                                             targets=tuple(config.model.lora_targets)),
                  rngs=nnx.Rngs(config.seed + 1))
  return lora_lib.split(model)
