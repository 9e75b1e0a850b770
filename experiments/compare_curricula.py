"""Curricula compared on equal rollout budgets, several seeds each.

  python -m experiments.compare_curricula --config configs/compare.py:quickstart --seeds=5 \
      --workdir=workdirs/compare --out=benchmarks/results

`--config` is the setting: the config every run starts from, `configs/compare.py:NAME` (see that
file for the settings; overrides such as `--config.rl.group_size=4` apply to every run). NAME,
the text after ":", names the run folders and the summary files. Every run starts from the same
SFT warm start (trained once per setting, in WORKDIR/NAME/base) and the same data; seeds vary only
the RL randomness (`config.rl.seed`: rollouts, curriculum, minibatches). Each method gets the same
number of rollouts: steps = budget / (P * G * oversample), so a post-rollout filter that samples
twice the prompts gets half the updates. Uniform sampling and SEC are also run at every learning
rate of `--lr_sweep`, and each is reported at its best one, so the baseline gets the same tuning
as the method it is compared with.

Per method the summary gives: rollouts (and steps) to reach the tuned uniform baseline's final
held-out accuracy, final per-bin and out-of-distribution accuracy with 95% intervals across
seeds, the area under the held-out accuracy curve (its mean over the run: less fragile than one
crossing time), the fraction of sampled groups that carried signal (not all equal), and wall
time; with the standard error of one run's accuracy on each bin's held-out set. On a mixture of
tasks also the final accuracy per task, the smallest per-task gain over the warm start and the
spread of the tasks' accuracies (skill balance); "sec_tasks" there is SEC with one arm per task
(1-D), plain "sec" has one per (task, bin) pair (2-D).
Outputs OUT/curricula_NAME.{json,md,png}. Finished runs are skipped when the command is run
again (each run folder also resumes on its own), so a killed comparison continues where it stopped;
`--analyse_only` rebuilds the summary from the run folders. `--shard=i/n` runs every n-th planned
run from the i-th, so n processes (e.g. one per core, under `taskset`) share the plan; start them
once the warm start exists (one process builds it), and summarise with `--analyse_only`.

Held-out accuracy here is the mean greedy accuracy over the training bins' held-out problems
(the curriculum's arms; those among the evaluated bins), which no run trains on; bins whose problem
space leaves fewer than `eval.min_held_out` held-out problems are left out of it (listed in the
summary). "ood" is the mean over the task's evaluation-only bins.
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
import numpy as np

from rl_curriculum.train import builders

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "The setting, configs/compare.py:NAME: the config every run starts from; "
    "NAME names the run folders and summary files.", lock_config=True)
_METHODS = flags.DEFINE_list("methods", None, "Methods to run (default: METHODS; any curriculum "
                             "or post-rollout filter by name, see ALL_METHODS).")
_SEEDS = flags.DEFINE_integer("seeds", 5, "RL seeds per method (config.rl.seed = 1..seeds).")
_BUDGET = flags.DEFINE_integer("budget", 0, "Rollouts per run (0 = the setting's default).")
_LR_SWEEP = flags.DEFINE_list("lr_sweep", ["1e-5", "2e-5", "4e-5"],
                              "Learning rates tried for uniform and SEC (the others use the "
                              "setting's).")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/compare", "Folder of the run folders.")
_OUT = flags.DEFINE_string("out", "benchmarks/results", "Folder of the summary files.")
_ANALYSE_ONLY = flags.DEFINE_bool("analyse_only", False, "Only rebuild the summary.")
_SHARD = flags.DEFINE_string("shard", "0/1", "i/n: run only every n-th planned run, from the i-th "
                             "(n processes in parallel; then --analyse_only).")
flags.mark_flags_as_required(["config"])

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
                     "--config=configs/compare.py:quickstart")
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
# Statistics (pure functions of numbers; tested on their own).

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30; beyond, the normal 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_interval(values: Sequence[float]) -> dict:
  """Mean and 95% Student-t interval mean +- t_{0.975,n-1} s / sqrt(n) of n >= 1 values
  (s the sample standard deviation). With one value the interval is that value (no spread
  known); "n" says how many there were."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError("mean_interval needs at least one value")
  mean = float(x.mean())
  if x.size == 1:
    return {"mean": mean, "lo": mean, "hi": mean, "n": 1}
  df = x.size - 1
  t = _T975[df - 1] if df <= len(_T975) else 1.96
  half = t * float(x.std(ddof=1)) / math.sqrt(x.size)
  return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": int(x.size)}


def curve_area(xs: Sequence[float], ys: Sequence[float]) -> float:
  """The area under the curve ys(xs) by the trapezoid rule, divided by the span of xs: the mean
  of the curve over the run (for held-out accuracy against rollouts, the accuracy the run held on
  average, which rewards reaching a level early without hanging on one crossing time). One point:
  its y."""
  x, y = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
  if x.size == 0 or x.shape != y.shape:
    raise ValueError(f"curve_area needs equal, non-empty xs and ys, got {x.shape}, {y.shape}")
  if x.size == 1 or x[-1] == x[0]:
    return float(y[-1])
  return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / (x[-1] - x[0]))


def binomial_se(accuracy: float, n: int) -> float:
  """Standard error of an accuracy measured on n independent problems: sqrt(p (1 - p) / n)."""
  return math.sqrt(max(accuracy * (1.0 - accuracy), 0.0) / n) if n > 0 else float("nan")


def first_reaching(xs: Sequence[float], ys: Sequence[float], target: float) -> Optional[float]:
  """The first x whose y is >= target (curves are evaluated at xs, increasing); None if never."""
  for x, y in zip(xs, ys):
    if y >= target - 1e-9:
      return float(x)
  return None


# ---------------------------------------------------------------------------------------------
# Reading runs.


def _read_run(folder: str, train_bin_names: Sequence[str], ood_names: Sequence[str]) -> dict:
  """Curves and totals of one finished run folder."""
  with open(os.path.join(folder, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(folder, "compare.json")) as f:
    meta = json.load(f)
  evals = [r for r in rows if any(k.startswith("eval/acc/") for k in r)]
  # A resumed run may log a step twice; the last record of a step wins.
  by_step = {r["step"]: r for r in evals}
  steps = sorted(by_step)
  acc = lambda r, names: float(np.mean([r[f"eval/acc/{n}"] for n in names])) if names else 0.0
  train_rows = {r["step"]: r for r in rows if "nonzero_adv_frac" in r}
  last = by_step[steps[-1]]
  probs = sorted((k for k in rows[-1] if k.startswith("curriculum/probs/")),
                 key=lambda k: int(k.rsplit("/", 1)[1]))
  rollouts = [s * meta["rollouts_per_step"] for s in steps]
  heldout = [acc(by_step[s], train_bin_names) for s in steps]
  # A run on several tasks logs eval/<task>/accuracy and its skill balance (eval/skill/...).
  tasks = sorted(k.split("/")[1] for k in last
                 if k.startswith("eval/") and k.endswith("/accuracy") and k.count("/") == 2)
  return {
      "steps": steps,
      "rollouts": rollouts,
      "heldout": heldout,
      "auc": curve_area(rollouts, heldout),
      "final_tasks": {t: last[f"eval/{t}/accuracy"] for t in tasks},
      "start_tasks": ({t: by_step[0][f"eval/{t}/accuracy"] for t in tasks}
                      if steps[0] == 0 else {}),
      "min_task_gain": last.get("eval/skill/min_gain"),
      "task_spread": last.get("eval/skill/spread"),
      "task_curves": {t: [by_step[s][f"eval/{t}/accuracy"] for s in steps] for t in tasks},
      "final_bins": {k[len("eval/acc/"):]: v for k, v in last.items() if k.startswith("eval/acc/")},
      "start_heldout": acc(by_step[steps[0]], train_bin_names) if steps[0] == 0 else None,
      "final_heldout": acc(last, train_bin_names),
      "final_ood": acc(last, ood_names) if ood_names else None,  # None: no OOD bins
      "signal_frac": float(np.mean([r["nonzero_adv_frac"] for r in train_rows.values()])),
      # Groups with both right and wrong completions: the curriculum's signal when it learns from
      # correctness; below signal_frac when a format bonus separates all-wrong completions.
      "mixed_frac": float(np.mean([r["mixed_correct_frac"] for r in train_rows.values()])),
      "wall_s": meta["wall_s"],
      "arm_probs": [[train_rows[s][k] for k in probs] for s in sorted(train_rows)] if probs else [],
      "rollouts_per_step": meta["rollouts_per_step"],
  }


def _task_summary(seeds: Sequence[dict]) -> dict:
  """Per-task numbers of one method's seeds (runs on several tasks; {} otherwise): final accuracy
  per task, the minimum per-task gain over the warm start and the spread of per-task accuracy
  (each a mean_interval over seeds), and the mean per-task curve."""
  if not seeds[0]["final_tasks"] or any(r["min_task_gain"] is None for r in seeds):
    return {}
  tasks = sorted(seeds[0]["final_tasks"])
  return {
      "final_tasks": {t: mean_interval([r["final_tasks"][t] for r in seeds]) for t in tasks},
      "gain_tasks": ({t: mean_interval([r["final_tasks"][t] - r["start_tasks"][t] for r in seeds])
                      for t in tasks} if all(r["start_tasks"] for r in seeds) else None),
      "min_task_gain": mean_interval([r["min_task_gain"] for r in seeds]),
      "task_spread": mean_interval([r["task_spread"] for r in seeds]),
      "task_curves": {t: np.mean([r["task_curves"][t] for r in seeds], axis=0).tolist()
                      for t in tasks},
  }


def summarise(runs: dict, budget: int) -> dict:
  """Per-method summary of {(method, lr, seed): run}; uniform and SEC at their best rate.

  The target is the tuned uniform baseline's final held-out accuracy (mean over seeds). For each
  method and seed, rollouts to target = the first evaluation at or above it (None if never);
  the method's figure is the mean over seeds that reached it, with how many did.
  """
  by_method_lr = {}
  for (method, lr, seed), run in runs.items():
    by_method_lr.setdefault((method, lr), {})[seed] = run
  best_lr = {}
  for (method, lr), seeds in by_method_lr.items():
    score = float(np.mean([r["final_heldout"] for r in seeds.values()]))
    if method not in best_lr or score > best_lr[method][1]:
      best_lr[method] = (lr, score)
  if "uniform" not in best_lr:
    raise ValueError("the comparison needs the uniform baseline's runs")
  sweep = {m: {f"{lr:g}": float(np.mean([r["final_heldout"] for r in s.values()]))
               for (mm, lr), s in by_method_lr.items() if mm == m}
           for m in best_lr}
  uniform = by_method_lr[("uniform", best_lr["uniform"][0])]
  target = float(np.mean([r["final_heldout"] for r in uniform.values()]))
  methods = {}
  rank = lambda m: METHODS.index(m) if m in METHODS else len(METHODS)
  for method in sorted(best_lr, key=rank):
    lr = best_lr[method][0]
    seeds = by_method_lr[(method, lr)]
    reach = {s: first_reaching(r["rollouts"], r["heldout"], target) for s, r in seeds.items()}
    reached = [v for v in reach.values() if v is not None]
    bins = sorted(next(iter(seeds.values()))["final_bins"])
    rollouts = next(iter(seeds.values()))["rollouts"]
    curve = np.mean([r["heldout"] for r in seeds.values()], axis=0)
    methods[method] = {
        "learning_rate": lr,
        "seeds": sorted(seeds),
        "rollouts_to_target": mean_interval(reached) if reached else None,
        "rollouts_to_target_fraction": (float(np.mean(reached)) / budget) if reached else None,
        "seeds_reaching_target": len(reached),
        "per_seed_rollouts_to_target": {str(s): v for s, v in sorted(reach.items())},
        "steps_to_target": (float(np.mean(reached)) / seeds[min(seeds)]["rollouts_per_step"]
                            if reached else None),
        "final_heldout": mean_interval([r["final_heldout"] for r in seeds.values()]),
        "gain_heldout": (mean_interval([r["final_heldout"] - r["start_heldout"]
                                        for r in seeds.values()])
                         if all(r.get("start_heldout") is not None for r in seeds.values())
                         else None),
        "final_ood": (mean_interval([r["final_ood"] for r in seeds.values()])
                      if all(r["final_ood"] is not None for r in seeds.values()) else None),
        "final_bins": {b: mean_interval([r["final_bins"][b] for r in seeds.values()])
                       for b in bins},
        "signal_frac": mean_interval([r["signal_frac"] for r in seeds.values()]),
        "mixed_frac": mean_interval([r["mixed_frac"] for r in seeds.values()]),
        "wall_s": mean_interval([r["wall_s"] for r in seeds.values()]),
        "auc": mean_interval([r["auc"] for r in seeds.values()]),
        "curve": {"rollouts": list(rollouts), "heldout_mean": curve.tolist()},
        **_task_summary(list(seeds.values())),
        "arm_probs_mean": (np.mean([r["arm_probs"] for r in seeds.values()], axis=0).tolist()
                           if all(r["arm_probs"] for r in seeds.values()) else []),
    }
  goal = None
  if "sec" in methods:
    sec, uni = methods["sec"], methods["uniform"]
    rollouts_met = bool(sec["rollouts_to_target"] is not None
                        and sec["seeds_reaching_target"] == len(sec["seeds"])
                        and sec["rollouts_to_target"]["mean"] <= 0.6 * budget
                        and uni["rollouts_to_target"] is not None
                        and sec["rollouts_to_target"]["hi"] < uni["rollouts_to_target"]["lo"])
    goal = {
        "sec_rollouts_fraction_of_budget": sec["rollouts_to_target_fraction"],
        "uniform_rollouts_fraction_of_budget": uni["rollouts_to_target_fraction"],
        "sec_seeds_reaching": sec["seeds_reaching_target"],
        "met": rollouts_met,
        "rule": "every SEC seed reaches the tuned uniform final accuracy, in at most 0.6x the "
                "budget on average, and SEC's 95% interval of rollouts-to-target lies below "
                "uniform's",
    }
    if sec.get("min_task_gain") is not None:  # several tasks: skill balance too
      best = max(methods, key=lambda m: (methods[m].get("min_task_gain")
                                          or {"mean": -math.inf})["mean"])
      goal.update({
          "rollouts_met": rollouts_met,
          "best_min_task_gain": best,
          "met": rollouts_met and best == "sec",
          "rule": goal["rule"] + "; and SEC has the largest mean minimum per-task gain"})
  starts = [r["start_heldout"] for r in runs.values() if r.get("start_heldout") is not None]
  start = float(np.mean(starts)) if starts else None
  return {"target_heldout": target, "start_heldout": start,
          # A target the warm start already meets makes rollouts-to-target 0 for every method.
          "target_above_start": None if start is None else bool(target > start + 1e-9),
          "budget_rollouts": budget, "lr_sweep": sweep,
          "methods": methods, "sec_goal": goal}


# ---------------------------------------------------------------------------------------------
# Output.


def _fmt(ci: Optional[dict], scale: float = 100.0, digits: int = 1) -> str:
  if ci is None:
    return "never"
  if ci["n"] == 1:
    return f"{ci['mean'] * scale:.{digits}f}"
  return (f"{ci['mean'] * scale:.{digits}f} "
          f"[{ci['lo'] * scale:.{digits}f}, {ci['hi'] * scale:.{digits}f}]")


def markdown(summary: dict, setting: str) -> str:
  lines = [f"# Curricula compared: {setting}", "",
           f"Budget {summary['budget_rollouts']} rollouts per run. Target: the tuned uniform "
           f"baseline's final held-out accuracy, {summary['target_heldout'] * 100:.1f}%. "
           "Intervals: 95% Student-t across seeds.", "",
           "| method | lr | seeds reaching target | rollouts to target (x budget) | "
           "final held-out % | gain over start, points | area under the curve % | final OOD % | "
           "groups with signal % | groups with mixed correctness % | wall s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  if summary.get("start_heldout") is not None:
    lines[2] += (f" Every run starts from the same warm start, at "
                 f"{summary['start_heldout'] * 100:.1f}%.")
  if summary.get("target_above_start") is False:
    lines[2] += (" The tuned uniform baseline ends no higher than it started, so every method "
                 "meets the target at 0 rollouts and rollouts-to-target says nothing here; "
                 "compare the final accuracies and gains instead.")
  for name, m in summary["methods"].items():
    frac = m["rollouts_to_target_fraction"]
    reach = ("never" if m["rollouts_to_target"] is None else
             f"{_fmt(m['rollouts_to_target'], 1, 0)} ({frac:.2f}x)")
    lines.append(f"| {name} | {m['learning_rate']:g} | {m['seeds_reaching_target']}/"
                 f"{len(m['seeds'])} | {reach} | {_fmt(m['final_heldout'])} | "
                 f"{_fmt(m['gain_heldout'])} | {_fmt(m['auc'])} | "
                 f"{_fmt(m['final_ood']) if m['final_ood'] else '-'} | "
                 f"{_fmt(m['signal_frac'])} | {_fmt(m['mixed_frac'])} | "
                 f"{m['wall_s']['mean']:.0f} |")
  swept = {m: s for m, s in summary["lr_sweep"].items() if len(s) > 1}
  if swept:
    lines += ["", "Learning-rate sweep (final held-out accuracy, mean over seeds): " + "; ".join(
        f"{m}: " + ", ".join(f"{lr} -> {v * 100:.1f}%" for lr, v in sorted(s.items()))
        for m, s in swept.items()), ""]
  else:
    lines += ["", "One learning rate per method, no sweep: " + ", ".join(
        f"{m} {next(iter(s))}" for m, s in summary["lr_sweep"].items()) + ".", ""]
  bins = sorted(next(iter(summary["methods"].values()))["final_bins"])
  lines += ["Final held-out accuracy per bin (%, mean [95% interval]):", "",
            "| method | " + " | ".join(bins) + " |", "|---|" + "---|" * len(bins)]
  for name, m in summary["methods"].items():
    lines.append(f"| {name} | " + " | ".join(_fmt(m["final_bins"][b], digits=0) for b in bins)
                 + " |")
  if summary.get("bin_se"):
    lines += ["", "Standard error of one run's accuracy on a bin's held-out set, sqrt(p (1 - p) "
              "/ n) at the tuned uniform baseline's final accuracy p (points): " + ", ".join(
                  f"{b} {se * 100:.1f} (n = {summary['held_out_sizes'][b]})"
                  for b, se in sorted(summary["bin_se"].items())) + ". At most "
              f"{50 / math.sqrt(min(summary['held_out_sizes'][b] for b in summary['bin_se'])):.1f} "
              "points (p = 0.5); "
              "a bin at 0 of n correct has 3 / n as its 95% upper bound (the rule of three)."]
  lines += _task_lines(summary)
  goal = summary.get("sec_goal")
  if goal:
    lines += ["", f"SEC goal ({goal['rule']}): **{'met' if goal['met'] else 'not met'}**."]
  return "\n".join(lines) + "\n"


def _task_lines(summary: dict) -> list:
  """The markdown of a comparison on several tasks: per method, the final accuracy of each task,
  the minimum per-task gain over the warm start and the spread of the tasks' accuracies."""
  with_tasks = {n: m for n, m in summary["methods"].items() if m.get("final_tasks")}
  if not with_tasks:
    return []
  tasks = sorted(next(iter(with_tasks.values()))["final_tasks"])
  lines = ["", "Skill balance: final held-out accuracy per task (%), the smallest per-task gain "
           "over the warm start and the spread (largest minus smallest task accuracy), in "
           "points; mean [95% interval] over seeds:", "",
           "| method | " + " | ".join(tasks) + " | min per-task gain | spread |",
           "|---|" + "---|" * (len(tasks) + 2)]
  for name, m in with_tasks.items():
    lines.append(f"| {name} | " + " | ".join(_fmt(m["final_tasks"][t]) for t in tasks)
                 + f" | {_fmt(m['min_task_gain'])} | {_fmt(m['task_spread'])} |")
  return lines


def plot(summary: dict, path: str, arm_names: Sequence[str], title: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  tasks = sorted(next(iter(summary["methods"].values())).get("task_curves") or {})
  fig, axes = plt.subplots(1, 3 if tasks else 2, figsize=(19 if tasks else 13, 4.8))
  ax, bx = axes[0], axes[-1]
  if tasks:  # per-task curves of uniform and the SEC variants
    cx = axes[1]
    colours = plt.get_cmap("tab10")
    for j, name in enumerate(n for n in ("uniform", "sec", "sec_tasks") if n in summary["methods"]):
      m = summary["methods"][name]
      for i, task in enumerate(tasks):
        cx.plot(m["curve"]["rollouts"], np.asarray(m["task_curves"][task]) * 100,
                color=colours(i), ls=("-", "--", ":")[j], lw=1.8,
                label=f"{task}, {name}")
    cx.set(xlabel="rollouts", ylabel="held-out accuracy (%)",
           title="Per task (mean over seeds)")
    cx.grid(alpha=0.3)
    cx.legend(fontsize=7, ncol=2)
  for name, m in summary["methods"].items():
    style = dict(lw=2.5) if name in ("sec", "uniform") else dict(lw=1.2, alpha=0.8)
    ax.plot(m["curve"]["rollouts"], np.asarray(m["curve"]["heldout_mean"]) * 100,
            label=f"{name} (lr {m['learning_rate']:g})", **style)
  ax.axhline(summary["target_heldout"] * 100, color="k", ls=":", lw=1, label="uniform final")
  ax.set(xlabel="rollouts", ylabel="held-out accuracy, training bins (%)",
         title=f"{title}: mean over seeds")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  sec = summary["methods"].get("sec")
  if sec and sec["arm_probs_mean"]:
    probs = np.asarray(sec["arm_probs_mean"])
    steps = np.arange(1, len(probs) + 1)
    bx.stackplot(steps, probs.T, labels=list(arm_names)[:probs.shape[1]], alpha=0.85)
    bx.set(xlabel="RL step", ylabel="probability", ylim=(0, 1),
           title="SEC arm probabilities (mean over seeds)")
    bx.legend(fontsize=7, loc="upper right")
  else:
    bx.axis("off")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Driver.


def _link_warm_start(base: str, folder: str) -> None:
  """Shares the setting's tokenizer and SFT warm start with a run folder (symlinks)."""
  os.makedirs(folder, exist_ok=True)
  for name in ("tokenizer.model", "sft", "warm_start.json"):
    src, dst = os.path.abspath(os.path.join(base, name)), os.path.join(folder, name)
    if os.path.exists(src) and not os.path.lexists(dst):
      os.symlink(src, dst)


def plan(base_config, methods: Sequence[str], seeds: int, budget: int,
         lr_sweep: Sequence[float]) -> list:
  """[(method, learning_rate, seed, config)] of every run, seed by seed, so that a comparison cut
  short still covers every method: per seed, the tuned methods at the setting's learning rate,
  then at the sweep's other rates in the given order, then the other methods."""
  default_lr = float(base_config.rl.learning_rate)
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
            clock: Callable[[], float] = time.time) -> bool:
  """Runs every planned run of this shard (runs i, i + n, ... of the plan) not finished yet, in
  WORKDIR/NAME; False when SIGTERM stopped it (run it again)."""
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  root = os.path.join(workdir, name)
  base = os.path.join(root, "base")
  loop.prepare(base_config, base, log=log)  # the shared SFT warm start (cached)
  todo = plan(base_config, methods, seeds, budget, lr_sweep)
  for i, (method, lr, seed, config) in enumerate(todo):
    if i % shard[1] != shard[0]:
      continue
    folder = os.path.join(root, run_name(method, seed, lr))
    if os.path.exists(os.path.join(folder, "compare.json")):
      continue
    _link_warm_start(base, folder)
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


def analyse(name: str, config, workdir: str, out: str, budget: int) -> dict:
  """Reads every finished run folder in WORKDIR/NAME of the setting `config`; writes
  OUT/curricula_NAME.*."""
  task = builders.build_task(config)
  train_names = [task.bin_names[b] for b in config.task.train_bins if b in config.task.eval_bins]
  ood_names = [task.bin_names[b] for b in config.task.eval_bins if b in task.eval_only_bins]
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
    runs[(meta["method"], meta["learning_rate"], meta["seed"])] = _read_run(
        folder, train_names, ood_names)
  # Only seeds that every (method, learning rate) finished, so that a comparison cut short
  # compares like with like.
  configs = {(m, lr) for m, lr, _ in runs}
  complete = sorted({s for _, _, s in runs if all((m, lr, s) in runs for m, lr in configs)})
  if not complete:
    raise ValueError(f"no seed has finished every method in {root} yet")
  runs = {k: v for k, v in runs.items() if k[2] in complete}
  summary = summarise(runs, budget)
  uniform_bins = summary["methods"]["uniform"]["final_bins"]
  summary.update({"setting": name, "train_bins": train_names, "ood_bins": ood_names,
                  "small_bins_excluded": small, "held_out_sizes": sizes,
                  "bin_se": {b: binomial_se(uniform_bins[b]["mean"], sizes[b])
                             for b in train_names if b in sizes and b in uniform_bins},
                  "date": time.strftime("%Y-%m-%d"),
                  "cpu_affinity": sorted(os.sched_getaffinity(0))})
  os.makedirs(out, exist_ok=True)
  stem = os.path.join(out, f"curricula_{name}")
  with open(stem + ".json", "w") as f:
    json.dump(summary, f, indent=1)
  with open(stem + ".md", "w") as f:
    f.write(markdown(summary, name))
  plot(summary, stem + ".png", train_names, name)
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  methods = _METHODS.value or list(METHODS)
  unknown = [m for m in methods if m not in ALL_METHODS]
  if unknown:
    raise app.UsageError(f"unknown methods {unknown}; choose from {ALL_METHODS}")
  if "uniform" not in methods:
    raise app.UsageError("the comparison needs the uniform baseline (--methods must include it)")
  try:
    name = setting_name(config_flags.get_config_filename(flags.FLAGS["config"]))
    shard = parse_shard(_SHARD.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  config = _CONFIG.value
  budget = _BUDGET.value or default_budget(config)
  lrs = [float(x) for x in _LR_SWEEP.value]
  if not _ANALYSE_ONLY.value:
    if not run_all(name, config, methods, _SEEDS.value, budget, lrs, _WORKDIR.value,
                   shard=shard):
      return
    if shard[1] > 1:
      print(f"shard {_SHARD.value} done; once every shard is, run again with --analyse_only")
      return
  summary = analyse(name, config, _WORKDIR.value, _OUT.value, budget)
  print(markdown(summary, name))


if __name__ == "__main__":
  app.run(main)
