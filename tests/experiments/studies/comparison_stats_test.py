"""experiments/studies/comparison_stats.py: intervals, curve areas, crossings and the per-method
summary of synthetic runs (with what the report says of it)."""

import json
import os

import numpy as np
import pytest
from scipy import stats

from experiments.studies import comparison_report as cr
from experiments.studies import comparison_stats as cs
from rl_curriculum.train.report import paired
from rl_curriculum.train.report import summary as run_summary


@pytest.mark.parametrize("values", [[0.2, 0.4], [1.0, 2.0, 4.0, 8.0], list(np.linspace(0, 1, 12)),
                                    list(np.arange(40.0))])
def test_mean_interval_is_the_student_t_interval(values):
  got = cs.mean_interval(values)
  n = len(values)
  mean = sum(values) / n
  sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
  t = stats.t.ppf(0.975, n - 1) if n <= 31 else 1.96  # beyond 30 dof mean_interval uses 1.96
  assert got["n"] == n
  assert got["mean"] == pytest.approx(mean, abs=1e-12)
  # mean_interval's quantile table has three decimals.
  assert got["hi"] - mean == pytest.approx(t * sd / n ** 0.5, rel=2e-4)
  assert mean - got["lo"] == pytest.approx(got["hi"] - mean, rel=1e-12)


def test_mean_interval_edge_cases():
  assert cs.mean_interval([3.0]) == {"mean": 3.0, "lo": 3.0, "hi": 3.0, "n": 1}
  with pytest.raises(ValueError):
    cs.mean_interval([])


def test_first_reaching():
  xs, ys = [0, 10, 20, 30], [0.1, 0.3, 0.29, 0.5]
  assert cs.first_reaching(xs, ys, 0.3) == 10
  assert cs.first_reaching(xs, ys, 0.4) == 30
  assert cs.first_reaching(xs, ys, 0.6) is None
  assert cs.first_reaching(xs, ys, 0.0) == 0


def test_curve_area_is_the_trapezoid_mean_and_binomial_se():
  # Trapezoids over [0, 10, 30]: (0 + 0.4) / 2 * 10 + (0.4 + 0.8) / 2 * 20 = 14, over 30.
  assert cs.curve_area([0, 10, 30], [0.0, 0.4, 0.8]) == pytest.approx(14 / 30, abs=1e-12)
  assert cs.curve_area([5], [0.3]) == 0.3
  # A method that reaches the same final accuracy sooner holds more area.
  assert cs.curve_area([0, 1, 2], [0.0, 0.5, 0.5]) > cs.curve_area([0, 1, 2], [0.0, 0.0, 0.5])
  with pytest.raises(ValueError):
    cs.curve_area([0, 1], [0.1])
  assert cs.binomial_se(0.5, 100) == pytest.approx(0.05, abs=1e-12)
  assert cs.binomial_se(0.0, 100) == 0.0


def test_summarise_tunes_the_baseline_and_measures_rollouts_to_its_accuracy(run_record):
  budget = 40  # 4 steps of 10 rollouts
  runs = {
      # Uniform: 2e-5 ends at 0.5 and 0.7 (mean 0.6), better than 4e-5 (mean 0.45).
      ("uniform", 2e-5, 1): run_record([0.0, 0.2, 0.4, 0.5, 0.5]),
      ("uniform", 2e-5, 2): run_record([0.0, 0.3, 0.5, 0.6, 0.7]),
      ("uniform", 4e-5, 1): run_record([0.0, 0.2, 0.4, 0.4, 0.4]),
      ("uniform", 4e-5, 2): run_record([0.0, 0.3, 0.4, 0.5, 0.5]),
      # SEC reaches 0.6 after one step in both seeds.
      ("sec", 2e-5, 1): run_record([0.0, 0.6, 0.7, 0.7, 0.8]),
      ("sec", 2e-5, 2): run_record([0.0, 0.65, 0.7, 0.7, 0.8]),
      # Another method that never gets there.
      ("dump", 2e-5, 1): run_record([0.0, 0.1, 0.1, 0.2, 0.3]),
      ("dump", 2e-5, 2): run_record([0.0, 0.1, 0.2, 0.2, 0.2]),
  }
  s = cs.summarise(runs, budget)
  assert s["target_heldout"] == pytest.approx(0.6)
  uni, sec, dump = (s["methods"][m] for m in ("uniform", "sec", "dump"))
  assert uni["learning_rate"] == 2e-5
  assert s["lr_sweep"]["uniform"] == {"2e-05": pytest.approx(0.6), "4e-05": pytest.approx(0.45)}
  # Uniform: seed 1 never reaches 0.6 (max 0.5), counted as the budget; seed 2 at step 3 = 30.
  assert uni["per_seed_rollouts_to_target"] == {"1": None, "2": 30.0}
  assert uni["seeds_reaching_target"] == 1 and uni["rollouts_to_target_censored"] == 1
  assert uni["rollouts_to_target"]["mean"] == pytest.approx(35.0)
  assert uni["rollouts_to_target_median"] is None   # only half the seeds reached it
  assert sec["per_seed_rollouts_to_target"] == {"1": 10.0, "2": 10.0}
  assert sec["rollouts_to_target_fraction"] == pytest.approx(10 / 40)
  assert sec["steps_to_target"] == pytest.approx(1.0)
  assert sec["rollouts_to_target_censored"] == 0 and sec["rollouts_to_target_median"] == 10.0
  # No dump seed gets there: both count as the budget, and the report says "never".
  assert dump["seeds_reaching_target"] == 0 and dump["rollouts_to_target_censored"] == 2
  assert dump["rollouts_to_target"] == {"mean": 40.0, "lo": 40.0, "hi": 40.0, "n": 2}
  assert dump["reached_fraction"] == 0.0
  assert sec["final_heldout"]["mean"] == pytest.approx(0.8)
  np.testing.assert_allclose(sec["curve"]["heldout_mean"], [0.0, 0.625, 0.7, 0.7, 0.8])
  # SEC reached it in 0.25x the budget, but uniform's two seeds (30 and, censored, 40) leave an
  # interval of 35 +- 12.706 * 5 = [-28.5, 98.5] that SEC's [10, 10] does not lie below, so the
  # goal is not met (the multi-task test below meets it).
  assert uni["rollouts_to_target"]["n"] == 2 and sec["rollouts_to_target"]["n"] == 2
  assert uni["rollouts_to_target"]["lo"] == pytest.approx(35 - 12.706 * 5)
  assert not s["sec_goal"]["met"]
  assert s["start_heldout"] == 0.0 and s["target_above_start"]
  assert sec["gain_heldout"]["mean"] == pytest.approx(0.8)
  assert "never" in cr.markdown(s, "synthetic")


def test_summarise_lists_the_methods_in_the_given_order_then_as_runs_name_them(run_record):
  runs = {("dump", 2e-5, 1): run_record([0.0, 0.2]), ("uniform", 2e-5, 1): run_record([0.0, 0.5]),
          ("sec", 2e-5, 1): run_record([0.0, 0.6])}
  assert list(cs.summarise(runs, 10)["methods"]) == ["dump", "uniform", "sec"]
  assert list(cs.summarise(runs, 10, ("sec", "uniform"))["methods"]) == ["sec", "uniform", "dump"]


def test_pairs_compare_every_two_methods_per_problem_and_their_rollouts_to_target(run_record):
  rng = np.random.default_rng(1)
  bins = np.repeat([0, 1], 150)
  chance = {"uniform": 0.5, "sec": 0.65, "dump": 0.5}
  outcomes = {(m, s): (rng.random(300) < chance[m]).astype(float)
              for m in chance for s in (1, 2, 3)}
  # The target is uniform's mean final accuracy, 0.502: its seed 1 (0.501) never reaches it;
  # sec's seed 1 does after 10 rollouts, the others after 20; every dump seed after 20.
  curves = {("uniform", s): [0.0, 0.3, 0.5 + 0.001 * s] for s in (1, 2, 3)}
  curves.update({("sec", s): [0.0, 0.6 if s == 1 else 0.5, 0.65] for s in (1, 2, 3)})
  curves.update({("dump", s): [0.0, 0.4, 0.55] for s in (1, 2, 3)})
  runs = {(m, 2e-5, s): run_record(curves[(m, s)], outcomes=(outcomes[(m, s)], bins))
          for m in chance for s in (1, 2, 3)}
  s = cs.summarise(runs, 20, order=("uniform", "sec", "dump"))
  assert [(p["a"], p["b"]) for p in s["pairs"]] == [("uniform", "sec"), ("uniform", "dump"),
                                                     ("sec", "dump")]
  sec_dump = s["pairs"][2]
  want = paired.paired_difference(np.stack([outcomes[("sec", k)] for k in (1, 2, 3)]),
                                  np.stack([outcomes[("dump", k)] for k in (1, 2, 3)]), bins)
  # 15 points on 300 problems, resolved at the t quantile of 3 + 3 seeds (3.18 here: with so few
  # seeds the seed part's own noise sets the degrees of freedom).
  assert sec_dump["final_heldout"] == want and want["lo"] > 0
  # Uniform's seed 1 never reaches it: it counts as the budget, 20, and the pair has an interval.
  assert s["pairs"][0]["rollouts_to_target"] == cs.welch_interval([20.0] * 3, [10.0, 20.0, 20.0])
  assert sec_dump["rollouts_to_target"] == cs.welch_interval([10.0, 20.0, 20.0], [20.0] * 3)
  assert sec_dump["rollouts_to_target"]["mean"] == pytest.approx(-10 / 3)
  text = cr.markdown(s, "synthetic")
  assert "| sec - dump | +" in text and "| a higher |" in text
  # Folders without per-problem outcomes: the pair is listed, its difference not computed.
  bare = {k: {**r, "final_outcomes": None} for k, r in runs.items()}
  assert all(p["final_heldout"] is None for p in cs.summarise(bare, 20)["pairs"])
  assert "no per-problem outcomes" in cr.markdown(cs.summarise(bare, 20), "synthetic")
  # One run evaluated on other problems (a changed eval set): nothing to pair, no error.
  other = dict(runs)
  other[("dump", 2e-5, 2)] = run_record(curves[("dump", 2)],
                                        outcomes=(outcomes[("dump", 2)][:200], bins[:200]))
  got = cs.summarise(other, 20, order=("uniform", "sec", "dump"))["pairs"]
  assert got[0]["final_heldout"] == s["pairs"][0]["final_heldout"]  # uniform - sec: unaffected
  assert got[1]["final_heldout"] is None and got[2]["final_heldout"] is None


def test_rollouts_to_target_counts_a_seed_that_never_reached_it_as_the_budget():
  got = cs.rollouts_to_target([10.0, None, 20.0], budget=40)
  # Times 10, 40 (censored), 20: mean 70 / 3, sample variance (1600 + 2500 + 100) / 9 / 2.
  assert got["restricted"]["mean"] == pytest.approx(70 / 3, abs=1e-12)
  half = 4.303 * (2100 / 9 / 3) ** 0.5    # t_{0.975, 2} sd / sqrt(3)
  assert got["restricted"]["hi"] - 70 / 3 == pytest.approx(half, abs=1e-12)
  assert got["restricted"]["n"] == 3 and got["censored"] == 1
  assert got["reached"] == pytest.approx(2 / 3) and got["median"] == 20.0  # 2 of 3 reached it
  # Half or fewer reached it: the median would be a censored value, so there is none.
  assert cs.rollouts_to_target([10.0, None], 40)["median"] is None
  assert cs.rollouts_to_target([10.0, 30.0, None, 20.0], 40)["median"] == 25.0
  assert cs.rollouts_to_target([None], 40) == {
      "restricted": {"mean": 40.0, "lo": 40.0, "hi": 40.0, "n": 1}, "censored": 1, "reached": 0.0,
      "median": None}
  with pytest.raises(ValueError):
    cs.rollouts_to_target([], 40)


def test_a_pair_with_a_censored_seed_gets_a_welch_interval_of_the_censored_times(run_record):
  # Budget 40 (4 steps of 10). Uniform ends at 0.5 and 0.7: the target is 0.6. Uniform seed 1
  # never reaches it (40, censored), seed 2 at 40; SEC seeds at 10, 20 and never (40).
  runs = {("uniform", 2e-5, 1): run_record([0.0, 0.2, 0.3, 0.4, 0.5]),
          ("uniform", 2e-5, 2): run_record([0.0, 0.3, 0.4, 0.5, 0.7]),
          ("sec", 2e-5, 1): run_record([0.0, 0.6, 0.7, 0.7, 0.7]),
          ("sec", 2e-5, 2): run_record([0.0, 0.5, 0.6, 0.6, 0.7]),
          ("sec", 2e-5, 3): run_record([0.0, 0.3, 0.4, 0.5, 0.55])}
  s = cs.summarise(runs, 40, order=("sec", "uniform"))
  sec = s["methods"]["sec"]
  assert sec["per_seed_rollouts_to_target"] == {"1": 10.0, "2": 20.0, "3": None}
  assert sec["rollouts_to_target"]["mean"] == pytest.approx(70 / 3, abs=1e-12)
  assert sec["rollouts_to_target_censored"] == 1 and sec["seeds_reaching_target"] == 2
  assert sec["rollouts_to_target_fraction"] == pytest.approx(70 / 3 / 40)
  # sec - uniform: [10, 20, 40] against [40, 40]. Uniform has no spread, so the Welch variance is
  # SEC's, 2100 / 27, at 2 degrees of freedom: -50 / 3 +- 4.303 * sqrt(2100 / 27).
  got = s["pairs"][0]["rollouts_to_target"]
  assert got["mean"] == pytest.approx(70 / 3 - 40, abs=1e-12) and got["n"] == [3, 2]
  assert got["hi"] - got["mean"] == pytest.approx(4.303 * (2100 / 27) ** 0.5, abs=1e-12)
  assert not s["sec_goal"]["met"]  # an SEC seed fell short
  assert "| sec - uniform |" in cr.markdown(s, "synthetic")


def test_welch_interval_matches_scipy():
  x, y = [10.0, 20.0, 30.0], [40.0, 45.0, 60.0, 70.0]
  got = cs.welch_interval(x, y)
  res = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
  assert got["mean"] == pytest.approx(np.mean(x) - np.mean(y))
  # The t quantile at the Welch df rounded down: a little wider than scipy's exact one.
  assert got["lo"] <= res.low + 1e-9 and got["hi"] >= res.high - 1e-9
  assert got["hi"] - got["lo"] < 1.15 * (res.high - res.low)
  assert cs.welch_interval([1.0], [2.0, 3.0]) is None


def test_a_target_the_warm_start_already_meets_is_flagged(run_record):
  runs = {("uniform", 2e-5, 1): run_record([0.5, 0.4, 0.5]),
          ("sec", 2e-5, 1): run_record([0.5, 0.6, 0.7])}
  s = cs.summarise(runs, 20)
  assert s["target_above_start"] is False
  assert s["methods"]["sec"]["per_seed_rollouts_to_target"] == {"1": 0.0}
  assert "says nothing here" in cr.markdown(s, "synthetic")


def test_sec_goal_not_met_when_a_seed_falls_short(run_record):
  runs = {("uniform", 2e-5, 1): run_record([0.0, 0.5, 0.6]),
          ("uniform", 2e-5, 2): run_record([0.0, 0.5, 0.6]),
          ("sec", 2e-5, 1): run_record([0.0, 0.6, 0.6]),
          ("sec", 2e-5, 2): run_record([0.0, 0.4, 0.5])}
  s = cs.summarise(runs, 20)
  assert s["methods"]["sec"]["seeds_reaching_target"] == 1
  assert not s["sec_goal"]["met"]


def test_summary_of_several_tasks_reports_skill_balance_and_its_goal(run_record):
  budget = 20
  runs = {
      # Uniform improves countdown only: the smallest gain is zebra's 0.
      ("uniform", 2e-5, 1): run_record([0.3, 0.4, 0.5], tasks={"countdown": [0.2, 0.4, 0.6],
                                                              "zebra": [0.4, 0.4, 0.4]}),
      ("uniform", 2e-5, 2): run_record([0.3, 0.4, 0.5], tasks={"countdown": [0.2, 0.4, 0.6],
                                                              "zebra": [0.4, 0.4, 0.4]}),
      # SEC reaches uniform's 0.5 at 10 rollouts and raises both tasks.
      ("sec", 2e-5, 1): run_record([0.3, 0.5, 0.6], tasks={"countdown": [0.2, 0.5, 0.6],
                                                          "zebra": [0.4, 0.5, 0.6]}),
      ("sec", 2e-5, 2): run_record([0.3, 0.5, 0.6], tasks={"countdown": [0.2, 0.5, 0.6],
                                                          "zebra": [0.4, 0.6, 0.5]}),
  }
  s = cs.summarise(runs, budget)
  uni, sec = s["methods"]["uniform"], s["methods"]["sec"]
  assert uni["min_task_gain"]["mean"] == pytest.approx(0.0)
  assert sec["min_task_gain"]["mean"] == pytest.approx(0.15)  # zebra: +0.2 and +0.1
  assert sec["final_tasks"]["zebra"]["mean"] == pytest.approx(0.55)
  assert sec["gain_tasks"]["countdown"]["mean"] == pytest.approx(0.4)
  assert sec["task_spread"]["mean"] == pytest.approx(0.05)
  np.testing.assert_allclose(sec["task_curves"]["zebra"], [0.4, 0.55, 0.55])
  # AUC: uniform (0.3 + 0.4) / 2 + (0.4 + 0.5) / 2 over 2 = 0.4; SEC 0.475.
  assert uni["auc"]["mean"] == pytest.approx(0.4) and sec["auc"]["mean"] == pytest.approx(0.475)
  goal = s["sec_goal"]
  assert goal["rollouts_met"] and goal["best_min_task_gain"] == "sec" and goal["met"]
  text = cr.markdown(s, "synthetic")
  assert "min per-task gain" in text and "| sec | 60.0 [60.0, 60.0] | 55.0" in text
  assert "Standard error" not in text  # no held-out sizes, no standard errors
  s.update(bin_se={"a": cs.binomial_se(0.1, 400), "b": 0.0},
           held_out_sizes={"a": 400, "b": 100, "unused": 4})
  text = cr.markdown(s, "synthetic")
  # sqrt(0.1 * 0.9 / 400) = 1.5 points; the worst case is at p = 0.5 on the smaller set (n = 100).
  assert "a 1.5 (n = 400), b 0.0 (n = 100). At most 5.0 points (p = 0.5)" in text
  # Once another method balances the tasks better, the goal is not met.
  runs[("dump", 2e-5, 1)] = run_record([0.3, 0.5, 0.6], tasks={"countdown": [0.2, 0.5, 0.6],
                                                              "zebra": [0.4, 0.6, 0.7]})
  runs[("dump", 2e-5, 2)] = runs[("dump", 2e-5, 1)]
  goal = cs.summarise(runs, budget)["sec_goal"]
  assert goal["best_min_task_gain"] == "dump" and not goal["met"]


def _write_run(folder) -> None:
  """A minimal finished run folder: evaluations at steps 0 and 2 on bins a, b (training) and o
  (OOD), RL steps 1 and 2, and the final evaluation's per-problem outcomes (validation)."""
  os.makedirs(folder)
  rows = [{"step": 0, "eval/acc/a": 0.1, "eval/acc/b": 0.2, "eval/acc/o": 0.0},
          {"step": 1, "nonzero_adv_frac": 0.5, "mixed_correct_frac": 0.25},
          {"step": 2, "nonzero_adv_frac": 0.7, "mixed_correct_frac": 0.35,
           "eval/acc/a": 0.5, "eval/acc/b": 0.5, "eval/acc/o": 0.5}]
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(folder, "compare.json"), "w") as f:
    json.dump({"rollouts_per_step": 10, "wall_s": 5.0}, f)
  flags = lambda *x: np.array(x, bool)
  run_summary.write_outcomes(run_summary.outcomes_path(folder, 2),
                             {"a": (flags(1, 0), flags(1, 1)), "b": (flags(0, 1), flags(1, 1)),
                              "o": (flags(1, 0), flags(1, 0))})


def test_read_run_reads_the_test_outcomes_of_the_final_step(tmp_path):
  folder = str(tmp_path / "run")
  _write_run(folder)
  assert cs.test_outcomes_path(folder, 2) == os.path.join(folder, "test", "step_2.npz")
  before = cs.read_run(folder, ["a", "b"], ["o"])
  # Not evaluated on the test split yet: every test field is None, the rest is read as before.
  for key in ("test_outcomes", "test_outcome_bins", "test_ood_outcomes", "test_ood_bins",
              "final_test", "final_test_bins", "final_test_ood"):
    assert before[key] is None, key
  assert before["final_heldout"] == 0.5 and before["steps"] == [0, 2]
  np.testing.assert_array_equal(before["final_outcomes"], [1, 0, 0, 1])
  flags = lambda *x: np.array(x, bool)
  # Bins in another order than train_bin_names, and one ("small") that is in neither list.
  run_summary.write_outcomes(cs.test_outcomes_path(folder, 2), {
      "b": (flags(1, 0), flags(1, 1)), "o": (flags(1, 0, 0, 0), flags(1, 1, 1, 1)),
      "small": (flags(1, 1), flags(1, 1)), "a": (flags(1, 1, 1, 0), flags(1, 1, 1, 1))})
  got = cs.read_run(folder, ["a", "b"], ["o"])
  np.testing.assert_array_equal(got["test_outcomes"], [1, 1, 1, 0, 1, 0])      # a, then b
  np.testing.assert_array_equal(got["test_outcome_bins"], [0, 0, 0, 0, 1, 1])
  np.testing.assert_array_equal(got["test_ood_outcomes"], [1, 0, 0, 0])
  np.testing.assert_array_equal(got["test_ood_bins"], [0, 0, 0, 0])
  assert got["final_test_bins"] == {"a": 0.75, "b": 0.5, "o": 0.25, "small": 1.0}
  assert got["final_test"] == pytest.approx((0.75 + 0.5) / 2) and got["final_test_ood"] == 0.25
  assert got["final_heldout"] == 0.5   # validation numbers unchanged
  np.testing.assert_array_equal(got["final_outcomes"], before["final_outcomes"])
  no_ood = cs.read_run(folder, ["a", "b"], [])
  assert no_ood["test_ood_outcomes"] is None and no_ood["final_test_ood"] is None
  assert no_ood["final_test"] == got["final_test"]
  # A test file without a bin the comparison names is an error, not a run to skip.
  run_summary.write_outcomes(cs.test_outcomes_path(folder, 2), {
      "a": (flags(1, 1, 1, 0), flags(1, 1, 1, 1)), "o": (flags(1, 0, 0, 0), flags(1, 1, 1, 1))})
  with pytest.raises(ValueError, match=r"lack the bins \['b'\]"):
    cs.read_run(folder, ["a", "b"], ["o"])


# Test-split outcomes of two bins of 4 problems and an OOD bin of 2, with hand-checkable means:
# uniform's seeds score (a, b) = (0.5, 0.25) and (0.75, 0.5), 0.375 and 0.625 (mean 0.5); SEC's
# (1, 0.5) and (0.75, 0.75), both 0.75. OOD: uniform 0 and 0.5, SEC 0.5 and 1.
_TEST = {("uniform", 1): ({"a": [1, 1, 0, 0], "b": [1, 0, 0, 0]}, {"o": [0, 0]}),
         ("uniform", 2): ({"a": [1, 1, 1, 0], "b": [1, 1, 0, 0]}, {"o": [1, 0]}),
         ("sec", 1): ({"a": [1, 1, 1, 1], "b": [1, 1, 0, 0]}, {"o": [1, 0]}),
         ("sec", 2): ({"a": [1, 1, 1, 0], "b": [1, 1, 1, 0]}, {"o": [1, 1]})}


def _tested_runs(run_record) -> dict:
  """Uniform at two learning rates (2e-5 the better on validation, 4e-5 perfect on test) and
  SEC at 2e-5, two seeds each, all evaluated on the test split."""
  runs = {("uniform", 2e-5, s): run_record([0.0, 0.4 + 0.1 * s], test=_TEST[("uniform", s)][0],
                                           test_ood=_TEST[("uniform", s)][1]) for s in (1, 2)}
  runs.update({("sec", 2e-5, s): run_record([0.0, 0.6], test=_TEST[("sec", s)][0],
                                            test_ood=_TEST[("sec", s)][1]) for s in (1, 2)})
  runs.update({("uniform", 4e-5, s): run_record([0.0, 0.3], test={"a": [1] * 4, "b": [1] * 4},
                                                test_ood={"o": [1, 1]}) for s in (1, 2)})
  return runs


def test_summarise_reads_the_test_split_at_the_rate_chosen_on_validation(run_record):
  runs = _tested_runs(run_record)
  s = cs.summarise(runs, 10, order=("uniform", "sec"))
  uni, sec = s["methods"]["uniform"], s["methods"]["sec"]
  assert s["split"] == "test"
  # 4e-5 is perfect on test, but 2e-5 is better on validation (0.55 against 0.3): 2e-5 it is.
  assert uni["learning_rate"] == 2e-5
  assert uni["final_test"]["mean"] == pytest.approx(0.5) and uni["final_test"]["n"] == 2
  assert sec["final_test"] == {"mean": 0.75, "lo": 0.75, "hi": 0.75, "n": 2}
  assert sec["final_test_bins"]["a"]["mean"] == pytest.approx(0.875)
  assert sec["final_test_bins"]["b"]["mean"] == pytest.approx(0.625)
  assert sorted(sec["final_test_bins"]) == ["a", "b", "o"]
  assert uni["final_test_ood"]["mean"] == pytest.approx(0.25)
  assert sec["final_test_ood"]["mean"] == pytest.approx(0.75)
  (pair,) = s["pairs"]
  assert (pair["a"], pair["b"]) == ("uniform", "sec")
  stack = lambda m, key: np.stack([runs[(m, 2e-5, k)][key] for k in (1, 2)])
  bins = runs[("sec", 2e-5, 1)]["test_outcome_bins"]
  assert pair["final_test"] == paired.paired_difference(
      stack("uniform", "test_outcomes"), stack("sec", "test_outcomes"), bins)
  assert pair["final_test"]["mean"] == pytest.approx(-0.25)
  boot = pair["final_test_bootstrap"]
  assert boot == paired.bootstrap_difference(stack("uniform", "test_outcomes"),
                                             stack("sec", "test_outcomes"), bins,
                                             draws=2000, seed=0)
  assert boot["mean"] == pytest.approx(-0.25) and boot["draws"] == 2000
  assert pair["final_test_ood"]["mean"] == pytest.approx(-0.5)
  assert pair["final_heldout"] is None   # these records kept no validation outcomes
  # The unchosen rate's runs need no test outcomes ...
  runs[("uniform", 4e-5, 1)] = run_record([0.0, 0.3])
  assert cs.summarise(runs, 10)["split"] == "test"
  # ... but every seed of a chosen rate does: otherwise the summary stays on validation.
  runs[("uniform", 2e-5, 2)] = run_record([0.0, 0.6])
  s = cs.summarise(runs, 10, order=("uniform", "sec"))
  assert s["split"] == "validation"
  uni = s["methods"]["uniform"]
  assert uni["final_test"] is None and uni["final_test_bins"] is None
  assert uni["final_test_ood"] is None
  assert s["methods"]["sec"]["final_test"]["mean"] == pytest.approx(0.75)
  pair = s["pairs"][0]
  assert pair["final_test"] is None and pair["final_test_bootstrap"] is None
  assert pair["final_test_ood"] is None


def test_a_tie_on_validation_goes_to_the_lower_learning_rate(run_record):
  runs = {("uniform", 4e-5, 1): run_record([0.0, 0.5]),
          ("uniform", 2e-5, 1): run_record([0.0, 0.5]),
          ("sec", 4e-5, 1): run_record([0.0, 0.6]), ("sec", 1e-5, 1): run_record([0.0, 0.6])}
  s = cs.summarise(runs, 10)
  assert s["methods"]["uniform"]["learning_rate"] == 2e-5
  assert s["methods"]["sec"]["learning_rate"] == 1e-5


def test_matched_pairs_compare_methods_at_a_shared_rate_on_their_common_seeds(run_record):
  rng = np.random.default_rng(2)
  bins = np.repeat([0, 1], 20)
  draw = lambda: (rng.random(40) < 0.5).astype(float)
  val = {k: draw() for k in [("uniform", 1), ("uniform", 2), ("uniform", 3), ("sec", 1),
                             ("sec", 2)]}
  test = {k: draw() for k in val}
  record = lambda m, s, curve: run_record(curve, outcomes=(val[(m, s)], bins),
                                          test={"a": test[(m, s)][:20], "b": test[(m, s)][20:]})
  runs = {("uniform", 2e-5, s): record("uniform", s, [0.0, 0.5]) for s in (1, 2, 3)}
  runs.update({("sec", 2e-5, s): record("sec", s, [0.0, 0.6]) for s in (1, 2)})
  # At 4e-5 uniform ran seed 2 and SEC seed 1 only: no common seed, no pair; at 8e-5 uniform
  # alone: nothing to compare.
  runs[("uniform", 4e-5, 2)] = record("uniform", 2, [0.0, 0.4])
  runs[("sec", 4e-5, 1)] = record("sec", 1, [0.0, 0.4])
  runs[("uniform", 8e-5, 1)] = record("uniform", 1, [0.0, 0.3])
  got = cs.matched_pairs(runs, ("sec", "uniform"))
  assert [(p["learning_rate"], p["a"], p["b"], p["seeds"]) for p in got] == [
      (2e-5, "sec", "uniform", [1, 2])]
  stack = lambda d, m: np.stack([d[(m, s)] for s in (1, 2)])
  want = paired.paired_difference(stack(val, "sec"), stack(val, "uniform"), bins)
  assert got[0]["final_heldout"] == want
  # Uniform's seed 3, which SEC did not run, is left out.
  with_3 = paired.paired_difference(stack(val, "sec"),
                                    np.stack([val[("uniform", s)] for s in (1, 2, 3)]), bins)
  assert with_3 != want
  assert got[0]["final_test"] == paired.paired_difference(stack(test, "sec"),
                                                          stack(test, "uniform"), bins)
  # Without an order the methods come as the runs first name them; summarise keeps the same.
  assert [(p["a"], p["b"]) for p in cs.matched_pairs(runs)] == [("uniform", "sec")]
  assert cs.summarise(runs, 10, ("sec", "uniform"))["matched_pairs"] == got
  # Runs without test outcomes: the validation contrast alone.
  bare = {k: {**r, "test_outcomes": None} for k, r in runs.items()}
  (only,) = cs.matched_pairs(bare, ("sec", "uniform"))
  assert only["final_test"] is None and only["final_heldout"] == want
