"""Train and evaluate: `python -m experiments.train --config configs/quickstart.py --workdir DIR`.

Overrides follow the config's field names, e.g. `--config.rl.steps=50
--config.curriculum.name=uniform --config.curriculum.options={}` (a curriculum other than SEC takes
other options). Running the same command again resumes from the workdir, from its newest intact
checkpoint, with the config it was started with (fields such as rl.steps may change:
rl_curriculum/train/durable/workdir.py); `--allow_config_change` goes on with other values, logged.
Exit status: 0 done, 1 the run stopped (a checkpoint it could not write, a collapsed policy), 2
a bad command line or config, or a workdir another process is writing; each is one line.
`--plan_only` compiles every program of a step for the devices this process sees, without
weights, prints their memory per device against `--hbm_gib` (default: the device's own limit) and
exits (rl_curriculum/plan/; `python -m experiments.plan --target v5e-8` does the same for a TPU
slice from any host, or for fake CPU devices).
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments import cli
from rl_curriculum.train import loop
from rl_curriculum.train.durable import checkpointing, recovery, workdir
from rl_curriculum.train.setup import validation

FLAGS = flags.FLAGS


def _plan_only() -> int:
  import jax  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import planner as plan  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import report as plan_report  # pylint: disable=import-outside-toplevel
  hbm = FLAGS.hbm_gib
  if not hbm:
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" not in stats:
      raise app.UsageError("this device does not report its memory; pass --hbm_gib")
    hbm = stats["bytes_limit"] / plan.GIB
  report = plan.plan(FLAGS.config, hbm_gib=hbm, prompt_len=FLAGS.prompt_len)
  print(plan_report.describe(report))
  return 0 if report["fits"] else 1


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Run folder: checkpoints, logs, report.")
  flags.DEFINE_bool("plan_only", False, "Print the memory plan and exit.")
  flags.DEFINE_float("hbm_gib", 0.0, "Budget per device for --plan_only (0: the device's).")
  flags.DEFINE_integer("prompt_len", 256, "Prompt tokens per row for --plan_only.")
  flags.DEFINE_bool("allow_config_change", False,
                    "Resume with a config other than the workdir's (logged).")
  flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # library INFO lines (checkpoint I/O) drown the progress
  try:
    if FLAGS.plan_only:
      sys.exit(_plan_only())
    if not FLAGS.workdir:
      raise app.UsageError("--workdir is required (except with --plan_only)")
    loop.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                            allow_config_change=FLAGS.allow_config_change)
  except (validation.ConfigError, workdir.WorkdirBusy) as e:  # one line naming it, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(cli.USAGE_ERROR)
  except (checkpointing.CheckpointError, recovery.Collapsed) as e:  # each says what to do
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  except OSError as e:  # a full disk or a permission outside the checkpoints (metrics, report)
    print(f"error: {e.strerror or e}: {e.filename or ''}; the checkpoints written before it are "
          "intact: run the same command to resume once it is fixed", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
