"""experiments/compare_curricula.py: its statistics, its equal-budget plan and a toy comparison."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from configs import compare
from experiments import compare_curricula as cc
from rl_curriculum.train import builders

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("values", [[0.2, 0.4], [1.0, 2.0, 4.0, 8.0], list(np.linspace(0, 1, 12)),
                                    list(np.arange(40.0))])
def test_mean_interval_is_the_student_t_interval(values):
  got = cc.mean_interval(values)
  n = len(values)
  mean = sum(values) / n
  sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
  t = stats.t.ppf(0.975, n - 1) if n <= 31 else 1.96  # beyond 30 dof the script uses 1.96
  assert got["n"] == n
  assert got["mean"] == pytest.approx(mean, abs=1e-12)
  # The script's quantile table has three decimals.
  assert got["hi"] - mean == pytest.approx(t * sd / n ** 0.5, rel=2e-4)
  assert mean - got["lo"] == pytest.approx(got["hi"] - mean, rel=1e-12)


def test_mean_interval_edge_cases():
  assert cc.mean_interval([3.0]) == {"mean": 3.0, "lo": 3.0, "hi": 3.0, "n": 1}
  with pytest.raises(ValueError):
    cc.mean_interval([])


def test_first_reaching():
  xs, ys = [0, 10, 20, 30], [0.1, 0.3, 0.29, 0.5]
  assert cc.first_reaching(xs, ys, 0.3) == 10
  assert cc.first_reaching(xs, ys, 0.4) == 30
  assert cc.first_reaching(xs, ys, 0.6) is None
  assert cc.first_reaching(xs, ys, 0.0) == 0


def _run(curve, *, per_step=10, signal=0.5, wall=1.0, ood=0.0, tasks=None):
  """A run's record as `_read_run` gives it; `tasks`: {task: per-task curve} of a run on several
  tasks."""
  steps = list(range(len(curve)))
  rollouts = [s * per_step for s in steps]
  tasks = tasks or {}
  now = {t: c[-1] for t, c in tasks.items()}
  gains = [c[-1] - c[0] for c in tasks.values()]
  return {"steps": steps, "rollouts": rollouts, "heldout": list(curve),
          "auc": cc.curve_area(rollouts, curve),
          "final_tasks": now, "start_tasks": {t: c[0] for t, c in tasks.items()},
          "min_task_gain": min(gains) if gains else None,
          "task_spread": max(now.values()) - min(now.values()) if now else None,
          "task_curves": {t: list(c) for t, c in tasks.items()},
          "final_bins": {"a": curve[-1], "b": 0.0}, "final_heldout": curve[-1],
          "start_heldout": curve[0],
          "final_ood": ood, "signal_frac": signal, "mixed_frac": signal / 2, "wall_s": wall,
          "arm_probs": [],
          "rollouts_per_step": per_step}


def test_curve_area_is_the_trapezoid_mean_and_binomial_se():
  # Trapezoids over [0, 10, 30]: (0 + 0.4) / 2 * 10 + (0.4 + 0.8) / 2 * 20 = 14, over 30.
  assert cc.curve_area([0, 10, 30], [0.0, 0.4, 0.8]) == pytest.approx(14 / 30, abs=1e-12)
  assert cc.curve_area([5], [0.3]) == 0.3
  # A method that reaches the same final accuracy sooner holds more area.
  assert cc.curve_area([0, 1, 2], [0.0, 0.5, 0.5]) > cc.curve_area([0, 1, 2], [0.0, 0.0, 0.5])
  with pytest.raises(ValueError):
    cc.curve_area([0, 1], [0.1])
  assert cc.binomial_se(0.5, 100) == pytest.approx(0.05, abs=1e-12)
  assert cc.binomial_se(0.0, 100) == 0.0


def test_summarise_tunes_the_baseline_and_measures_rollouts_to_its_accuracy():
  budget = 40  # 4 steps of 10 rollouts
  runs = {
      # Uniform: 2e-5 ends at 0.5 and 0.7 (mean 0.6), better than 4e-5 (mean 0.45).
      ("uniform", 2e-5, 1): _run([0.0, 0.2, 0.4, 0.5, 0.5]),
      ("uniform", 2e-5, 2): _run([0.0, 0.3, 0.5, 0.6, 0.7]),
      ("uniform", 4e-5, 1): _run([0.0, 0.2, 0.4, 0.4, 0.4]),
      ("uniform", 4e-5, 2): _run([0.0, 0.3, 0.4, 0.5, 0.5]),
      # SEC reaches 0.6 after one step in both seeds.
      ("sec", 2e-5, 1): _run([0.0, 0.6, 0.7, 0.7, 0.8]),
      ("sec", 2e-5, 2): _run([0.0, 0.65, 0.7, 0.7, 0.8]),
      # Another method that never gets there.
      ("dump", 2e-5, 1): _run([0.0, 0.1, 0.1, 0.2, 0.3]),
      ("dump", 2e-5, 2): _run([0.0, 0.1, 0.2, 0.2, 0.2]),
  }
  s = cc.summarise(runs, budget)
  assert s["target_heldout"] == pytest.approx(0.6)
  uni, sec, dump = (s["methods"][m] for m in ("uniform", "sec", "dump"))
  assert uni["learning_rate"] == 2e-5
  assert s["lr_sweep"]["uniform"] == {"2e-05": pytest.approx(0.6), "4e-05": pytest.approx(0.45)}
  # Uniform: seed 1 never reaches 0.6 (max 0.5); seed 2 at step 3 = 30 rollouts.
  assert uni["per_seed_rollouts_to_target"] == {"1": None, "2": 30.0}
  assert uni["seeds_reaching_target"] == 1
  assert sec["per_seed_rollouts_to_target"] == {"1": 10.0, "2": 10.0}
  assert sec["rollouts_to_target_fraction"] == pytest.approx(10 / 40)
  assert sec["steps_to_target"] == pytest.approx(1.0)
  assert dump["rollouts_to_target"] is None and dump["seeds_reaching_target"] == 0
  assert sec["final_heldout"]["mean"] == pytest.approx(0.8)
  np.testing.assert_allclose(sec["curve"]["heldout_mean"], [0.0, 0.625, 0.7, 0.7, 0.8])
  # SEC reached it in 0.25x the budget and its interval ([10, 10]) lies below uniform's ([30, 30]).
  assert s["sec_goal"]["met"]
  assert s["start_heldout"] == 0.0 and s["target_above_start"]
  assert sec["gain_heldout"]["mean"] == pytest.approx(0.8)
  assert "never" in cc.markdown(s, "synthetic")


def test_markdown_reports_the_sweep_only_where_a_method_ran_several_rates():
  swept = cc.summarise({("uniform", 2e-5, 1): _run([0.0, 0.5]),
                        ("uniform", 4e-5, 1): _run([0.0, 0.4]),
                        ("sec", 4e-5, 1): _run([0.0, 0.6])}, 10)
  text = cc.markdown(swept, "synthetic")
  assert ("Learning-rate sweep (final held-out accuracy, mean over seeds): "
          "uniform: 2e-05 -> 50.0%, 4e-05 -> 40.0%\n") in text
  single = cc.summarise({("uniform", 2e-5, 1): _run([0.0, 0.5]),
                         ("sec", 4e-5, 1): _run([0.0, 0.6])}, 10)
  text = cc.markdown(single, "synthetic")
  assert "Learning-rate sweep" not in text
  assert "One learning rate per method, no sweep: uniform 2e-05, sec 4e-05." in text


def test_a_target_the_warm_start_already_meets_is_flagged():
  runs = {("uniform", 2e-5, 1): _run([0.5, 0.4, 0.5]), ("sec", 2e-5, 1): _run([0.5, 0.6, 0.7])}
  s = cc.summarise(runs, 20)
  assert s["target_above_start"] is False
  assert s["methods"]["sec"]["per_seed_rollouts_to_target"] == {"1": 0.0}
  assert "says nothing here" in cc.markdown(s, "synthetic")


def test_a_setting_without_ood_bins_reports_no_ood_accuracy():
  runs = {("uniform", 2e-5, 1): _run([0.1, 0.2], ood=None),
          ("sec", 2e-5, 1): _run([0.1, 0.3], ood=None)}
  s = cc.summarise(runs, 10)
  assert s["methods"]["sec"]["final_ood"] is None
  row = next(line for line in cc.markdown(s, "synthetic").splitlines()
             if line.startswith("| sec |"))
  assert row.split(" | ")[7] == "-"  # the OOD column, after the area under the curve


def test_sec_goal_not_met_when_a_seed_falls_short():
  runs = {("uniform", 2e-5, 1): _run([0.0, 0.5, 0.6]), ("uniform", 2e-5, 2): _run([0.0, 0.5, 0.6]),
          ("sec", 2e-5, 1): _run([0.0, 0.6, 0.6]), ("sec", 2e-5, 2): _run([0.0, 0.4, 0.5])}
  s = cc.summarise(runs, 20)
  assert s["methods"]["sec"]["seeds_reaching_target"] == 1
  assert not s["sec_goal"]["met"]


def test_plan_gives_every_method_the_same_rollouts():
  config = compare.get_config("quickstart")
  budget = cc.default_budget(config)
  todo = cc.plan(config, list(cc.METHODS), 2, budget, [2e-5, 4e-5])
  # Seed by seed: the tuned methods first, then the sweep, then the rest.
  assert [(m, lr) for m, lr, s, _ in todo[:4]] == [("uniform", 2e-5), ("sec", 2e-5),
                                                   ("uniform", 4e-5), ("sec", 4e-5)]
  assert len(todo) == 2 * (len(cc.METHODS) + 2)
  for method, lr, seed, c in todo:
    per_step = builders.sampled_prompts(c) * c.rl.group_size
    assert c.rl.steps * per_step == budget, method
    assert c.rl.seed == seed and c.rl.learning_rate == lr
  by_method = {m: c for m, _, s, c in todo if s == 1}
  assert by_method["dynamic_filtering"].curriculum.filter == "all_equal"
  assert by_method["dynamic_filtering"].rl.steps * 2 == by_method["uniform"].rl.steps
  assert by_method["lp_teacher"].curriculum.name == "alp_teacher"
  # Every method's options are ones its constructor takes.
  for c in by_method.values():
    builders.validate(c)


def test_wall_time_of_a_run_stopped_by_sigterm_is_kept(tmp_path, monkeypatch):
  """A run preempted after 30 s and finished in 10 s more reports 40 s."""
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  outcomes = iter([{"preempted_at": 2}, {}])
  monkeypatch.setattr(loop, "prepare", lambda *args, **kwargs: None)
  monkeypatch.setattr(loop, "train_and_evaluate", lambda config, folder: next(outcomes))
  monkeypatch.setattr(cc, "_link_warm_start",
                      lambda base, folder: os.makedirs(folder, exist_ok=True))
  config = compare.get_config("toy")
  lr = float(config.rl.learning_rate)
  args = ("toy", config, ["uniform"], 1, cc.default_budget(config), [lr], str(tmp_path))
  assert not cc.run_all(*args, log=lambda _: None, clock=iter([100.0, 130.0]).__next__)
  assert cc.run_all(*args, log=lambda _: None, clock=iter([200.0, 210.0]).__next__)
  with open(tmp_path / "toy" / cc.run_name("uniform", 1, lr) / "compare.json") as f:
    assert json.load(f)["wall_s"] == 40.0


def test_settings_are_config_variants_named_by_the_config_argument():
  assert cc.setting_name("configs/compare.py:countdown") == "countdown"
  with pytest.raises(ValueError, match="names no setting"):
    cc.setting_name("configs/compare.py")
  assert compare.get_config("countdown").task.name == "countdown"
  assert cc.default_budget(compare.get_config("quickstart")) == 80 * 16 * 8
  for bad in (None, "nope"):
    with pytest.raises(ValueError, match="quickstart"):
      compare.get_config(bad)


def test_parse_shard():
  assert cc.parse_shard("0/1") == (0, 1) and cc.parse_shard("1/2") == (1, 2)
  for bad in ("2/2", "-1/2", "1", "a/b", "0/0"):
    with pytest.raises(ValueError, match="shard"):
      cc.parse_shard(bad)


@pytest.mark.slow
def test_toy_comparison_end_to_end_and_rerun_skips_finished_runs(tmp_path):
  cmd = [sys.executable, "-m", "experiments.compare_curricula",
         "--config=configs/compare.py:toy", "--methods=uniform,sec", "--seeds=2", "--lr_sweep=2e-5",
         f"--workdir={tmp_path / 'work'}", f"--out={tmp_path / 'out'}"]
  # Two shards share the plan (runs 1, 3 and 2, 4), then the summary is built from both.
  for shard, ran, skipped in (("0/2", "[1/4]", "[2/4]"), ("1/2", "[4/4]", "[3/4]")):
    part = subprocess.run(cmd + [f"--shard={shard}"], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert part.returncode == 0, part.stderr[-3000:]
    assert ran in part.stdout and skipped not in part.stdout
    assert not os.path.exists(tmp_path / "out" / "curricula_toy.json")
  first = subprocess.run(cmd + ["--analyse_only"], capture_output=True, text=True, timeout=900,
                         cwd=ROOT)
  assert first.returncode == 0, first.stderr[-3000:]
  with open(tmp_path / "out" / "curricula_toy.json") as f:
    summary = json.load(f)
  assert set(summary["methods"]) == {"uniform", "sec"}
  for m in summary["methods"].values():
    assert m["seeds"] == [1, 2]
    ci = m["final_heldout"]
    assert ci["lo"] <= ci["mean"] <= ci["hi"] and 0.0 <= ci["mean"] <= 1.0
    assert 0.0 <= m["mixed_frac"]["mean"] <= m["signal_frac"]["mean"] <= 1.0
  assert summary["methods"]["sec"]["arm_probs_mean"]  # SEC logs its arm probabilities
  assert os.path.getsize(tmp_path / "out" / "curricula_toy.png") > 10_000
  # The two seeds differ in their RL randomness (same warm start, other rollouts).
  runs = tmp_path / "work" / "toy"
  logs = [(runs / f"uniform_lr2e-05_s{s}" / "metrics.jsonl").read_text() for s in (1, 2)]
  assert logs[0] != logs[1]
  assert os.path.islink(runs / "uniform_lr2e-05_s1" / "sft")  # one shared warm start
  second = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "[1/4]" not in second.stdout  # every run was already finished: nothing re-ran
  assert [(runs / f"uniform_lr2e-05_s{s}" / "metrics.jsonl").read_text()
          for s in (1, 2)] == logs


def test_every_curriculum_and_filter_is_a_method_by_name():
  config = compare.get_config("toy")
  budget = 4 * config.rl.prompts_per_step * config.rl.group_size
  filters = [f for f in builders.FILTERS if f != "none"]
  assert set(builders.CURRICULA) | set(filters) <= set(cc.ALL_METHODS)
  for method in cc.ALL_METHODS:
    if method == "sec_tasks":  # needs several tasks: test_sec_over_tasks_is_sec_with_an_arm_...
      continue
    c = cc.run_config(config, method, seed=1, budget=budget)
    builders.validate(c)
    if method in builders.CURRICULA:
      assert (c.curriculum.name, c.curriculum.filter) == (method, "none")
    elif method in filters:
      assert (c.curriculum.name, c.curriculum.filter) == ("uniform", method)
      assert c.rl.steps * 2 == 4  # twice the prompts rolled out per step: half the steps
  with pytest.raises(ValueError, match="unknown method 'sudoku'"):
    cc.run_config(config, "sudoku", seed=1, budget=budget)


def test_summary_of_several_tasks_reports_skill_balance_and_its_goal():
  budget = 20
  runs = {
      # Uniform improves countdown only: the smallest gain is zebra's 0.
      ("uniform", 2e-5, 1): _run([0.3, 0.4, 0.5], tasks={"countdown": [0.2, 0.4, 0.6],
                                                         "zebra": [0.4, 0.4, 0.4]}),
      ("uniform", 2e-5, 2): _run([0.3, 0.4, 0.5], tasks={"countdown": [0.2, 0.4, 0.6],
                                                         "zebra": [0.4, 0.4, 0.4]}),
      # SEC reaches uniform's 0.5 at 10 rollouts and raises both tasks.
      ("sec", 2e-5, 1): _run([0.3, 0.5, 0.6], tasks={"countdown": [0.2, 0.5, 0.6],
                                                     "zebra": [0.4, 0.5, 0.6]}),
      ("sec", 2e-5, 2): _run([0.3, 0.5, 0.6], tasks={"countdown": [0.2, 0.5, 0.6],
                                                     "zebra": [0.4, 0.6, 0.5]}),
  }
  s = cc.summarise(runs, budget)
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
  text = cc.markdown(s, "synthetic")
  assert "min per-task gain" in text and "| sec | 60.0 [60.0, 60.0] | 55.0" in text
  assert "Standard error" not in text  # no held-out sizes, no standard errors
  s.update(bin_se={"a": cc.binomial_se(0.1, 400), "b": 0.0},
           held_out_sizes={"a": 400, "b": 100, "unused": 4})
  text = cc.markdown(s, "synthetic")
  # sqrt(0.1 * 0.9 / 400) = 1.5 points; the worst case is at p = 0.5 on the smaller set (n = 100).
  assert "a 1.5 (n = 400), b 0.0 (n = 100). At most 5.0 points (p = 0.5)" in text
  # Once another method balances the tasks better, the goal is not met.
  runs[("dump", 2e-5, 1)] = _run([0.3, 0.5, 0.6], tasks={"countdown": [0.2, 0.5, 0.6],
                                                         "zebra": [0.4, 0.6, 0.7]})
  runs[("dump", 2e-5, 2)] = runs[("dump", 2e-5, 1)]
  goal = cc.summarise(runs, budget)["sec_goal"]
  assert goal["best_min_task_gain"] == "dump" and not goal["met"]


def test_sec_over_tasks_is_sec_with_an_arm_per_task():
  config = compare.get_config("multitask")
  c = cc.run_config(config, "sec_tasks", seed=1, budget=cc.default_budget(config))
  assert (c.curriculum.name, c.curriculum.arms) == ("sec", "task")
  assert dict(c.curriculum.options) == dict(config.curriculum.options)
  assert cc.run_config(config, "sec", seed=1, budget=1000).curriculum.arms == "bin"
  builders.validate(c)
  # On one task there are no tasks to make arms of.
  with pytest.raises(builders.ConfigError, match="config.curriculum.arms"):
    builders.validate(cc.run_config(compare.get_config("toy"), "sec_tasks", seed=1, budget=64))


@pytest.mark.parametrize("setting", compare.VARIANTS)
def test_every_setting_is_a_valid_config(setting):
  builders.validate(compare.get_config(setting))


def test_countdown_without_the_bonus_differs_from_countdown_only_in_the_bonus():
  plain, nobonus = compare.get_config("countdown"), compare.get_config("countdown_nobonus")
  assert plain.task.format_bonus > 0 and nobonus.task.format_bonus == 0.0
  nobonus.task.format_bonus = plain.task.format_bonus
  assert nobonus.to_dict() == plain.to_dict()
