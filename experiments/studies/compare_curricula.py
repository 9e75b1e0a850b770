"""Curricula compared on equal rollout budgets, several seeds each.

  python -m experiments.studies.compare_curricula --config configs/compare.py:scratch --seeds=5 \
      --workdir=workdirs/compare --out=benchmarks/results

`--config` is the setting: the config every run starts from, `configs/compare.py:NAME` (see that
file for the settings; overrides such as `--config.rl.group_size=4` apply to every run). NAME,
the text after ":", names the run folders and the summary files. Every run starts from the same
SFT warm start (trained once per setting, in WORKDIR/NAME/base) and the same data; seeds vary only
the RL randomness (`config.rl.seed`: rollouts, curriculum, minibatches). Each method gets the same
number of rollouts: steps = budget / (P * G * oversample), so a post-rollout filter that samples
twice the prompts gets half the updates. Uniform sampling and SEC are also run at every learning
rate of `--lr_sweep`, and each is reported at its best one, so the baseline gets the same tuning
as the method it is compared with; `--lr_grid=uniform:1e-5/2e-5/4e-5,sec:2e-5/4e-5/8e-5` gives
each method a grid of its own instead.

Validation and test: a setting with `task.held_out_split = "validation"` (countdown_prereg)
evaluates its runs on the validation half of the held-out prompts, and the best learning rates
are chosen on it; `--test_per_bin=N` then evaluates every finished run's last checkpoint once on
N test problems per bin, the other half (`test_evaluation`), and the summary reports the chosen
cells and their pairs on that test split, with a two-way bootstrap beside each interval, and
every pair of methods at each learning rate they share ("matched_pairs"). A method may carry rollout settings after "+": "uniform+k2"
samples up to two policy versions ahead of learning (rl.max_staleness), "uniform+k1+b12+drop"
decodes 12 iterations a step and drops the groups still decoding when their step comes
(`split_method`).

Per method the summary gives: rollouts (and steps) to reach the tuned uniform baseline's final
held-out accuracy, final per-bin and out-of-distribution accuracy with 95% intervals across
seeds, the area under the held-out accuracy curve (its mean over the run: less fragile than one
crossing time), the fraction of sampled groups that carried signal (not all equal), and wall
time; with the standard error of one run's accuracy on each bin's held-out set. On a mixture of
tasks also the final accuracy per task, the smallest per-task gain over the warm start and the
spread of the tasks' accuracies (skill balance); "sec_tasks" there is SEC with one arm per task
(1-D), plain "sec" has one per (task, bin) pair (2-D). For every two methods the summary also
gives their difference in final held-out accuracy with a 95% interval paired per problem (every
run answers the same held-out problems, so a problem's difficulty cancels; the interval adds the
spread across seeds: `rl_curriculum.train.report.paired`), and their difference in rollouts to the
target (Welch interval across seeds).
Outputs OUT/curricula_NAME.{json,md,png}. Finished runs are skipped when the command is run
again (each run folder also resumes on its own), so a killed comparison continues where it stopped;
`--analyse_only` rebuilds the summary from the run folders. `--shard=i/n` runs every n-th planned
run from the i-th, so n processes (e.g. one per core, under `taskset`) share the plan; start them
once the warm start exists (one process builds it), and summarise with `--analyse_only`.

Held-out accuracy here is the mean greedy accuracy over the training bins' held-out problems
(the curriculum's arms; those among the evaluated bins), which no run trains on; bins whose problem
space leaves fewer than `eval.min_held_out` held-out problems are left out of it (listed in the
summary). "ood" is the mean over the task's evaluation-only bins.

This module plans, runs and collects the runs; `experiments/studies/comparison_stats.py` computes
the summary's statistics and `experiments/studies/comparison_report.py` writes its markdown and
plot.
"""

import json
import math
import os
import time
from typing import Callable, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments import cli
from experiments.studies import comparison_report
from experiments.studies import comparison_stats
from rl_curriculum.train.setup import builders, warm_start

FLAGS = flags.FLAGS


# ---------------------------------------------------------------------------------------------
# Settings and methods.


def setting_name(config_flag: str) -> str:
  """The setting's name in a `--config` value: its argument ("configs/compare.py:countdown" ->
  "countdown"), which names the run folders (WORKDIR/NAME) and summary files (OUT/curricula_NAME).

  Raises:
    ValueError: the value has no argument after a colon.
  """
  _, _, name = config_flag.partition(":")
  if not name:
    raise ValueError(f"--config={config_flag} names no setting: give one after a colon, e.g. "
                     "--config=configs/compare.py:scratch")
  return name


# Names of the recorded comparisons for two methods: the all-equal filter over uniform selection,
# and the absolute-learning-progress teacher.
_ALIASES = {"dynamic_filtering": "all_equal", "lp_teacher": "alp_teacher"}
# Methods over one arm per task of a mixture (`curriculum.arms = "task"`): SEC over tasks alone
# ("1-D"), where plain "sec" on a mixture has an arm per (task, bin) pair ("2-D").
_TASK_ARMS = {"sec_tasks": "sec"}
# A post-rollout filter runs over uniform selection, rolling out twice the prompts it trains on.
_FILTER_OVERSAMPLE = 2.0


def _curriculum_fields(method: str, config) -> dict:
  """The `config.curriculum` fields one method sets: name, options, filter, oversample and arms.

  A method is a curriculum of `builders.CURRICULA` (SEC keeps the setting's options, every other
  curriculum runs with its constructor's defaults; easy_to_hard's schedule is sized in run_config,
  once the step count is known), a post-rollout filter of `builders.FILTERS` over uniform
  selection, or an alias of either (`_ALIASES`); on a task mixture, "sec_tasks" is SEC with
  one arm per task (`_TASK_ARMS`). GRESO rolls its skipped candidates out to fill the
  batch (`refill=True`): every method then spends exactly P x G rollouts a step, the comparison's
  unit; its saving (slots left unrolled) shows as `rollouts_saved` in a run of its own.
  """
  if method in _TASK_ARMS:
    return dict(_curriculum_fields(_TASK_ARMS[method], config), arms="task")
  method = _ALIASES.get(method, method)
  plain = dict(options={}, filter="none", oversample=1.0, arms="bin")
  if method == "sec":
    return dict(plain, name="sec", options=dict(config.curriculum.options))
  if method == "greso":
    return dict(plain, name="greso", options=dict(refill=True))
  if method in builders.CURRICULA:
    return dict(plain, name=method)
  if method in builders.FILTERS and method != "none":
    return dict(plain, name="uniform", filter=method, oversample=_FILTER_OVERSAMPLE)
  raise ValueError(f"unknown method {method!r}; choose from {ALL_METHODS}")


# Rollout settings a method may carry after "+" ("uniform+k2", "sec+k2+b8+drop"): k<K> samples up
# to K policy versions ahead (rl.max_staleness), b<B> decodes B iterations a step (partial
# rollouts, rl.decode_budget), drop discards late groups (rl.admission); any of them runs the
# continuous engine, whose tokens the static engine's equal for the synchronous runs. The stale
# tokens of k >= 1 train uncorrected (rl.off_policy_correction = none), as the recorded
# comparisons of overlapped rollouts did.
_ROLLOUT_TOKENS = {"k": "max_staleness", "b": "decode_budget"}


def split_method(method: str) -> tuple[str, dict]:
  """(curriculum method, {config.rl field: value}) of a method name with rollout settings.

  Raises:
    ValueError: a setting after "+" is none of k<K>, b<B>, drop, wait.
  """
  base, *settings = method.split("+")
  fields = {}
  for setting in settings:
    if setting in ("drop", "wait"):
      fields["admission"] = setting
    elif setting[:1] in _ROLLOUT_TOKENS and setting[1:].isdigit():
      fields[_ROLLOUT_TOKENS[setting[0]]] = int(setting[1:])
    else:
      raise ValueError(f"method {method!r}: {setting!r} is not a rollout setting (k<K>, b<B>, "
                       "drop or wait)")
  if fields:
    fields["engine"] = "continuous"
  if fields.get("max_staleness"):
    fields["off_policy_correction"] = "none"
  return base, fields


# The default comparison (the recorded results' methods and order).
METHODS = ("uniform", "easy_to_hard", "sec", "dump", "dynamic_filtering", "vcrl", "vade", "greso",
           "adarft", "lp_teacher")
# Every name --methods accepts.
ALL_METHODS = tuple(dict.fromkeys(
    METHODS + tuple(builders.CURRICULA) + tuple(f for f in builders.FILTERS if f != "none")
    + tuple(_TASK_ARMS)))
TUNED = ("uniform", "sec")  # methods run at every learning rate of the sweep


def run_config(setting_config, method: str, seed: int, budget: int,
               learning_rate: Optional[float] = None):
  """The config of one run: the setting, the method's curriculum, the RL seed and the step count
  that spends `budget` rollouts."""
  c = setting_config.copy_and_resolve_references()
  method, rollout_fields = split_method(method)
  for field, value in rollout_fields.items():
    c.rl[field] = value
  fields = _curriculum_fields(method, c)
  c.curriculum.name = fields["name"]
  c.curriculum.options = fields["options"]
  c.curriculum.filter = fields["filter"]
  c.curriculum.oversample = fields["oversample"]
  c.curriculum.arms = fields["arms"]
  per_step = builders.sampled_prompts(c) * c.rl.group_size
  c.rl.steps = max(budget // per_step, 1)
  if method == "easy_to_hard":  # the schedule covers every arm within the run
    c.curriculum.options = dict(steps_per_arm=max(c.rl.steps // len(c.task.train_bins), 1))
  c.rl.seed = seed
  if learning_rate is not None:
    c.rl.learning_rate = learning_rate
  c.checkpoint.every = min(c.checkpoint.every, c.rl.steps)
  return c


def default_budget(config) -> int:
  """Rollouts of the setting's own run: rl.steps x rl.prompts_per_step x rl.group_size."""
  return config.rl.steps * config.rl.prompts_per_step * config.rl.group_size


def run_name(method: str, seed: int, learning_rate: float) -> str:
  return f"{method}_lr{learning_rate:g}_s{seed}"


# ---------------------------------------------------------------------------------------------
# Driver.


def parse_lr_grid(items: Sequence[str]) -> dict:
  """{method: [learning rates]} of `--lr_grid` items "method:lr/lr/...", e.g.
  ["uniform:1e-5/2e-5/4e-5", "sec:2e-5/4e-5/8e-5"].

  Raises:
    ValueError: an item without ":" or a rate, a rate that is not a positive number, or a method
      named twice.
  """
  grid = {}
  for item in items:
    method, _, rates = item.partition(":")
    try:
      values = [float(x) for x in rates.split("/") if x]
    except ValueError:
      values = []
    if not method or not values or min(values) <= 0:
      raise ValueError(f"--lr_grid items look like method:lr/lr/..., got {item!r}")
    if method in grid:
      raise ValueError(f"--lr_grid names {method!r} twice")
    grid[method] = values
  return grid


def plan(base_config, methods: Sequence[str], seeds: int, budget: int,
         lr_sweep: Sequence[float], lr_grid: Optional[dict] = None) -> list:
  """[(method, learning_rate, seed, config)] of every run, seed by seed, so that a comparison cut
  short still covers every method. With `lr_grid` ({method: rates}), per seed every method at
  each rate of its grid (a method without one at the setting's rate), in the given orders;
  without it, per seed the tuned methods (TUNED) at the setting's learning rate, then at the
  sweep's other rates in the given order, then the other methods at the setting's rate."""
  default_lr = float(base_config.rl.learning_rate)
  if lr_grid:
    order = [(m, float(lr)) for m in methods for lr in lr_grid.get(m, [default_lr])]
  else:
    other_rates = [float(lr) for lr in lr_sweep if not math.isclose(float(lr), default_lr)]
    tuned = [m for m in methods if m in TUNED]
    order = ([(m, default_lr) for m in tuned] + [(m, lr) for lr in other_rates for m in tuned]
             + [(m, default_lr) for m in methods if m not in TUNED])
  return [(method, lr, seed, run_config(base_config, method, seed, budget, lr))
          for seed in range(1, seeds + 1) for method, lr in order]


def parse_shard(text: str) -> tuple:
  """"i/n" -> (i, n) with 0 <= i < n."""
  try:
    index, count = (int(x) for x in text.split("/"))
  except ValueError:
    raise ValueError(f"--shard must look like i/n, got {text!r}") from None
  if not 0 <= index < count:
    raise ValueError(f"--shard {text!r}: need 0 <= i < n")
  return index, count


def run_all(name: str, base_config, methods: Sequence[str], seeds: int, budget: int,
            lr_sweep: Sequence[float], workdir: str, log=print, shard: tuple = (0, 1),
            clock: Callable[[], float] = time.time, lr_grid: Optional[dict] = None) -> bool:
  """Runs every planned run of this shard (runs i, i + n, ... of the plan) not finished yet, in
  WORKDIR/NAME; False when SIGTERM stopped it (run it again)."""
  from rl_curriculum.train import loop
  from rl_curriculum.train.setup import prepare  # pylint: disable=import-outside-toplevel
  root = os.path.join(workdir, name)
  base = os.path.join(root, "base")
  prepare.prepare(base_config, base, log=log)  # the shared SFT warm start (cached)
  todo = plan(base_config, methods, seeds, budget, lr_sweep, lr_grid)
  for i, (method, lr, seed, config) in enumerate(todo):
    if i % shard[1] != shard[0]:
      continue
    folder = os.path.join(root, run_name(method, seed, lr))
    if os.path.exists(os.path.join(folder, "compare.json")):
      continue
    warm_start.link_caches(base, folder)
    log(f"[{i + 1}/{len(todo)}] {run_name(method, seed, lr)}: {config.rl.steps} steps")
    # Wall time of earlier attempts stopped by SIGTERM (a SIGKILL loses its attempt's time).
    partial = os.path.join(folder, "compare_partial.json")
    earlier = 0.0
    if os.path.exists(partial):
      with open(partial) as f:
        earlier = float(json.load(f)["wall_s"])
    t0 = clock()
    summary = loop.train_and_evaluate(config, folder)
    if "preempted_at" in summary:
      with open(partial, "w") as f:
        json.dump({"wall_s": earlier + clock() - t0}, f)
      return False
    meta = {"method": method, "learning_rate": lr, "seed": seed, "steps": config.rl.steps,
            "rollouts_per_step": builders.sampled_prompts(config) * config.rl.group_size,
            "wall_s": earlier + clock() - t0}
    with open(os.path.join(folder, "compare.json"), "w") as f:
      json.dump(meta, f, indent=1)
  return True


def finished_runs(root: str) -> list:
  """[(folder, its compare.json)] of every finished run folder in `root`, by name."""
  out = []
  for run in sorted(os.listdir(root)):
    meta = os.path.join(root, run, "compare.json")
    if os.path.exists(meta):
      with open(meta) as f:
        out.append((os.path.join(root, run), json.load(f)))
  return out


def test_ood_bins(config, names: Sequence[str]) -> tuple:
  """Bin indices of the names in `names`: evaluation-only bins of the setting's task that its runs
  do not evaluate, added to the test split (`test_evaluation.test_sets`).

  Raises:
    ValueError: a name is no bin of the task, or not such a bin.
  """
  task = builders.build_task(config)
  unknown = [n for n in names if n not in task.bin_names]
  if unknown:
    raise ValueError(f"--test_ood_bins: {unknown} are no bins of the task {task.bin_names}")
  bins = tuple(task.bin_names.index(n) for n in names)
  bad = [task.bin_names[b] for b in bins
         if b in config.task.eval_bins or b not in task.eval_only_bins]
  if bad:
    raise ValueError(f"--test_ood_bins: {bad} must be evaluation-only bins the runs do not "
                     "evaluate (not in task.eval_bins)")
  return bins


def evaluate_test_split(name: str, config, workdir: str, budget: int, per_bin: int,
                        log=print, extra_bins: Sequence[int] = (), shard: tuple = (0, 1)) -> int:
  """Evaluates every finished run in WORKDIR/NAME (of this shard: runs i, i + n, ... by name) on
  the test split (`test_evaluation`), with the evaluation-only `extra_bins`, each bin of a run at
  most once; returns how many runs it went through."""
  from experiments.studies import test_evaluation  # pylint: disable=import-outside-toplevel
  runs = finished_runs(os.path.join(workdir, name))[shard[0]::shard[1]]
  if shard[0] == 0:  # the warm start every run starts from: its folder has no RL checkpoint
    test_evaluation.evaluate_run(config, os.path.join(workdir, name, "base"), per_bin, log=log,
                                 extra_bins=extra_bins)
  for folder, meta in runs:
    run_cfg = run_config(config, meta["method"], meta["seed"], budget, meta["learning_rate"])
    test_evaluation.evaluate_run(run_cfg, folder, per_bin, log=log, extra_bins=extra_bins)
  return len(runs)


def analyse(name: str, config, workdir: str, out: str, budget: int,
            test_ood: Sequence[int] = ()) -> dict:
  """Reads every finished run folder in WORKDIR/NAME of the setting `config`; writes
  OUT/curricula_NAME.*. The test split's out-of-distribution bins are `test_ood` (bins the test
  split adds, `test_ood_bins`) when given, else the runs' own."""
  task = builders.build_task(config)
  train_names = [task.bin_names[b] for b in config.task.train_bins if b in config.task.eval_bins]
  ood_names = [task.bin_names[b] for b in config.task.eval_bins if b in task.eval_only_bins]
  test_ood_names = [task.bin_names[b] for b in test_ood] or ood_names
  root = os.path.join(workdir, name)
  folders = [os.path.join(root, run) for run in sorted(os.listdir(root))
             if os.path.exists(os.path.join(root, run, "compare.json"))]
  # Bins whose problem space leaves too few held-out problems are not compared (the runs share
  # the data, so any run's summary says which).
  small, sizes = [], {}
  if folders:
    with open(os.path.join(folders[0], "summary.json")) as f:
      first = json.load(f)
    small, sizes = first["small_bins"], first["held_out_sizes"]
  train_names = [n for n in train_names if n not in small]
  runs = {}
  for folder in folders:
    meta_path = os.path.join(folder, "compare.json")
    with open(meta_path) as f:
      meta = json.load(f)
    runs[(meta["method"], meta["learning_rate"], meta["seed"])] = comparison_stats.read_run(
        folder, train_names, ood_names, test_ood_names)
  # Only seeds that every (method, learning rate) finished, so that a comparison cut short
  # compares like with like.
  configs = {(m, lr) for m, lr, _ in runs}
  complete = sorted({s for _, _, s in runs if all((m, lr, s) in runs for m, lr in configs)})
  if not complete:
    raise ValueError(f"no seed has finished every method in {root} yet")
  runs = {k: v for k, v in runs.items() if k[2] in complete}
  summary = comparison_stats.summarise(runs, budget, METHODS)
  uniform_bins = summary["methods"]["uniform"]["final_bins"]
  summary.update({"setting": name, "train_bins": train_names, "ood_bins": ood_names,
                  "test_ood_bins": test_ood_names,
                  "start_test": comparison_stats.read_start_test(root, train_names,
                                                                 test_ood_names),
                  "small_bins_excluded": small, "held_out_sizes": sizes,
                  "bin_se": {b: comparison_stats.binomial_se(uniform_bins[b]["mean"], sizes[b])
                             for b in train_names if b in sizes and b in uniform_bins},
                  "date": time.strftime("%Y-%m-%d"),
                  "cpu_affinity": sorted(os.sched_getaffinity(0))})
  os.makedirs(out, exist_ok=True)
  stem = os.path.join(out, f"curricula_{name}")
  with open(stem + ".json", "w") as f:
    json.dump(summary, f, indent=1)
  with open(stem + ".md", "w") as f:
    f.write(comparison_report.markdown(summary, name))
  comparison_report.plot(summary, stem + ".png", arm_names(config, task), name)
  return summary


def arm_names(config, task) -> list:
  """The names of the curriculum's arms in arm order: every training bin, including those left
  out of the held-out mean for having too few held-out problems (SEC still draws them)."""
  return [task.bin_names[b] for b in config.task.train_bins]


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  config_flags.DEFINE_config_file(
      "config", None, "The setting, configs/compare.py:NAME: the config every run starts from; "
      "NAME names the run folders and summary files.", lock_config=True)
  flags.DEFINE_list("methods", None, "Methods to run (default: METHODS; any curriculum "
                    "or post-rollout filter by name, see ALL_METHODS), each with rollout "
                    "settings after '+' if any: uniform+k2 (rl.max_staleness=2), "
                    "uniform+k2+b8+drop (a decode budget of 8 a step, late groups dropped).")
  flags.DEFINE_integer("seeds", 5, "RL seeds per method (config.rl.seed = 1..seeds).")
  flags.DEFINE_integer("budget", 0, "Rollouts per run (0 = the setting's default).")
  flags.DEFINE_list("lr_sweep", ["1e-5", "2e-5", "4e-5"],
                    "Learning rates tried for uniform and SEC (the others use the "
                    "setting's).")
  flags.DEFINE_list("lr_grid", [], "Each method's own learning rates, method:lr/lr/..., e.g. "
                    "uniform:1e-5/2e-5/4e-5,sec:2e-5/4e-5/8e-5 (replaces --lr_sweep; a method "
                    "without a grid runs at the setting's rate).")
  flags.DEFINE_integer("test_per_bin", 0, "After the runs, evaluate each finished run once on "
                       "this many test problems per bin (the test half of the held-out prompts; "
                       "the setting must evaluate on the validation half), then summarise "
                       "(0: no test split).")
  flags.DEFINE_list("test_ood_bins", [], "Evaluation-only bins of the task, by name, that the "
                    "runs do not evaluate and the test split adds as its out-of-distribution "
                    "bins of record (default: the runs' own evaluation-only bins).")
  flags.DEFINE_string("workdir", "workdirs/compare", "Folder of the run folders.")
  flags.DEFINE_string("out", "benchmarks/results", "Folder of the summary files.")
  flags.DEFINE_bool("analyse_only", False, "Only rebuild the summary.")
  flags.DEFINE_string("shard", "0/1", "i/n: run only every n-th planned run, from the i-th "
                      "(n processes in parallel; then --analyse_only); with --test_per_bin, "
                      "evaluate only every n-th finished run on the test split.")
  flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  methods = FLAGS.methods or list(METHODS)
  try:
    unknown = [m for m in methods if split_method(m)[0] not in ALL_METHODS]
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  if unknown:
    raise app.UsageError(f"unknown methods {unknown}; choose from {ALL_METHODS}, each with "
                         "rollout settings after '+' if any (k<K>, b<B>, drop)")
  if "uniform" not in methods:
    raise app.UsageError("the comparison needs the uniform baseline (--methods must include it)")
  try:
    name = setting_name(config_flags.get_config_filename(flags.FLAGS["config"]))
    shard = parse_shard(FLAGS.shard)
    test_ood = test_ood_bins(FLAGS.config, FLAGS.test_ood_bins)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  config = FLAGS.config
  budget = FLAGS.budget or default_budget(config)
  lrs = [float(x) for x in FLAGS.lr_sweep]
  try:
    grid = parse_lr_grid(FLAGS.lr_grid)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  if not FLAGS.analyse_only:
    if not run_all(name, config, methods, FLAGS.seeds, budget, lrs, FLAGS.workdir,
                   shard=shard, lr_grid=grid):
      return
    if shard[1] > 1:
      print(f"shard {FLAGS.shard} done; once every shard is, run again with --analyse_only")
      return
  if FLAGS.test_per_bin:
    evaluate_test_split(name, config, FLAGS.workdir, budget, FLAGS.test_per_bin,
                        extra_bins=test_ood, shard=shard)
    if shard[1] > 1:
      print(f"test split of shard {FLAGS.shard} done; once every shard is, run again without "
            "--shard to summarise")
      return
  summary = analyse(name, config, FLAGS.workdir, FLAGS.out, budget, test_ood=test_ood)
  print(comparison_report.markdown(summary, name))


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
