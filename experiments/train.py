"""Train and evaluate: `python -m experiments.train --config configs/quickstart.py --workdir DIR`.

Overrides follow the config's field names, e.g. `--config.rl.steps=50
--config.curriculum.name=uniform --config.curriculum.options={}` (a curriculum other than SEC takes
other options). Running the same command again resumes from the workdir.
`--plan_only` compiles the run's sampler and learn step for the devices this process sees,
without weights, prints their memory per device against `--hbm_gib` (default: the device's own
limit) and exits (rl_curriculum/train/plan.py; `python -m experiments.plan` does the same on fake
CPU devices).
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from rl_curriculum.train import validation
from rl_curriculum.train import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder: checkpoints, logs, report.")
_PLAN_ONLY = flags.DEFINE_bool("plan_only", False, "Print the memory plan and exit.")
_HBM = flags.DEFINE_float("hbm_gib", 0.0, "Budget per device for --plan_only (0: the device's).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 256, "Prompt tokens per row for --plan_only.")
flags.mark_flags_as_required(["config"])


def _plan_only() -> int:
  import jax  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train import plan  # pylint: disable=import-outside-toplevel
  hbm = _HBM.value
  if not hbm:
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" not in stats:
      raise app.UsageError("this device does not report its memory; pass --hbm_gib")
    hbm = stats["bytes_limit"] / plan.GIB
  report = plan.plan(_CONFIG.value, hbm_gib=hbm, prompt_len=_PROMPT_LEN.value)
  print(plan.describe(report))
  return 0 if report["fits"] else 1


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # library INFO lines (checkpoint I/O) drown the progress
  try:
    if _PLAN_ONLY.value:
      sys.exit(_plan_only())
    if not _WORKDIR.value:
      raise app.UsageError("--workdir is required (except with --plan_only)")
    loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except validation.ConfigError as e:  # a bad field: one line naming it, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
