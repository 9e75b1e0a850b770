"""One config trained with several RL seeds from one warm start: what RL changed, with intervals
paired per problem and over seeds.

  python -m experiments.studies.seeds --config configs/episodes_smollm2.py --seeds=3 \\
      --workdir=workdirs/episodes_seeds --out=benchmarks/results/episodes_smollm2

Seed s (s = 0 .. N - 1) is a run of the config with rl.seed = s in WORKDIR/seed_s, every run
starting from the tokenizer and SFT warm start made once in WORKDIR/base (`warm_start.link_caches`)
and answering the same held-out problems. A finished run is skipped when the command runs again,
and a killed one resumes; `--analyse_only` rebuilds the summary from the run folders.

The summary, per held-out bin: greedy accuracy at step 0 (the warm start: the same for every
seed, checked), after RL per seed and their mean, and the change with its 95% interval paired per
problem and over seeds (`paired.paired_difference` of the seeds' final outcomes against the warm
start's); for episodes of several turns, before and after (the mean over seeds), the share of
turns that called a tool, the share of solved episodes that called one, and turns per episode.
Writes OUT/seeds.{json,md} and, from seed 0, the warm start's and the last evaluation's held-out
transcripts (OUT/transcripts_step_<N>.json).
"""

import json
import os
import shutil
from typing import Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections
import numpy as np
from ml_collections import config_flags

from experiments import cli
from rl_curriculum.train.report import paired
from rl_curriculum.train.report import summary as run_summary
from rl_curriculum.train.setup import warm_start

FLAGS = flags.FLAGS
# The episode statistics the summary reports, before and after.
EPISODE_STATS = ("episode/tool_call_rate", "episode/solved_with_tool", "episode/turns",
                 "episode/success")


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  config_flags.DEFINE_config_file("config", None, "The config every seed runs.", lock_config=True)
  flags.DEFINE_integer("seeds", 3, "RL seeds (rl.seed = 0 .. seeds - 1).")
  flags.DEFINE_string("workdir", None, "Folder of the warm start and the runs.")
  flags.DEFINE_string("out", None, "Folder of the summary (seeds.json, seeds.md).")
  flags.DEFINE_bool("analyse_only", False, "Summarise the finished runs; train nothing.")
  flags.mark_flags_as_required(["config", "workdir", "out"])


def seed_config(config: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
  """`config` with rl.seed = `seed`."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.rl.seed = seed
  return config


def run_seeds(config: ml_collections.ConfigDict, seeds: int, workdir: str, log=print) -> bool:
  """Trains every seed not finished yet; False when SIGTERM stopped one (run it again)."""
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.setup import prepare  # pylint: disable=import-outside-toplevel
  base = os.path.join(workdir, "base")
  prepare.prepare(config, base, log=log)  # the shared warm start (cached)
  for seed in range(seeds):
    folder = os.path.join(workdir, f"seed_{seed}")
    if run_summary.finished(seed_config(config, seed), folder) is not None:
      continue
    warm_start.link_caches(base, folder)
    log(f"seed {seed}: {config.rl.steps} steps in {folder}")
    if "preempted_at" in loop.train_and_evaluate(seed_config(config, seed), folder):
      return False
  return True


def _episode_stats(folder: str, step: int) -> dict:
  path = os.path.join(folder, "heldout", f"step_{step}_episodes.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def summarise(config: ml_collections.ConfigDict, seeds: int, workdir: str) -> dict:
  """The summary of the finished runs (module docstring).

  Raises:
    ValueError: a seed's run is not finished, or the seeds' warm starts answered differently.
  """
  steps = config.rl.steps
  folders = [os.path.join(workdir, f"seed_{s}") for s in range(seeds)]
  befores, afters = [], []
  for folder in folders:
    before = run_summary.read_outcomes(run_summary.outcomes_path(folder, 0))
    after = run_summary.read_outcomes(run_summary.outcomes_path(folder, steps))
    if before is None or after is None:
      raise ValueError(f"{folder} has no evaluation at step 0 and step {steps}: run it first")
    befores.append(before)
    afters.append(after)
  for other in befores[1:]:
    if any(not np.array_equal(other[b][0], befores[0][b][0]) for b in befores[0]):
      raise ValueError("the seeds' step-0 evaluations differ: they did not start from one "
                       "warm start")
  bins = {}
  for name, (start, _) in befores[0].items():
    final = np.stack([a[name][0] for a in afters]).astype(np.float64)
    change = paired.paired_difference(final, start.astype(np.float64))
    bins[name] = {"before": float(start.mean()), "after_per_seed": final.mean(axis=1).tolist(),
                  "after": float(final.mean()), "change": change["mean"],
                  "interval": [change["lo"], change["hi"]], "n": int(start.size),
                  "episodes_before": {k: v for k, v in _episode_stats(folders[0], 0)
                                      .get(name, {}).items() if k in EPISODE_STATS},
                  "episodes_after": {k: float(np.mean([_episode_stats(f, steps)[name][k]
                                                       for f in folders]))
                                     for k in EPISODE_STATS
                                     if k in _episode_stats(folders[0], steps).get(name, {})}}
  return {"seeds": seeds, "steps": steps, "trained_bins": _trained(config), "bins": bins}


def _trained(config: ml_collections.ConfigDict) -> list:
  from rl_curriculum.train.setup import builders  # pylint: disable=import-outside-toplevel
  task = builders.build_task(config)
  return [task.bin_names[b] for b in config.task.train_bins]


def markdown(result: dict) -> str:
  """The summary as a table: accuracy before, after (mean over seeds), the change and its
  interval, and the episode statistics before -> after."""
  lines = [f"{result['seeds']} RL seeds of {result['steps']} steps from one warm start; greedy "
           "held-out accuracy (%), the change's 95% interval paired per problem and over seeds",
           "", "| bin | before | after (per seed) | change [95%] | n | tool-call rate | "
           "solved with a tool | turns |", "|---|---|---|---|---|---|---|---|"]
  for name, row in result["bins"].items():
    seeds = ", ".join(f"{100 * a:.1f}" for a in row["after_per_seed"])
    low, high = row["interval"]
    stats = []
    for key in ("episode/tool_call_rate", "episode/solved_with_tool", "episode/turns"):
      b, a = row["episodes_before"].get(key), row["episodes_after"].get(key)
      scale, unit = (1, "") if key == "episode/turns" else (100, "%")
      stats.append("" if b is None or a is None else
                   f"{scale * b:.{2 if scale == 1 else 0}f}{unit} -> "
                   f"{scale * a:.{2 if scale == 1 else 0}f}{unit}")
    trained = "" if name in result["trained_bins"] else " (never trained)"
    lines.append(f"| {name}{trained} | {100 * row['before']:.1f} | {100 * row['after']:.1f} "
                 f"({seeds}) | {100 * row['change']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] "
                 f"| {row['n']} | " + " | ".join(stats) + " |")
  return "\n".join(lines) + "\n"


def write(result: dict, workdir: str, out: str) -> None:
  """OUT/seeds.{json,md} and seed 0's first and last held-out transcripts."""
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "seeds.json"), "w") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  with open(os.path.join(out, "seeds.md"), "w") as f:
    f.write(markdown(result))
  for step in (0, result["steps"]):
    source = os.path.join(workdir, "seed_0", "heldout", f"step_{step}_transcripts.json")
    if os.path.exists(source):
      shutil.copy(source, os.path.join(out, f"transcripts_step_{step}.json"))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  config = FLAGS.config
  if not FLAGS.analyse_only and not run_seeds(config, FLAGS.seeds, FLAGS.workdir):
    print("stopped by SIGTERM: run the same command again to go on")
    return
  result = summarise(config, FLAGS.seeds, FLAGS.workdir)
  write(result, FLAGS.workdir, FLAGS.out)
  print(markdown(result))


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
