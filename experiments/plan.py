"""Will this config fit on N devices of H GiB? Compiles the run's programs ahead of time, on N fake
CPU devices, without weights, and prints per-device memory from XLA's analysis.

  python -m experiments.plan --config configs/sec_paper_countdown_qwen3b.py --devices 8 \
      --hbm_gib 80 --out plan.json
  python -m experiments.plan --config configs/scratch.py --devices 8 --hbm_gib 1 \
      --config.rl.microbatches=2                  # overrides as in experiments.train

The model's shape comes from `config.model.preset`, or from the config.json of an HF folder named
by `config.model.source`; no weights are read. Exit status 0 when every program fits, 1 when one
does not, 2 for a bad config. See rl_curriculum/plan/planner.py for what the numbers mean.
"""

import os
import sys


def _devices_from_argv(argv) -> int:
  for i, arg in enumerate(argv):
    if arg.startswith("--devices="):
      return int(arg.split("=", 1)[1])
    if arg == "--devices" and i + 1 < len(argv):
      return int(argv[i + 1])
  return 8


if __name__ == "__main__":
  # Fake CPU devices must be requested before JAX starts.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                             f"device_count={_devices_from_argv(sys.argv)}").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from ml_collections import config_flags

from experiments import cli  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                  lock_config=True)
  flags.DEFINE_integer("devices", 8, "Devices to plan for (fake CPU devices).")
  flags.DEFINE_float("hbm_gib", 80.0, "Memory per device, GiB.")
  flags.DEFINE_integer("prompt_len", 256, "Prompt tokens per row (the longest).")
  flags.DEFINE_string("out", "", "Also write the report as JSON here.")
  flags.DEFINE_list("programs", ["sampler", "learn"], "Programs to compile.")
  flags.DEFINE_integer("layers", 0, "Plan the model with this many layers (0: its own).")
  flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import planner as plan  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.setup import validation  # pylint: disable=import-outside-toplevel
  if jax.device_count() != FLAGS.devices:
    raise app.UsageError(f"JAX sees {jax.device_count()} devices, not {FLAGS.devices}: run this "
                         "file as a script (python -m experiments.plan), which sets XLA_FLAGS")
  try:
    report = plan.plan(FLAGS.config, hbm_gib=FLAGS.hbm_gib, prompt_len=FLAGS.prompt_len,
                       programs=tuple(FLAGS.programs), num_layers=FLAGS.layers or None)
  except validation.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(plan.describe(report))
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump(report, f, indent=1)
  sys.exit(0 if report["fits"] else 1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
