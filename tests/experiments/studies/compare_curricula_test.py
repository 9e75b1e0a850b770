"""experiments/studies/compare_curricula.py: its methods and settings, its equal-budget plan, its
shards and a toy comparison."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import compare
from experiments.studies import compare_curricula as cc
from experiments.studies import comparison_stats, test_evaluation
from rl_curriculum.train.report import summary as run_summary
from rl_curriculum.train.setup import data
from rl_curriculum.train.setup import builders
from rl_curriculum.train.setup import validation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_plan_gives_every_method_the_same_rollouts():
  config = compare.get_config("scratch")
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
    validation.validate(c)


def test_a_learning_rate_grid_gives_each_method_its_own_rates():
  grid = cc.parse_lr_grid(["uniform:1e-5/2e-5", "learnability:4e-5"])
  assert grid == {"uniform": [1e-5, 2e-5], "learnability": [4e-5]}
  config = compare.get_config("countdown_prereg")
  todo = cc.plan(config, ["uniform", "sec", "learnability"], 2, cc.default_budget(config), [],
                 grid)
  # Seed by seed, each method at each rate of its grid; sec has none: the setting's rate.
  assert [(m, lr, s) for m, lr, s, _ in todo[:4]] == [
      ("uniform", 1e-5, 1), ("uniform", 2e-5, 1), ("sec", config.rl.learning_rate, 1),
      ("learnability", 4e-5, 1)]
  assert len(todo) == 8 and todo[4][2] == 2
  assert todo[3][3].curriculum.name == "learnability" and todo[3][3].rl.learning_rate == 4e-5
  for bad in (["uniform"], ["uniform:"], ["uniform:fast"], ["uniform:-1e-5"],
              ["uniform:1e-5", "uniform:2e-5"]):
    with pytest.raises(ValueError, match="lr_grid"):
      cc.parse_lr_grid(bad)


def test_wall_time_of_a_run_stopped_by_sigterm_is_kept(tmp_path, monkeypatch):
  """A run preempted after 30 s and finished in 10 s more reports 40 s."""
  from rl_curriculum.train import loop
  from rl_curriculum.train.setup import prepare  # pylint: disable=import-outside-toplevel
  outcomes = iter([{"preempted_at": 2}, {}])
  monkeypatch.setattr(prepare, "prepare", lambda *args, **kwargs: None)
  monkeypatch.setattr(loop, "train_and_evaluate", lambda config, folder: next(outcomes))
  monkeypatch.setattr(cc.warm_start, "link_caches",
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
  assert cc.default_budget(compare.get_config("scratch")) == 80 * 16 * 8
  for bad in (None, "nope"):
    with pytest.raises(ValueError, match="scratch"):
      compare.get_config(bad)


def test_test_ood_bins_takes_evaluation_only_bins_the_runs_do_not_evaluate():
  config = compare.get_config("toy")  # arithmetic, eval_bins (0, 2, 8); 8-11 evaluation-only
  assert cc.test_ood_bins(config, ["mul_2d_2d", "mix5_1d"]) == (9, 11)
  assert cc.test_ood_bins(config, []) == ()
  with pytest.raises(ValueError, match="no bins of the task"):
    cc.test_ood_bins(config, ["n3_big"])
  for taken in ("add_3d_3d", "add_2d_1d"):  # evaluated by the runs / a training bin
    with pytest.raises(ValueError, match="evaluation-only bins the runs do not evaluate"):
      cc.test_ood_bins(config, [taken])


def test_parse_shard():
  assert cc.parse_shard("0/1") == (0, 1) and cc.parse_shard("1/2") == (1, 2)
  for bad in ("2/2", "-1/2", "1", "a/b", "0/0"):
    with pytest.raises(ValueError, match="shard"):
      cc.parse_shard(bad)


@pytest.mark.slow
def test_toy_comparison_end_to_end_and_rerun_skips_finished_runs(tmp_path):
  cmd = [sys.executable, "-m", "experiments.studies.compare_curricula",
         "--config=configs/compare.py:toy", "--methods=uniform,sec", "--seeds=2", "--lr_sweep=2e-5",
         f"--workdir={tmp_path / 'work'}", f"--out={tmp_path / 'out'}",
         "--config.task.held_out_split=validation"]  # the runs evaluate on validation sets
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
  # The runs kept their per-problem outcomes: the pair's difference is paired per problem, and
  # its mean is the difference of the methods' mean final accuracies.
  [pair] = summary["pairs"]
  diff = pair["final_heldout"]
  assert {pair["a"], pair["b"]} == {"uniform", "sec"} and diff["seeds"] == [2, 2]
  assert diff["mean"] == pytest.approx(summary["methods"][pair["a"]]["final_heldout"]["mean"]
                                       - summary["methods"][pair["b"]]["final_heldout"]["mean"])
  assert diff["lo"] <= diff["mean"] <= diff["hi"]
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
  assert summary["split"] == "validation" and summary["methods"]["sec"]["final_test"] is None
  # Then the test split, once per run, in two shards that summarise nothing: the same problems
  # for every run, none of them in the runs' validation sets.
  # Shard 0 also evaluates the warm start (the base folder, step 0).
  for shard, evaluated in (("0/2", 3), ("1/2", 2)):
    tested = subprocess.run(cmd + ["--analyse_only", "--test_per_bin=8", f"--shard={shard}"],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert tested.stdout.count("test split at step") == evaluated
  assert os.path.exists(comparison_stats.test_outcomes_path(str(runs / "base"), 0))
  with open(tmp_path / "out" / "curricula_toy.json") as f:
    assert json.load(f)["split"] == "validation"
  final = {s: json.load(open(runs / f"uniform_lr2e-05_s{s}" / "compare.json"))["steps"]
           for s in (1, 2)}
  tests = [run_summary.read_outcomes(comparison_stats.test_outcomes_path(
      str(runs / f"{m}_lr2e-05_s{s}"), final[s])) for m in ("uniform", "sec") for s in (1, 2)]
  assert all(t is not None and list(t) == list(tests[0]) for t in tests)
  # An out-of-distribution bin added to the test split later is evaluated alone; the bins each
  # run answered before are kept as they were, and the new bin is the test split's OOD bin.
  added = subprocess.run(cmd + ["--analyse_only", "--test_per_bin=8", "--test_ood_bins=mix5_1d"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
  assert added.returncode == 0, added.stderr[-3000:]
  logged = [line for line in added.stdout.splitlines() if "test split at step" in line]
  assert len(logged) == 5 and all("mix5_1d" in line and "add_" not in line for line in logged)
  again = [run_summary.read_outcomes(comparison_stats.test_outcomes_path(
      str(runs / f"{m}_lr2e-05_s{s}"), final[s])) for m in ("uniform", "sec") for s in (1, 2)]
  for before, after in zip(tests, again):
    assert list(after) == [*before, "mix5_1d"] and len(after["mix5_1d"][0]) == 8
    for b in before:
      np.testing.assert_array_equal(after[b][0], before[b][0])
  # The summary then reports the test split beside the validation choice.
  with open(tmp_path / "out" / "curricula_toy.json") as f:
    summary = json.load(f)
  assert summary["split"] == "test"
  assert summary["test_ood_bins"] == ["mix5_1d"] and summary["ood_bins"] == ["add_3d_3d"]
  [pair] = summary["pairs"]
  assert pair["final_test"]["n_problems"] == 8 * 2 and pair["final_test"]["seeds"] == [2, 2]
  assert pair["final_test_ood"]["n_problems"] == 8
  base = run_summary.read_outcomes(comparison_stats.test_outcomes_path(str(runs / "base"), 0))
  assert summary["start_test"]["ood"] == pytest.approx(np.mean(base["mix5_1d"][0]))
  assert summary["start_test"]["mean"] == pytest.approx(
      np.mean([np.mean(base[b][0]) for b in ("add_1d_1d", "add_2d_2d")]))
  report = (tmp_path / "out" / "curricula_toy.md").read_text()
  assert "Test split (never used for a choice)" in report and "bins of record: mix5_1d" in report
  sec_ood = [float(np.mean(t["mix5_1d"][0])) for t in again[2:]]
  assert summary["methods"]["sec"]["final_test_ood"]["mean"] == pytest.approx(np.mean(sec_ood))
  config = compare.get_config("toy")
  config.task.held_out_split = "validation"
  task = builders.build_task(config)
  test_prompts = {p.prompt for ps in test_evaluation.test_sets(config, task, 8).values()
                  for p in ps}
  validation, _ = data.held_out_sets(task, config.task.train_bins, config.task.eval_bins,
                                     config.task.eval_per_bin, config.task.held_out_fraction,
                                     part="validation")
  assert len(test_prompts) == 8 * len(config.task.eval_bins)
  assert not test_prompts & {p.prompt for ps in validation.values() for p in ps}
  # A file of 8 problems a bin is never read back as, or mixed with, another per_bin's sets.
  run_cfg = cc.run_config(config, "uniform", 1, cc.default_budget(config), 2e-5)
  with pytest.raises(ValueError, match="another number of problems"):
    test_evaluation.evaluate_run(run_cfg, str(runs / "uniform_lr2e-05_s1"), 4)
  with pytest.raises(ValueError, match="evaluation-only"):
    test_evaluation.test_sets(config, task, 8, extra_bins=(1,))  # a training bin


def test_every_curriculum_and_filter_is_a_method_by_name():
  config = compare.get_config("toy")
  budget = 4 * config.rl.prompts_per_step * config.rl.group_size
  filters = [f for f in builders.FILTERS if f != "none"]
  assert set(builders.CURRICULA) | set(filters) <= set(cc.ALL_METHODS)
  for method in cc.ALL_METHODS:
    if method == "sec_tasks":  # needs several tasks: test_sec_over_tasks_is_sec_with_an_arm_...
      continue
    c = cc.run_config(config, method, seed=1, budget=budget)
    validation.validate(c)
    if method in builders.CURRICULA:
      assert (c.curriculum.name, c.curriculum.filter) == (method, "none")
    elif method in filters:
      assert (c.curriculum.name, c.curriculum.filter) == ("uniform", method)
      assert c.rl.steps * 2 == 4  # twice the prompts rolled out per step: half the steps
  with pytest.raises(ValueError, match="unknown method 'sudoku'"):
    cc.run_config(config, "sudoku", seed=1, budget=budget)


def test_sec_over_tasks_is_sec_with_an_arm_per_task():
  config = compare.get_config("multitask")
  c = cc.run_config(config, "sec_tasks", seed=1, budget=cc.default_budget(config))
  assert (c.curriculum.name, c.curriculum.arms) == ("sec", "task")
  assert dict(c.curriculum.options) == dict(config.curriculum.options)
  assert cc.run_config(config, "sec", seed=1, budget=1000).curriculum.arms == "bin"
  validation.validate(c)
  # On one task there are no tasks to make arms of.
  with pytest.raises(validation.ConfigError, match="config.curriculum.arms"):
    validation.validate(cc.run_config(compare.get_config("toy"), "sec_tasks", seed=1, budget=64))


@pytest.mark.parametrize("setting", compare.VARIANTS)
def test_every_setting_is_a_valid_config(setting):
  validation.validate(compare.get_config(setting))


def test_countdown_without_the_bonus_differs_from_countdown_only_in_the_bonus():
  plain, nobonus = compare.get_config("countdown"), compare.get_config("countdown_nobonus")
  assert plain.task.format_bonus > 0 and nobonus.task.format_bonus == 0.0
  nobonus.task.format_bonus = plain.task.format_bonus
  assert nobonus.to_dict() == plain.to_dict()


def test_arm_names_label_every_trained_bin_including_those_left_out_of_the_mean():
  """The plot's arm labels follow SEC's arms, every training bin in order: the scratch setting's
  one-digit bins (too few held-out problems for the mean) are arms too."""
  config = compare.get_config("scratch")
  names = cc.arm_names(config, builders.build_task(config))
  assert len(names) == len(config.task.train_bins) == 6
  assert names[0] == "add_1d_1d" and "mul_1d_1d" in names


def test_a_method_may_carry_rollout_settings():
  assert cc.split_method("sec") == ("sec", {})
  assert cc.split_method("uniform+k2+b8+drop") == (
      "uniform", {"max_staleness": 2, "decode_budget": 8, "admission": "drop",
                  "engine": "continuous", "off_policy_correction": "none"})
  config = cc.run_config(compare.get_config("toy"), "uniform+k1", seed=2, budget=64)
  validation.validate(config)
  assert (config.rl.max_staleness, config.rl.engine, config.curriculum.name) == (
      1, "continuous", "uniform")
  for bad in ("uniform+k", "uniform+x2", "uniform+late"):
    with pytest.raises(ValueError, match="is not a rollout setting"):
      cc.split_method(bad)
