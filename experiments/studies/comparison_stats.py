"""Statistics of a curricula comparison: pure functions of numbers and of finished run folders.

A run is one (method, learning rate, seed) of `experiments/studies/compare_curricula.py`;
`read_run` turns its folder (metrics.jsonl, compare.json) into curves and totals, `summarise` turns
every run into the per-method summary that `experiments/studies/comparison_report.py` writes out:
intervals across seeds (`mean_interval`), rollouts to the tuned uniform baseline's final accuracy
(`first_reaching`, within the budget: `rollouts_to_target`), the mean of the accuracy curve
(`curve_area`) and the SEC goal. Nothing here reads flags.

Two splits. A run's own held-out evaluations are its validation split: every curve, the target
and each method's choice of learning rate come from them. Once every run has finished, each run's
final checkpoint is evaluated once on the test split, its per-problem outcomes kept at
`test_outcomes_path(folder, final step)` (`TEST_DIR`, in the format of
`rl_curriculum.train.report.summary.write_outcomes`); the "final_test*" numbers come from there
and are never used to choose anything. `matched_pairs` contrasts methods at equal learning rates.
"""

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from rl_curriculum.train.report import paired
from rl_curriculum.train.report import summary as run_summary

__all__ = ["TEST_DIR", "test_outcomes_path", "mean_interval", "curve_area", "binomial_se",
           "first_reaching", "rollouts_to_target", "read_run", "welch_interval", "pairs",
           "matched_pairs", "method_order", "summarise"]

# Under a run folder, the per-problem outcomes of its final checkpoint on the test split.
TEST_DIR = "test"

# ---------------------------------------------------------------------------------------------
# Numbers: intervals, curve areas, crossings.


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
  half = paired.t_quantile(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
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


def rollouts_to_target(per_seed: Sequence[Optional[float]], budget: float) -> dict:
  """Rollouts to the target of S seeds, some of which may never reach it (None).

  A seed that never reached the target within the budget B is censored: its true time lies
  beyond the run, so B is a lower bound of it. Every seed counts, with t_s = its rollouts to the
  target, or B when censored:

    restricted   mean_interval(t_s) over all S seeds: rollouts to the target within the budget,
                 a seed not reaching it counted as the whole budget (a lower bound of the mean
                 time when some seed is censored, the mean time itself when none is).
    censored     how many seeds never reached it.
    reached      (S - censored) / S, the Kaplan-Meier fraction reached by the end of the budget
                 (every seed is followed to the same budget, so no censoring comes earlier).
    median       the sample median of t_s when more than half the seeds reached the target (its
                 middle values are then reach times, not censored ones); None otherwise.
  """
  if not per_seed:
    raise ValueError("rollouts_to_target needs at least one seed")
  times = [float(budget) if v is None else float(v) for v in per_seed]
  censored = sum(v is None for v in per_seed)
  reached = len(times) - censored
  return {"restricted": mean_interval(times), "censored": censored,
          "reached": reached / len(times),
          "median": float(np.median(times)) if 2 * reached > len(times) else None}


# ---------------------------------------------------------------------------------------------
# Reading runs.


def test_outcomes_path(folder: str, step: int) -> str:
  """Where the test-split evaluation of run `folder`'s checkpoint after RL step `step` (its final
  step) keeps its per-problem outcomes: <folder>/test/step_<step>.npz."""
  return os.path.join(folder, TEST_DIR, f"step_{step}.npz")


def _bin_outcomes(outcomes: dict, names: Sequence[str]) -> tuple:
  """(correct outcomes of the bins `names`, end to end in that order; each problem's index in
  `names`) from {bin name: (correct, formatted)} of `run_summary.read_outcomes`."""
  return (np.concatenate([outcomes[b][0] for b in names]),
          np.concatenate([np.full(len(outcomes[b][0]), i) for i, b in enumerate(names)]))


_TEST_KEYS = ("test_outcomes", "test_outcome_bins", "test_ood_outcomes", "test_ood_bins",
              "final_test", "final_test_bins", "final_test_ood")


def _test_fields(outcomes: Optional[dict], train_bin_names: Sequence[str],
                 ood_names: Sequence[str]) -> dict:
  """The test-split fields of `read_run` from a run's test outcomes ({bin name: (correct,
  formatted)}; None: not evaluated on the test split yet, and every field is None).

    test_outcomes, test_outcome_bins    correct outcomes of `train_bin_names` end to end and each
                                        problem's bin index (as `_bin_outcomes`)
    test_ood_outcomes, test_ood_bins    the same of `ood_names` (None without OOD bins)
    final_test_bins                     {bin: accuracy} of every bin in `outcomes`
    final_test, final_test_ood          mean over `train_bin_names` / `ood_names` of their bins'
                                        accuracies (final_test_ood None without OOD bins)

  Raises:
    ValueError: a bin of `train_bin_names` or `ood_names` missing from `outcomes`.
  """
  if outcomes is None:
    return dict.fromkeys(_TEST_KEYS)
  missing = [b for b in [*train_bin_names, *ood_names] if b not in outcomes]
  if missing:
    raise ValueError(f"test outcomes lack the bins {missing} (they hold {sorted(outcomes)})")
  bins = {b: float(np.mean(correct)) for b, (correct, _) in outcomes.items()}
  train = _bin_outcomes(outcomes, train_bin_names)
  ood = _bin_outcomes(outcomes, ood_names) if ood_names else (None, None)
  return {"test_outcomes": train[0], "test_outcome_bins": train[1],
          "test_ood_outcomes": ood[0], "test_ood_bins": ood[1],
          "final_test": float(np.mean([bins[b] for b in train_bin_names])),
          "final_test_bins": bins,
          "final_test_ood": float(np.mean([bins[b] for b in ood_names])) if ood_names else None}


def read_start_test(root: str, train_bin_names: Sequence[str],
                    ood_names: Sequence[str]) -> Optional[dict]:
  """The test accuracy of the warm start every run of ROOT starts from (ROOT/base, step 0):
  {"mean": over `train_bin_names`, "ood": over `ood_names` (None without), "bins": {bin:
  accuracy}}; None when it was not evaluated on the test split, or not on those bins."""
  outcomes = run_summary.read_outcomes(test_outcomes_path(os.path.join(root, "base"), 0))
  if outcomes is None or not all(b in outcomes for b in [*train_bin_names, *ood_names]):
    return None
  fields = _test_fields(outcomes, train_bin_names, ood_names)
  return {"mean": fields["final_test"], "ood": fields["final_test_ood"],
          "bins": fields["final_test_bins"]}


def read_run(folder: str, train_bin_names: Sequence[str], ood_names: Sequence[str],
             test_ood_names: Optional[Sequence[str]] = None) -> dict:
  """Curves and totals of one finished run folder (its metrics.jsonl and compare.json): held-out
  (validation) accuracy is the mean over `train_bin_names`, out-of-distribution accuracy the mean
  over `ood_names` (None when there are none). "final_outcomes" holds the final evaluation's
  outcome of every held-out problem of `train_bin_names`, bins end to end (`final_outcome_bins`:
  each one's bin index), for paired comparisons; None in a folder from before outcomes were kept.

  The test split: the fields of `_test_fields` ("test_outcomes", "test_outcome_bins",
  "test_ood_outcomes", "test_ood_bins", "final_test", "final_test_bins", "final_test_ood") from
  `test_outcomes_path(folder, final evaluated step)`; all None while that file does not exist.
  The test split's OOD fields are over `test_ood_names` (None: `ood_names`), bins the test split
  may add to those the runs evaluated.
  """
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
  outcomes = run_summary.read_outcomes(run_summary.outcomes_path(folder, steps[-1]))
  if outcomes is not None and not all(b in outcomes for b in train_bin_names):
    outcomes = None
  final = _bin_outcomes(outcomes, train_bin_names) if outcomes is not None else (None, None)
  test = run_summary.read_outcomes(test_outcomes_path(folder, steps[-1]))
  return {
      "final_outcomes": final[0],
      "final_outcome_bins": final[1],
      **_test_fields(test, train_bin_names,
                     ood_names if test_ood_names is None else test_ood_names),
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


def welch_interval(x: Sequence[float], y: Sequence[float]) -> Optional[dict]:
  """mean(x) - mean(y) of two independent samples with its 95% Welch t interval; None unless
  both have at least two values (no spread known)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.size < 2 or y.size < 2:
    return None
  vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
  mean, se = float(x.mean() - y.mean()), math.sqrt(vx + vy)
  df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1)) if se > 0 else math.inf
  half = paired.t_quantile(df) * se
  return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": [int(x.size), int(y.size)]}


def _paired_rows(runs_a: Sequence[dict], runs_b: Sequence[dict], outcomes: str,
                 bins: str) -> Optional[tuple]:
  """(a f[Sa, n], b f[Sb, n], bins int[n]): the per-problem outcomes (field `outcomes`) of two
  sides' runs stacked by seed, with their bin indices (field `bins`); None when a run has none or
  the runs answered different problems (their bin indices differ)."""
  both = [*runs_a, *runs_b]
  if not both or any(r.get(outcomes) is None for r in both):
    return None
  first = both[0][bins]
  if not all(np.array_equal(r[bins], first) for r in both):
    return None
  return (np.stack([r[outcomes] for r in runs_a]), np.stack([r[outcomes] for r in runs_b]),
          first)


def _paired(runs_a: Sequence[dict], runs_b: Sequence[dict], outcomes: str, bins: str,
            bootstrap: bool = False) -> Optional[dict]:
  """`paired.paired_difference` a - b of the outcomes `outcomes` (bin indices `bins`) of two
  sides' runs, or with `bootstrap` `paired.bootstrap_difference` (2000 draws, seed 0); None as
  `_paired_rows`."""
  rows = _paired_rows(runs_a, runs_b, outcomes, bins)
  if rows is None:
    return None
  if bootstrap:
    return paired.bootstrap_difference(*rows, draws=2000, seed=0)
  return paired.paired_difference(*rows)


def pairs(tuned: dict, methods: dict, budget: float) -> list:
  """Every pair (a, b) of methods, a listed before b, at their tuned learning rates (`tuned`:
  {method: {seed: run}}): the difference a - b in final held-out (validation) accuracy, paired
  per problem over seeds ("final_heldout", `paired.paired_difference`; None when a run folder
  kept no per-problem outcomes or the runs were evaluated on different problems), and in
  rollouts to the target within the `budget` ("rollouts_to_target"): `welch_interval` of every
  seed's rollouts to the target, a seed that never reached it counted as the whole budget
  (`rollouts_to_target`), so the difference of restricted means; None only with fewer than two
  seeds on a side.

  On the test split, paired in the same way on the runs' test outcomes (each None unless every
  run of both has them, on the same problems): "final_test" (training bins,
  `paired.paired_difference`), "final_test_bootstrap" (the same difference with
  `paired.bootstrap_difference`'s interval, 2000 draws, seed 0) and "final_test_ood" (OOD bins).
  """
  out = []
  names = list(methods)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      runs_a, runs_b = list(tuned[a].values()), list(tuned[b].values())
      reach = [[float(budget) if v is None else v
                for v in methods[m]["per_seed_rollouts_to_target"].values()] for m in (a, b)]
      out.append({
          "a": a, "b": b,
          "final_heldout": _paired(runs_a, runs_b, "final_outcomes", "final_outcome_bins"),
          "rollouts_to_target": welch_interval(*reach),
          "final_test": _paired(runs_a, runs_b, "test_outcomes", "test_outcome_bins"),
          "final_test_bootstrap": _paired(runs_a, runs_b, "test_outcomes", "test_outcome_bins",
                                          bootstrap=True),
          "final_test_ood": _paired(runs_a, runs_b, "test_ood_outcomes", "test_ood_bins"),
      })
  return out


def method_order(runs: dict, order: Sequence[str] = ()) -> list:
  """The methods of {(method, lr, seed): run}: those named in `order` first, in that order, then
  the others in the order `runs` first names them (the order of `summarise` and `pairs`)."""
  named = list(dict.fromkeys(method for method, _, _ in runs))
  rank = lambda m: order.index(m) if m in order else len(order)
  return sorted(named, key=rank)


def matched_pairs(runs: dict, order: Sequence[str] = ()) -> list:
  """Contrasts of methods at equal learning rates, apart from any choice of rate.

  For every learning rate at which two or more methods ran ({(method, lr, seed): run}), in
  increasing order, every pair (a, b) of them, a before b in `method_order(runs, order)`, on the
  seeds both ran at that rate (a pair with none in common is left out): {"learning_rate", "a",
  "b", "seeds": those seeds, "final_heldout": `paired.paired_difference` a - b of their
  validation outcomes, "final_test": the same of their test outcomes}; each difference None as
  in `pairs` (outcomes missing or on different problems).
  """
  cells = {}
  for (method, lr, seed), run in runs.items():
    cells.setdefault(lr, {}).setdefault(method, {})[seed] = run
  out = []
  for lr in sorted(cells):
    names = [m for m in method_order(runs, order) if m in cells[lr]]
    for i, a in enumerate(names):
      for b in names[i + 1:]:
        seeds = sorted(set(cells[lr][a]) & set(cells[lr][b]))
        if not seeds:
          continue
        runs_a = [cells[lr][a][s] for s in seeds]
        runs_b = [cells[lr][b][s] for s in seeds]
        out.append({
            "learning_rate": lr, "a": a, "b": b, "seeds": seeds,
            "final_heldout": _paired(runs_a, runs_b, "final_outcomes", "final_outcome_bins"),
            "final_test": _paired(runs_a, runs_b, "test_outcomes", "test_outcome_bins")})
  return out


def _test_summary(seeds: Sequence[dict]) -> dict:
  """Test-split numbers of one method's seeds at its chosen learning rate: "final_test" and
  "final_test_ood" (mean_interval over seeds; final_test_ood None without OOD bins) and
  "final_test_bins" ({bin: mean_interval}); all None unless every seed has test outcomes."""
  if any(r.get("final_test") is None for r in seeds):
    return {"final_test": None, "final_test_bins": None, "final_test_ood": None}
  bins = sorted(seeds[0]["final_test_bins"])
  return {
      "final_test": mean_interval([r["final_test"] for r in seeds]),
      "final_test_bins": {b: mean_interval([r["final_test_bins"][b] for r in seeds])
                          for b in bins},
      "final_test_ood": (mean_interval([r["final_test_ood"] for r in seeds])
                         if all(r["final_test_ood"] is not None for r in seeds) else None),
  }


def summarise(runs: dict, budget: int, order: Sequence[str] = ()) -> dict:
  """Per-method summary of {(method, lr, seed): run}; uniform and SEC at their best rate.

  The target is the tuned uniform baseline's final held-out accuracy (mean over seeds). For each
  method and seed, rollouts to target = the first evaluation at or above it (None if never,
  "per_seed_rollouts_to_target"); the method's "rollouts_to_target" is the restricted mean over
  all its seeds, a seed that never reached the target counted as the whole budget
  (`rollouts_to_target`), with how many seeds reached it and how many are censored. The summary
  lists the methods named in `order` first, in that order, then the others in the order `runs`
  first names them; "pairs" compares every two of them (`pairs`), "matched_pairs" every two at
  each learning rate they share (`matched_pairs`).

  Each method's learning rate is the one of highest mean final held-out accuracy over its seeds,
  i.e. chosen on the validation split (a tie goes to the lower rate). The test split is then read
  at that rate only: per method "final_test", "final_test_bins" and "final_test_ood"
  (`_test_summary`, None unless every seed has test outcomes), and "split" says which split the
  summary can report as its final numbers: "test" when every run of every method's chosen rate
  has test outcomes, "validation" otherwise.
  """
  by_method_lr = {}
  for (method, lr, seed), run in runs.items():
    by_method_lr.setdefault((method, lr), {})[seed] = run
  best_lr = {}
  for (method, lr), seeds in by_method_lr.items():
    score = float(np.mean([r["final_heldout"] for r in seeds.values()]))
    if (method not in best_lr or score > best_lr[method][1]
        or (score == best_lr[method][1] and lr < best_lr[method][0])):
      best_lr[method] = (lr, score)
  if "uniform" not in best_lr:
    raise ValueError("the comparison needs the uniform baseline's runs")
  sweep = {m: {f"{lr:g}": float(np.mean([r["final_heldout"] for r in s.values()]))
               for (mm, lr), s in by_method_lr.items() if mm == m}
           for m in best_lr}
  uniform = by_method_lr[("uniform", best_lr["uniform"][0])]
  target = float(np.mean([r["final_heldout"] for r in uniform.values()]))
  methods = {}
  for method in method_order(runs, order):
    lr = best_lr[method][0]
    seeds = by_method_lr[(method, lr)]
    reach = {s: first_reaching(r["rollouts"], r["heldout"], target) for s, r in seeds.items()}
    times = rollouts_to_target([reach[s] for s in sorted(reach)], budget)
    restricted = times["restricted"]["mean"]
    bins = sorted(next(iter(seeds.values()))["final_bins"])
    rollouts = next(iter(seeds.values()))["rollouts"]
    curve = np.mean([r["heldout"] for r in seeds.values()], axis=0)
    methods[method] = {
        "learning_rate": lr,
        "seeds": sorted(seeds),
        # Restricted mean over all seeds, a censored seed counted as the budget.
        "rollouts_to_target": times["restricted"],
        "rollouts_to_target_fraction": restricted / budget,
        "rollouts_to_target_censored": times["censored"],
        "rollouts_to_target_median": times["median"],
        "reached_fraction": times["reached"],
        "seeds_reaching_target": len(seeds) - times["censored"],
        "per_seed_rollouts_to_target": {str(s): v for s, v in sorted(reach.items())},
        "steps_to_target": restricted / seeds[min(seeds)]["rollouts_per_step"],
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
        **_test_summary(list(seeds.values())),
        "arm_probs_mean": (np.mean([r["arm_probs"] for r in seeds.values()], axis=0).tolist()
                           if all(r["arm_probs"] for r in seeds.values()) else []),
    }
  goal = None
  if "sec" in methods:
    sec, uni = methods["sec"], methods["uniform"]
    # Uniform's censored seeds count as the budget, below their true time: its restricted mean
    # is a lower bound of its mean time to the target, which SEC has to beat.
    rollouts_met = bool(sec["seeds_reaching_target"] == len(sec["seeds"])
                        and sec["rollouts_to_target"]["mean"] <= 0.6 * budget
                        # one seed gives a point, not an interval: nothing to compare
                        and min(sec["rollouts_to_target"]["n"], uni["rollouts_to_target"]["n"]) >= 2
                        and sec["rollouts_to_target"]["hi"] < uni["rollouts_to_target"]["lo"])
    goal = {
        "sec_rollouts_fraction_of_budget": sec["rollouts_to_target_fraction"],
        "uniform_rollouts_fraction_of_budget": uni["rollouts_to_target_fraction"],
        "sec_seeds_reaching": sec["seeds_reaching_target"],
        "met": rollouts_met,
        "rule": "every SEC seed reaches the tuned uniform final accuracy, in at most 0.6x the "
                "budget on average, and SEC's 95% interval of rollouts-to-target lies below "
                "uniform's (a uniform seed that never reaches it counted as the whole budget), "
                "each from at least two seeds",
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
  tuned = {m: by_method_lr[(m, methods[m]["learning_rate"])] for m in methods}
  tested = all(r.get("final_test") is not None for s in tuned.values() for r in s.values())
  return {"target_heldout": target, "start_heldout": start, "pairs": pairs(tuned, methods, budget),
          "matched_pairs": matched_pairs(runs, order),
          "split": "test" if tested else "validation",
          # A target the warm start already meets makes rollouts-to-target 0 for every method.
          "target_above_start": None if start is None else bool(target > start + 1e-9),
          "budget_rollouts": budget, "lr_sweep": sweep,
          "methods": methods, "sec_goal": goal}
