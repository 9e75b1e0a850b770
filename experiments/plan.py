"""Will this config fit, and how fast could it run? Compiles every program of the run ahead of
time for a TPU slice (by XLA:TPU, on this host, no TPU needed) or for N fake CPU devices, without
weights, and prints each program's memory per device and, on a TPU, its roofline time.

  python -m experiments.plan --config configs/sec_paper_countdown_qwen3b.py --target v5e-8
  python -m experiments.plan --config configs/quickstart.py --target v5e-4 --out plan.json
  python -m experiments.plan --config configs/scratch.py --target cpu:8 --hbm_gib 1 \
      --config.rl.microbatches=2                  # overrides as in experiments.train
  python -m experiments.plan --config configs/sec_paper_countdown_qwen3b.py --target v5e-32 \
      --search                                    # the fastest layout that fits

Targets: v5e-N, v6e-N (N chips) and v5p-N (N TensorCores, two a chip) for the slice sizes Cloud
TPU sells (v5e-8, v5p-8, v6e-8, v5e-16, v5p-32, ...; multi-host slices too), compiled by XLA:TPU
(libtpu, from `pip install -e '.[tpu]'`); cpu:N, N fake CPU devices, compiled by XLA:CPU (pass
--hbm_gib). What the numbers are: per program, the compiler's memory per device (a program over
the chip's memory is a row that says by how much); on a TPU, a roofline bound on its time: its
FLOPs (matmuls) and HBM bytes, every loop counted, over the chip's published peaks. A bound is
the least time the compiled program could take, not a measured time (rl_curriculum/plan/); beside
it, the program's physical limit (the model's own FLOPs and bytes at the same peaks). `--search`
compiles candidate rollout layouts, decode slots, remat policies and microbatch counts and prints
those that fit, fastest first, with the overrides that run the best. Exit status 0 when every
program fits (a search: when a step fits), 1 when one does not, 2 for a bad config.
"""

import os
import sys


def _target_from_argv(argv) -> str:
  for i, arg in enumerate(argv):
    if arg.startswith("--target="):
      return arg.split("=", 1)[1]
    if arg == "--target" and i + 1 < len(argv):
      return argv[i + 1]
  return "cpu:8"


if __name__ == "__main__":
  # Fake CPU devices must be requested before JAX starts; a TPU slice is compiled for from the
  # CPU host, whose one device runs nothing.
  _name = _target_from_argv(sys.argv)
  _cpus = _name[4:] if _name.startswith("cpu:") and _name[4:].isdigit() else "1"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                             f"device_count={_cpus}").strip()
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
  flags.DEFINE_string("target", "cpu:8", "What to compile for: a TPU slice (v5e-8, v5p-8, "
                      "v6e-8, v5e-16, v5p-32, ...) by XLA:TPU, or cpu:N fake CPU devices.")
  flags.DEFINE_float("hbm_gib", 0.0, "Memory per device, GiB (0: the TPU chip's; required "
                     "for cpu:N).")
  flags.DEFINE_integer("prompt_len", 256, "Prompt tokens per row (the longest).")
  flags.DEFINE_string("out", "", "Also write the report as JSON here.")
  flags.DEFINE_list("programs", ["select", "sampler", "learn"], "Programs to compile.")
  flags.DEFINE_integer("layers", 0, "Plan the model with this many layers (0: its own).")
  flags.DEFINE_bool("all_engines", False, "Also plan the engine the config does not use.")
  flags.DEFINE_bool("search", False, "Search rollout layouts x decode slots and remat policies "
                    "x microbatches for the fastest configuration that fits (a TPU target; "
                    "rl_curriculum/plan/search.py); prints the overrides that run it.")
  flags.DEFINE_list("search_families", ["learn", "rollout"], "With --search: the families "
                    "to search (learn, rollout); both bound a step.")
  flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from rl_curriculum.plan import planner  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import report  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import targets  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.setup import validation  # pylint: disable=import-outside-toplevel
  try:
    target = targets.parse(FLAGS.target)
  except ValueError as e:
    raise app.UsageError(str(e))
  if not target.is_tpu and not FLAGS.hbm_gib:
    raise app.UsageError(f"--target {target.name}: pass --hbm_gib, the memory of a device")
  if FLAGS.search:
    from rl_curriculum.plan import search  # pylint: disable=import-outside-toplevel
    try:
      result = search.search(FLAGS.config, target=target, prompt_len=FLAGS.prompt_len,
                             log=lambda line: print(line, flush=True),
                             families=tuple(FLAGS.search_families))
    except (validation.ConfigError, ValueError) as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    print(search.describe(result))
    _write(result)
    found = all(result[family] for family in FLAGS.search_families)
    sys.exit(0 if found else 1)
  try:
    plan = planner.plan(FLAGS.config, target=target, hbm_gib=FLAGS.hbm_gib or None,
                        prompt_len=FLAGS.prompt_len, programs=tuple(FLAGS.programs),
                        num_layers=FLAGS.layers or None, all_engines=FLAGS.all_engines)
  except validation.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(report.describe(plan))
  _write(plan)
  sys.exit(0 if plan["fits"] else 1)


def _write(result: dict) -> None:
  """The result as JSON at --out, when given."""
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
