"""Runs on several tasks at toy size: one pool of (task, bin) arms or one arm per task, mixture
weights, per-task evaluation and skill balance in metrics.jsonl and summary.json."""

import collections
import json
import os
import types

import jax
import numpy as np
import pytest

from configs import multitask, toy
from rl_curriculum.tasks import get_task
from rl_curriculum.train.report import summary
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.setup import builders, validation
from rl_curriculum.train.setup import prepare as prepare_lib
import test_util

TASK = "arithmetic+countdown"
TRAIN = ("arithmetic/add_1d_1d", "arithmetic/add_2d_1d", "countdown/n3", "countdown/n4")


def _config(**fields):
  """configs/toy.py on the arithmetic + countdown mixture, training the four TRAIN bins (BPE
  tokens: countdown prompts of about 40 tokens)."""
  mixture = get_task(TASK)
  c = toy.get_config()
  c.task.name = TASK
  c.task.train_bins = tuple(mixture.bin_names.index(b) for b in TRAIN)
  # The trained bins and one arithmetic bin the run never trains on.
  c.task.eval_bins = c.task.train_bins + (mixture.bin_names.index("arithmetic/mul_1d_1d"),)
  c.tokenizer.vocab_size = 256
  c.tokenizer.model_type = "bpe"
  c.rl.max_new_tokens = 6
  return test_util.set_fields(c, **fields)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A toy run on the mixture, from the warm start the other runs of this file share (its
  held-out accuracies may all be 0: `test_task_metrics_weigh_the_trained_bins_of_each_task`
  checks the same metrics on numbers that are not)."""
  c = _config()
  workdir = str(tmp_path_factory.mktemp("multitask") / "run")
  rows = test_util.run_rl(c, workdir)
  return c, workdir, rows


@pytest.mark.slow
def test_rollouts_come_from_both_tasks_arms(run):
  _, _, rows = run
  share = np.array([sum(r[f"curriculum/arm_frac/{k}"] for r in rows) for k in range(len(TRAIN))])
  assert f"curriculum/arm_frac/{len(TRAIN)}" not in rows[0]  # one arm per (task, bin) pair
  # SEC's four arms each get a value and a probability.
  assert {k for k in rows[-1] if k.startswith("curriculum/probs/")} == {
      f"curriculum/probs/{k}" for k in range(len(TRAIN))}
  # Both tasks' arms were practised.
  assert share[:2].sum() > 0 and share[2:].sum() > 0


@pytest.mark.slow
def test_each_evaluation_reports_tasks_and_skill_balance(run):
  c, workdir, _ = run
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  sizes = summary["held_out_sizes"]
  evals = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
           if "eval/arithmetic/accuracy" in r]
  assert [r["step"] for r in evals] == list(range(0, c.rl.steps + 1, c.eval.every))

  def task_acc(row, task):  # problem-weighted over the task's trained bins only
    names = [b for b in TRAIN if b.startswith(task + "/")]
    return (sum(row[f"eval/acc/{b}"] * sizes[b] for b in names) / sum(sizes[b] for b in names))

  first = evals[0]
  for row in evals:
    now = {t: task_acc(row, t) for t in ("arithmetic", "countdown")}
    start = {t: task_acc(first, t) for t in ("arithmetic", "countdown")}
    for t, v in now.items():
      np.testing.assert_allclose(row[f"eval/{t}/accuracy"], v, rtol=1e-6)
    np.testing.assert_allclose(row["eval/skill/min_gain"],
                               min(now[t] - start[t] for t in now), atol=1e-6)
    np.testing.assert_allclose(row["eval/skill/spread"],
                               max(now.values()) - min(now.values()), atol=1e-6)
  assert first["eval/skill/min_gain"] == 0.0
  assert summary["tasks"].keys() == {"arithmetic", "countdown"}
  assert summary["skill_balance"]["min_gain"] == pytest.approx(evals[-1]["eval/skill/min_gain"])


def test_task_metrics_weigh_the_trained_bins_of_each_task():
  """eval/<task>/accuracy: problem-weighted over the task's trained bins (mul_1d_1d, evaluated
  but not trained, is left out); the skill balance compares those with the accuracies before."""
  c = _config()
  sizes = {"arithmetic/add_1d_1d": 10, "arithmetic/add_2d_1d": 30, "countdown/n3": 20,
           "countdown/n4": 20, "arithmetic/mul_1d_1d": 50}
  run = types.SimpleNamespace(task=get_task(TASK), held_out_sizes=sizes)
  now = {"arithmetic/add_1d_1d": 0.9, "arithmetic/add_2d_1d": 0.5, "countdown/n3": 0.4,
         "countdown/n4": 0.1, "arithmetic/mul_1d_1d": 1.0}
  before = {**now, "arithmetic/add_2d_1d": 0.3, "countdown/n4": 0.2}
  metrics = summary.eval_metrics(c, run, now, before)
  np.testing.assert_allclose(metrics["eval/arithmetic/accuracy"], (9 + 15) / 40, rtol=1e-12)
  np.testing.assert_allclose(metrics["eval/countdown/accuracy"], (8 + 2) / 40, rtol=1e-12)
  # Gains: arithmetic 18 -> 24 of its 40 problems, countdown 12 -> 10 of 40.
  np.testing.assert_allclose(metrics["eval/skill/min_gain"], -2 / 40, atol=1e-12)
  np.testing.assert_allclose(metrics["eval/skill/spread"], 0.6 - 0.25, atol=1e-12)
  assert metrics["eval/acc/arithmetic/mul_1d_1d"] == 1.0


@pytest.mark.slow
def test_task_arms_group_each_tasks_bins_and_train(tmp_path):
  c = _config(curriculum__arms="task", rl__steps=2)
  workdir = str(tmp_path / "run")
  rows = test_util.run_rl(c, workdir)
  run = prepare_lib.prepare(c, workdir, log=lambda _: None)  # cached: tokenizer, warm start
  assert run.arm_names == ("arithmetic", "countdown")
  tasks_of_prompts = [p.task for p in run.pool.problems]
  np.testing.assert_array_equal(run.pool.arms, [run.arm_names.index(t) for t in tasks_of_prompts])
  # SEC chooses between two arms, the tasks.
  assert {k for k in rows[-1] if k.startswith("curriculum/probs/")} == {
      "curriculum/probs/0", "curriculum/probs/1"}
  np.testing.assert_allclose(sum(rows[-1][f"curriculum/probs/{k}"] for k in (0, 1)), 1.0,
                             rtol=1e-6)


@pytest.mark.slow
def test_dump_keeps_statistics_per_task_and_bin_arm(tmp_path):
  c = _config(curriculum__name="dump", curriculum__options={}, rl__steps=3)
  rows = test_util.run_rl(c, str(tmp_path))
  p = c.rl.prompts_per_step
  drawn = np.sum([[r[f"curriculum/arm_frac/{k}"] * p for k in range(len(TRAIN))] for r in rows],
                 axis=0)
  # DUMP counts each (task, bin) arm's prompts as they are drawn; its UCB score is per arm.
  np.testing.assert_allclose([rows[-1][f"curriculum/counts/{k}"] for k in range(len(TRAIN))],
                             drawn, atol=1e-6)
  assert {k for k in rows[-1] if k.startswith("curriculum/score/")} == {
      f"curriculum/score/{k}" for k in range(len(TRAIN))}


@pytest.mark.slow
def test_mixture_weights_set_each_tasks_share_of_the_pool(tmp_path):
  c = _config(task__weights=(3.0, 1.0), task__train_per_bin=20, sft__steps=0)  # the pool only
  run = prepare_lib.prepare(c, str(tmp_path), log=lambda _: None)
  per_task = collections.Counter(p.task for p in run.pool.problems)
  # 80 problems: arithmetic 60 (30 per bin), countdown 20 (10 per bin).
  assert per_task == {"arithmetic": 60, "countdown": 20}
  per_arm = np.bincount(run.pool.arms, minlength=4)
  np.testing.assert_array_equal(per_arm, [30, 30, 10, 10])
  # Uniform over prompts then draws arithmetic three times as often as countdown.
  cur = builders.build_curriculum(_config(curriculum__name="uniform", curriculum__options={}),
                                  run.pool.prompt_pool(), 40)
  state = cur.init(run.pool.prompt_pool(), jax.random.PRNGKey(0))
  arms = []
  for step in range(4):
    selection, state = cur.select(state, jax.random.PRNGKey(step))
    arms += list(np.asarray(selection.arms))
  arithmetic = float(np.mean(np.asarray(arms) < 2))
  assert abs(arithmetic - 0.75) < 0.1  # 160 draws: 3 standard errors are about 0.1


def test_multitask_config_names_bins_of_its_mixture():
  c = multitask.get_config()
  mixture = builders.build_task(c)
  assert {mixture.task_of(b) for b in c.task.train_bins} == {"countdown", "zebra", "arc1d"}
  assert [mixture.bin_names[b] for b in c.task.train_bins] == list(multitask.BINS)
  validation.validate(c, task=mixture)
