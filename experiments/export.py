"""Export a training run's newest checkpoint for transformers: an HF folder or PEFT adapters.

  python -m experiments.export --workdir workdirs/quickstart --out /tmp/quickstart_hf
  python -m experiments.export --workdir workdirs/smollm2 --out /tmp/smollm2_adapter \
    --format peft

`--format hf` (default) writes an HF model folder (config.json, generation_config.json,
model.safetensors, tokenizer files) with LoRA adapters, if the run trained any, merged into the
weights: `transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads it. `--format peft`
writes the adapters alone (adapter_config.json, adapter_model.safetensors) for runs with
`model.lora_rank > 0` on a pretrained `model.source` (and no `model.lora_merge_every`, which
changes the base), which the adapter folder names as its base;
`load_pretrained(source, lora=OUT)` or peft's `PeftModel.from_pretrained` attach them.

The run is rebuilt from WORKDIR/config.json (written by `train_and_evaluate`) with the caches the
run left there (tokenizer.model, the SFT warm start in sft/), and the newest RL checkpoint in
WORKDIR/checkpoints is restored into it; nothing is trained. A workdir that cannot be exported (no
workdir, no config.json or checkpoint, missing caches, PEFT for a run without adapters, an OUT
that is not empty) ends with a one-line message and exit status 2.
"""

import json
import os
import sys
from typing import Callable, Tuple

from absl import app
from absl import flags
from absl import logging
import ml_collections
from flax import nnx

from experiments import cli
from rl_curriculum.model import hf_io
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import pretrained
from rl_curriculum.train.loop import restore_params
from rl_curriculum.train.setup import validation
from rl_curriculum.train.setup.prepare import prepare

FORMATS = ("hf", "peft")
FLAGS = flags.FLAGS


class ExportError(ValueError):
  """A workdir or output folder this command cannot export to; the message says what to do."""


def read_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config from WORKDIR/config.json (`config.to_json()`; tuples come back as lists,
  which every reader of the config accepts).

  Raises:
    ExportError: no such folder, or no readable config.json in it.
  """
  if not os.path.isdir(workdir):
    raise ExportError(f"no workdir at {workdir!r}; pass the --workdir a training run wrote.")
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise ExportError(f"{workdir} has no config.json: it is not a workdir written by "
                      "python -m experiments.train (train_and_evaluate writes config.json first).")
  try:
    with open(path) as f:
      config = ml_collections.ConfigDict(json.load(f))
  except (json.JSONDecodeError, TypeError, ValueError) as e:
    raise ExportError(f"{path} is not a run config ({e}).") from e
  config.lock()
  return config


def checkpoint_steps(workdir: str) -> list:
  """Steps of the complete RL checkpoints in WORKDIR/checkpoints (Orbax names each step's folder
  by its number; unfinished saves carry a suffix), ascending."""
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(int(name) for name in os.listdir(folder)
                if name.isdigit() and os.path.isdir(os.path.join(folder, name)))


def check_exportable(config: ml_collections.ConfigDict, workdir: str, out: str,
                     fmt: str) -> None:
  """Refuses, before anything is built, what the export could not do or would do wrongly.

  Raises:
    ExportError: an unknown format; PEFT for a run without adapters, with adapters merged into
      the base, or without a pretrained base; no RL checkpoint; a run cache missing (rebuilding
      it would train a different tokenizer or warm start); an output folder that is not empty.
  """
  if fmt not in FORMATS:
    raise ExportError(f"unknown format {fmt!r}; choose from {FORMATS}.")
  if fmt == "peft" and config.model.lora_rank <= 0:
    raise ExportError("--format peft needs a LoRA run; this one trained every weight "
                      "(model.lora_rank = 0), so it has no adapters: use --format hf.")
  if fmt == "peft" and config.model.lora_merge_every > 0:
    raise ExportError("--format peft writes adapters for the base model.source, but this run "
                      "merged its adapters into the base every model.lora_merge_every = "
                      f"{config.model.lora_merge_every} steps, so its base is no longer "
                      "model.source: use --format hf (base and adapters merged).")
  if fmt == "peft" and not config.model.source:
    raise ExportError("--format peft needs a pretrained base (model.source); this run's base is "
                      f"the {config.model.preset!r} model trained in its workdir, which no "
                      "adapter file can name: use --format hf (adapters merged).")
  if not checkpoint_steps(workdir):
    raise ExportError(f"{workdir} has no RL checkpoint in checkpoints/: the run has not saved "
                      "one yet (checkpoint.every); train it first.")
  if not config.model.source:
    if not os.path.isfile(os.path.join(workdir, "tokenizer.model")):
      raise ExportError(f"{workdir} lacks the run's tokenizer.model; without it the token ids of "
                        "the checkpoint cannot be decoded.")
    if config.sft.steps and not os.path.isdir(os.path.join(workdir, "sft")):
      raise ExportError(f"{workdir} lacks the run's SFT warm start (sft/); the export would "
                        "train it again, and a LoRA run's base would differ from the trained "
                        "one.")
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ExportError(f"{out} exists and is not an empty folder; choose a new --out or delete "
                      "it.")


def _base_name(source: str) -> str:
  """The adapters' base as PEFT names it: a checkpoint name as it is, a path made absolute."""
  if source in pretrained.NAMED_CHECKPOINTS:
    return source
  return os.path.abspath(os.path.expanduser(source))


def run_policy(config: ml_collections.ConfigDict, workdir: str,
               log: Callable[[str], None] = print) -> Tuple[int, pretrained.Policy]:
  """(step, Policy) of the newest RL checkpoint of a run: its model config, graph, parameters
  ((adapters, base) under LoRA), tokenizer, HF family and LoRA settings.

  Raises:
    ExportError: no RL checkpoint could be restored.
  """
  run = prepare(config, workdir, log)
  step, params = restore_params(config, run, workdir)
  if step == 0:
    raise ExportError(f"no RL checkpoint of {workdir} could be restored.")
  states = params if isinstance(params, tuple) else (params,)
  model_config = nnx.merge(run.model.graphdef, *states).config
  source = config.model.source or None
  lora_config = None
  if config.model.lora_rank > 0:
    lora_config = lora_lib.LoRAConfig(rank=config.model.lora_rank, alpha=config.model.lora_alpha,
                                      targets=tuple(config.model.lora_targets))
  policy = pretrained.Policy(
      config=model_config, graphdef=run.model.graphdef, params=params, tokenizer=run.tokenizer,
      family=hf_io.family_of(model_config), lora_config=lora_config,
      source=_base_name(source) if source else None,
      context_length=pretrained.checkpoint_context_length(source) if source else 8192)
  return step, policy


def export(workdir: str, out: str, fmt: str = "hf",
           log: Callable[[str], None] = print) -> dict:
  """Writes the newest RL checkpoint of `workdir` to `out` as `fmt` ("hf" | "peft").

  Returns:
    {"step": the checkpoint's step, "format": fmt, "out": out, "files": sorted file names}.

  Raises:
    ExportError: input that cannot be exported (see `read_run_config`, `check_exportable`).
    validation.ConfigError: the run's config no longer passes its checks (e.g. model.source moved).
  """
  config = read_run_config(workdir)
  check_exportable(config, workdir, out, fmt)
  step, policy = run_policy(config, workdir, log)
  pretrained.save_pretrained(policy, out, merge_lora=fmt == "hf")
  what = "PEFT adapters" if fmt == "peft" else (
      "HF model (LoRA merged)" if policy.lora_config else "HF model")
  log(f"exported step {step} of {workdir} to {out}: {what}")
  if fmt == "peft" and not os.path.isdir(policy.source):
    log(f"note: the adapters' base {policy.source} is not an HF folder; "
        "pretrained.load_pretrained(base, lora=out) attaches them.")
  return {"step": step, "format": fmt, "out": out, "files": sorted(os.listdir(out))}


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_string("workdir", None, "Run folder written by python -m experiments.train.")
  flags.DEFINE_string("out", None, "Folder to write (created; must be empty if it exists).")
  flags.DEFINE_enum("format", "hf", FORMATS,
                    "hf: model folder, adapters merged; peft: LoRA adapters only.")
  flags.mark_flags_as_required(["workdir", "out"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # library INFO lines (checkpoint I/O)
  try:
    export(FLAGS.workdir, FLAGS.out, FLAGS.format)
  except (ExportError, validation.ConfigError) as e:  # bad input: one line, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
