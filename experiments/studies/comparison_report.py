"""The report of a curricula comparison: its markdown and its plot.

Both take a summary of `experiments.studies.comparison_stats.summarise`, with the fields that
`experiments.studies.compare_curricula.analyse` adds to it ("held_out_sizes", "bin_se"). A summary
that names its "split" titles the held-out numbers as validation numbers (the learning rates were
chosen on them) and, once every chosen run was evaluated on the test split ("split" == "test"),
adds the test-split numbers; a summary without "split" reads as it always did.
"""

import math
from typing import Optional, Sequence

import numpy as np


def _fmt(ci: Optional[dict], scale: float = 100.0, digits: int = 1) -> str:
  """A mean_interval as text, times `scale` with `digits` decimals: "mean [lo, hi]", the mean
  alone for one value, "never" for None."""
  if ci is None:
    return "never"
  # + 0.0 writes a bound of -0.0 (all seeds at zero) as 0.
  mean, lo, hi = (ci[k] * scale + 0.0 for k in ("mean", "lo", "hi"))
  if ci["n"] == 1:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _points(d: Optional[dict]) -> str:
  """A difference of accuracies as signed points, "mean [lo, hi]"; "-" for None."""
  if not d:
    return "-"
  return f"{100 * d['mean']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def _resolved(d: Optional[dict]) -> str:
  """Whether a difference a - b is resolved, its interval excluding 0: "a higher", "b higher",
  "no"; "-" for None."""
  if not d:
    return "-"
  return "a higher" if d["lo"] > 0 else "b higher" if d["hi"] < 0 else "no"


def markdown(summary: dict, setting: str) -> str:
  """The comparison of `setting` as markdown: the per-method table (rollouts to target, final,
  gain, area under the curve, OOD, groups with signal, wall time), the learning-rate sweep, the
  per-bin table, the bins' standard errors (where the summary has "bin_se"), the paired
  differences of every two methods, the skill balance on several tasks and the SEC goal. Where
  the summary names its "split", these are headed as the validation split; with "split" ==
  "test" the test split follows (`_test_lines`), and the contrasts at matched learning rates
  (`_matched_lines`) wherever the summary has any."""
  intro = (f"Budget {summary['budget_rollouts']} rollouts per run. Target: the tuned uniform "
           f"baseline's final held-out accuracy, {summary['target_heldout'] * 100:.1f}%. "
           "Intervals: 95% Student-t across seeds. Rollouts to target: the mean over every seed, "
           "a seed that never reached the target within the budget counted as the whole budget "
           "(a lower bound of its time), \"never\" when no seed reached it.")
  if summary.get("start_heldout") is not None:
    intro += (f" Every run starts from the same warm start, at "
              f"{summary['start_heldout'] * 100:.1f}%.")
  if summary.get("target_above_start") is False:
    intro += (" The tuned uniform baseline ends no higher than it started, so every method "
              "meets the target at 0 rollouts and rollouts-to-target says nothing here; "
              "compare the final accuracies and gains instead.")
  lines = [f"# Curricula compared: {setting}", ""]
  if "split" in summary:
    lines += ["## Validation split (learning rates chosen on it)", "",
              _split_note(summary["split"]), ""]
  lines += [intro, "",
            "| method | lr | seeds reaching target | rollouts to target, unreached = budget "
            "(x budget) | "
            "final held-out % | gain over start, points | area under the curve % | final OOD % | "
            "groups with signal % | groups with mixed correctness % | wall s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name, m in summary["methods"].items():
    frac = m["rollouts_to_target_fraction"]
    reach = ("never" if m["seeds_reaching_target"] == 0 else
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
  lines += _pair_lines(summary)
  lines += _task_lines(summary)
  goal = summary.get("sec_goal")
  if goal:
    lines += ["", f"SEC goal ({goal['rule']}): **{'met' if goal['met'] else 'not met'}**."]
  if summary.get("split") == "test":
    lines += _test_lines(summary)
  lines += _matched_lines(summary)
  return "\n".join(lines) + "\n"


def _split_note(split: str) -> str:
  """What the validation section's numbers are, given the summary's "split"."""
  note = ("Held-out accuracy in this section is measured on each run's validation split, on "
          "which every method's learning rate was chosen (its best mean final accuracy), so the "
          "chosen rates' numbers here lean optimistic.")
  if split == "test":
    return note + " The test split, never used for a choice, follows below."
  return note + (" Not every chosen run has been evaluated on the test split yet, so there are "
                 "no test numbers.")


def _start_test_note(summary: dict) -> str:
  """The sentence on the warm start's test accuracy when it was evaluated there, else ""."""
  start = summary.get("start_test")
  if not start:
    return ""
  bins = ", ".join(f"{b} {100 * a:.1f}%" for b, a in sorted(start["bins"].items()))
  ood = (f", OOD {100 * start['ood']:.1f}%" if start.get("ood") is not None else "")
  return (f" The warm start every run starts from scores {100 * start['mean']:.1f}% on the test "
          f"split's training bins{ood} ({bins}).")


def _test_lines(summary: dict) -> list:
  """The markdown of the test split: per method its learning rate (chosen on validation), final
  test accuracy and OOD test accuracy, the per-bin test accuracies, and every two methods'
  paired test differences with the t and the bootstrap interval."""
  methods = summary["methods"]
  ood = ", ".join(summary.get("test_ood_bins") or summary.get("ood_bins") or []) or "none"
  lines = ["", "## Test split (never used for a choice)", "",
           "Each method's final checkpoint at the learning rate chosen on validation, evaluated "
           "once on the test split (problems apart from the validation ones); mean [95% "
           "Student-t interval] across seeds. OOD test accuracy is the mean over the test "
           f"split's out-of-distribution bins of record: {ood}.{_start_test_note(summary)}", "",
           "| method | lr (chosen on validation) | seeds | final test % | OOD test % |",
           "|---|---|---|---|---|"]
  for name, m in methods.items():
    lines.append(f"| {name} | {m['learning_rate']:g} | {len(m['seeds'])} | "
                 f"{_fmt(m['final_test'])} | "
                 f"{_fmt(m['final_test_ood']) if m['final_test_ood'] else '-'} |")
  bins = sorted(next(iter(methods.values()))["final_test_bins"])
  lines += ["", "Final test accuracy per bin (%, mean [95% interval]):", "",
            "| method | " + " | ".join(bins) + " |", "|---|" + "---|" * len(bins)]
  for name, m in methods.items():
    lines.append(f"| {name} | " + " | ".join(_fmt(m["final_test_bins"][b], digits=0)
                                            for b in bins) + " |")
  rows = summary.get("pairs") or []
  if rows:
    lines += ["", "Paired test differences, a - b, in points: final test accuracy paired per "
              "problem (every run answered the same test problems) with its t interval and, as "
              "a check, the seeds x problems bootstrap interval; resolved: the t interval "
              "excludes 0.", "",
              "| a - b | final test, points [95% t] | bootstrap [95%] | resolved | "
              "OOD test, points [95% t] |",
              "|---|---|---|---|---|"]
    for pair in rows:
      d = pair.get("final_test")
      lines.append(f"| {pair['a']} - {pair['b']} | "
                   f"{_points(d) if d else 'no per-problem outcomes to pair'} | "
                   f"{_points(pair.get('final_test_bootstrap'))} | {_resolved(d)} | "
                   f"{_points(pair.get('final_test_ood'))} |")
  return lines


def _matched_lines(summary: dict) -> list:
  """The markdown of `comparison_stats.matched_pairs`: every two methods at each learning rate
  both ran, on their common seeds, paired on validation and on test outcomes."""
  rows = summary.get("matched_pairs") or []
  if not rows:
    return []
  lines = ["", "## Matched learning rates", "",
           "Every two methods at a learning rate both ran, on the seeds both ran, apart from any "
           "choice of rate: paired differences a - b in points [95% interval].", "",
           "| lr | a - b | seeds | validation, points [95%] | test, points [95%] |",
           "|---|---|---|---|---|"]
  for row in rows:
    lines.append(f"| {row['learning_rate']:g} | {row['a']} - {row['b']} | {len(row['seeds'])} | "
                 f"{_points(row['final_heldout'])} | {_points(row['final_test'])} |")
  return lines


def _pair_lines(summary: dict) -> list:
  """The markdown of `comparison_stats.pairs`: every two methods' difference in final held-out
  accuracy, paired per problem and seed, and in rollouts to the target."""
  rows = summary.get("pairs") or []
  if not rows:
    return []
  lines = ["", "Paired differences, a - b: final held-out accuracy in points, paired per problem "
           "(every run answered the same held-out problems; the interval adds the spread across "
           "seeds), and rollouts to the target (95% Welch interval across seeds, a seed that "
           "never reached the target counted as the whole budget):", "",
           "| a - b | final held-out, points [95%] | resolved | "
           "rollouts to target, unreached = budget [95%] |",
           "|---|---|---|---|"]
  for pair in rows:
    d, r = pair["final_heldout"], pair["rollouts_to_target"]
    held = _points(d) if d else "no per-problem outcomes to pair"
    reach = f"{r['mean']:+.0f} [{r['lo']:+.0f}, {r['hi']:+.0f}]" if r else "-"
    lines.append(f"| {pair['a']} - {pair['b']} | {held} | {_resolved(d)} | {reach} |")
  return lines


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


def _test_forest(ax, summary: dict, ood: bool) -> None:
  """Paired test differences a - b in points with their 95% t intervals, each labelled with its
  numbers: on the training bins (`ood` False) the methods at their chosen rates (the bootstrap's
  interval thin and grey beneath) and at each learning rate two methods share; on the OOD bins
  of record (`ood` True) the methods at their chosen rates."""
  pairs = summary.get("pairs") or []
  if ood:
    bins = ", ".join(summary.get("test_ood_bins") or summary.get("ood_bins") or [])
    rows = [(f"{p['a']} - {p['b']}", p.get("final_test_ood"), None, "C3") for p in pairs]
    title = f"Test split, OOD ({bins}): a - b [95%]"
  else:
    rows = [(f"{p['a']} - {p['b']}, chosen rates", p.get("final_test"),
             p.get("final_test_bootstrap"), "C0") for p in pairs]
    rows += [(f"{r['a']} - {r['b']} at lr {r['learning_rate']:g}", r.get("final_test"), None,
              "C7") for r in summary.get("matched_pairs") or []]
    title = "Test split, training bins: a - b [95%]"
  rows = [r for r in rows if r[1]]
  ys = np.arange(len(rows))[::-1]
  for y, (_, d, boot, colour) in zip(ys, rows):
    mean = 100 * d["mean"]
    ax.errorbar(mean, y, xerr=[[mean - 100 * d["lo"]], [100 * d["hi"] - mean]], fmt="o",
                color=colour, capsize=3, lw=1.8)
    ax.annotate(_points(d), (100 * d["hi"], y), xytext=(4, 0), textcoords="offset points",
                va="center", fontsize=6.5)
    if boot:
      ax.plot([100 * boot["lo"], 100 * boot["hi"]], [y - 0.28] * 2, color="grey", lw=1)
  ax.axvline(0, color="k", lw=0.8)
  ax.set_yticks(ys, [r[0] for r in rows], fontsize=7)
  ax.set_xlim(right=ax.get_xlim()[1] + 0.45 * np.ptp(ax.get_xlim()))  # room for the labels
  ax.set(xlabel="test accuracy, a - b (points)", title=title)
  ax.grid(axis="x", alpha=0.3)


def plot(summary: dict, path: str, arm_names: Sequence[str], title: str) -> None:
  """Writes the figure of a summary to `path` (PNG): mean held-out accuracy against rollouts per
  method with the target, on several tasks the per-task curves of uniform and the SEC variants,
  with a test split its paired test differences (`_test_forest`, training and OOD bins), and
  SEC's mean arm probabilities per step, stacked (`arm_names` label the arms)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  tasks = sorted(next(iter(summary["methods"].values())).get("task_curves") or {})
  tested = summary.get("split") == "test"
  ood = tested and any(p.get("final_test_ood") for p in summary.get("pairs") or [])
  panels = 2 + bool(tasks) + tested + ood
  fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.8))
  ax, bx = axes[0], axes[-1]
  if tested:
    _test_forest(axes[-2 - ood], summary, ood=False)
  if ood:
    _test_forest(axes[-2], summary, ood=True)
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
  held_out = "validation" if "split" in summary else "held-out"
  ax.set(xlabel="rollouts", ylabel=f"{held_out} accuracy, training bins (%)",
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
