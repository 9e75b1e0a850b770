"""End-to-end tests of the trainer at toy size: a few steps, resume, bad configs."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy
from rl_curriculum import tasks
from rl_curriculum.train import loop
from rl_curriculum.train.durable import workdir as workdir_lib
from rl_curriculum.train.report import summary as summary_lib
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.rollout import episodes
from rl_curriculum.train.setup import data, features, validation
from rl_curriculum.train.setup import prepare as prepare_lib
from rl_curriculum.train.setup import warm_start
import test_util

ROOT = test_util.ROOT


def toy_config(steps=4):
  c = toy.get_config()
  c.rl.steps = steps
  return c


def _warm(config, workdir: str) -> str:
  """`workdir`, made holding a copy of the test run's shared warm start of `config`."""
  test_util.copy_warm_start(test_util.shared_warm_start(config), workdir)
  return workdir


_deterministic = test_util.deterministic
_final_params = test_util.saved_state


@pytest.mark.slow
def test_quickstart_toy_runs_and_logs(tmp_path, monkeypatch, capsys):
  checks = []
  validate = validation.validate
  monkeypatch.setattr(validation, "validate", lambda *a, **k: checks.append(a) or validate(*a, **k))
  summary = loop.train_and_evaluate(toy_config(steps=3), str(tmp_path))
  assert len(checks) == 1  # the config is checked once a run, before anything is built
  monkeypatch.undo()
  out = capsys.readouterr().out
  # The evaluation during training (eval.every = 2) reaches the console; the last one is the table.
  assert "step 2 held-out greedy accuracy (change since step 0): add_1d_1d " in out
  assert "add_3d_3d (ood) " in out and "step 3 held-out" not in out
  assert "first step " in out and "(compiling)" in out
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2, 3]
  assert "kl" not in rows[-1]  # kl_coef = 0: the reference pass is skipped
  for key in ("reward_mean", "correct_mean", "nonzero_adv_frac", "approx_kl", "entropy",
              "clipfrac_high", "tokens_per_s", "time/sample_s", "time/score_s", "time/learn_s",
              "curriculum/probs/0", "curriculum/q/2", "skipped_total"):
    assert key in rows[-1], key
  assert abs(sum(rows[-1][f"curriculum/probs/{k}"] for k in range(3)) - 1) < 1e-5
  assert set(summary["before"]) == {"add_1d_1d", "add_2d_2d", "add_3d_3d"}
  assert summary["ood_bins"] == ["add_3d_3d"]
  assert (tmp_path / "report.png").stat().st_size > 10_000
  assert os.listdir(tmp_path / "tensorboard")
  saved = json.load(open(tmp_path / "summary.json"))
  assert saved["steps"] == 3
  assert saved["held_out_sizes"] == {"add_1d_1d": 8, "add_2d_2d": 8, "add_3d_3d": 8}
  # Every evaluation keeps each problem's outcome; their means are the logged accuracies, and the
  # table's paired intervals and the gain's sources come from the first and last.
  evals = [r for r in rows if "eval/acc/add_1d_1d" in r]
  assert [r["step"] for r in evals] == [0, 2, 3]
  assert sorted(os.listdir(tmp_path / "heldout")) == [
      f"step_{n}{kind}" for n in (0, 2, 3) for kind in (".npz", "_transcripts.json")]
  # The first episodes of each held-out set, written out: its question, the turn, its reward.
  shown = json.load(open(tmp_path / "heldout" / "step_3_transcripts.json"))
  assert sorted(shown) == ["add_1d_1d", "add_2d_2d", "add_3d_3d"]
  first = shown["add_1d_1d"][0]
  assert len(shown["add_1d_1d"]) == 4 and len(first["turns"]) == 1
  assert first["question"] and first["turns"][0]["reward"] == pytest.approx(first["return"])
  for row in evals:
    step = row["step"]
    outcomes = summary_lib.read_outcomes(summary_lib.outcomes_path(str(tmp_path), step))
    assert {b: float(np.mean(c)) for b, (c, _) in outcomes.items()} == {
        k[len("eval/acc/"):]: v for k, v in row.items() if k.startswith("eval/acc/")}
    assert all(len(c) == len(f) == 8 for c, f in outcomes.values())
  for b, change in saved["paired_change"].items():
    assert abs(change["mean"] - (saved["after"][b] - saved["before"][b])) < 1e-12
    assert change["lo"] <= change["mean"] <= change["hi"] and change["n_problems"] == 8
  sources = saved["gain_sources"]
  assert sources["format"] + sources["skill"] == sources["gained"]
  # The same command again: the run is finished, and says so without building anything.
  metrics_before = (tmp_path / "metrics.jsonl").read_text()
  monkeypatch.setattr(loop, "_start", lambda *a: pytest.fail("a finished run was rebuilt"))
  assert loop.train_and_evaluate(toy_config(steps=3), str(tmp_path)) == saved
  monkeypatch.undo()
  out = capsys.readouterr().out
  assert f"already finished: {tmp_path} holds all 3 RL steps of this config" in out
  assert saved["table"] in out
  assert (tmp_path / "metrics.jsonl").read_text() == metrics_before
  # evaluate.py restores the newest checkpoint: its greedy accuracy is the run's final evaluation.
  result = subprocess.run(
      [sys.executable, "-m", "experiments.evaluate", "--config",
       os.path.join(ROOT, "configs", "toy.py"), "--workdir", str(tmp_path),
       "--config.rl.steps=3", "--k=1", "--samples=2"],
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  evaluated = json.load(open(tmp_path / "eval.json"))
  assert evaluated["step"] == 3 and evaluated["ood"] == ["add_3d_3d"]
  assert evaluated["greedy"] == summary["after"]
  assert set(evaluated["pass@1"]) == set(summary["after"])
  # The cached tokenizer and warm start belong to these settings; other settings are refused.
  other = toy_config(steps=3)
  other.sft.steps = 11
  with pytest.raises(ValueError, match="fresh --workdir"):
    loop.train_and_evaluate(other, str(tmp_path))


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(tmp_path, capsys):
  """Stopped after step 2, the newest checkpoint damaged on disk: the same command resumes from
  step 1's, the newest intact one, and ends as the uninterrupted run does."""
  straight = _warm(toy_config(), str(tmp_path / "straight"))
  resumed = _warm(toy_config(), str(tmp_path / "resumed"))
  loop.train_and_evaluate(toy_config(steps=4), straight)
  loop.train_and_evaluate(toy_config(steps=2), resumed)   # stops after step 2 ...
  test_util.flip_bytes(os.path.join(resumed, "checkpoints", "2"))
  capsys.readouterr()
  loop.train_and_evaluate(toy_config(steps=4), resumed)   # ... and continues from step 1
  out = capsys.readouterr().out
  assert "warning: checkpoint 2 in " in out and "differs from what was written" in out
  assert "resumed from step 1" in out
  assert os.path.isdir(os.path.join(resumed, "checkpoints.damaged", "2"))
  a, b = _final_params(straight), _final_params(resumed)
  assert a[0] == b[0] == 4
  for x, y in zip(jax.tree.leaves(a[1]), jax.tree.leaves(b[1])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  rows_a = _deterministic(read_jsonl(os.path.join(straight, "metrics.jsonl")))
  rows_b = _deterministic(read_jsonl(os.path.join(resumed, "metrics.jsonl")))
  assert rows_a == rows_b


@pytest.mark.parametrize("field,value,message", [
    ("curriculum.name", "secc", "config.curriculum.name: unknown curriculum 'secc'"),
    ("rl.minibatches", 3, "config.rl.minibatches"),
    ("model.lora_rank", 4, None),
    ("curriculum.options", {"alpha": 0.5, "temprature": 1.0}, "curriculum.options.temprature"),
    ("rl.algorithm", "a2c", "config.rl.algorithm"),
    ("rl.seed", -1, "config.rl.seed: must be >= 0"),
    # Option VALUES too: sec() rejects alpha = 2 when it is built, which comes after the SFT warm
    # start; the config phase builds the curriculum first.
    ("curriculum.options", {"alpha": 2.0}, "config.curriculum.options: sec: alpha must lie in"),
    ("task.held_out_fraction", 1.0, "config.task.held_out_fraction"),
    ("task.name", "sudoku", "config.task: \"unknown task 'sudoku'"),
])
def test_bad_config_fails_before_compiling(field, value, message, tmp_path):
  c = toy_config()
  section, name = field.split(".")
  if field == "model.lora_rank":
    c.model.lora_rank = 4
    c.model.lora_targets = ("q", "qkv")
    message = "config.model.lora_targets: ['qkv']"
  elif isinstance(value, dict):
    c.curriculum.options = value
  else:
    setattr(getattr(c, section), name, value)
  with pytest.raises(validation.ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
    loop.train_and_evaluate(c, str(tmp_path))
  assert not os.listdir(tmp_path)  # nothing was written: the check ran first


def test_rl_seed_changes_the_rl_stream_only():
  c = toy_config()
  base = prepare_lib.rl_root_key(c)
  np.testing.assert_array_equal(base, jax.random.PRNGKey(c.seed))  # rl.seed 0: the run's seed
  c.rl.seed = 3
  other = prepare_lib.rl_root_key(c)
  assert not np.array_equal(other, base)
  # The SFT warm start's fingerprint ignores rl.seed, so seeds share one cached warm start.
  d = toy_config()
  assert warm_start.fingerprint(c) == warm_start.fingerprint(d)


_cli = test_util.train_command


@pytest.mark.slow
def test_cli_prints_a_bad_option_as_one_line(tmp_path):
  result = subprocess.run(_cli(str(tmp_path), "--config.curriculum.options.alpha=2.0"),
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "error: config.curriculum.options: sec: alpha must lie in (0, 1], got 2.0")
  assert "Traceback" not in result.stderr
  assert not os.path.exists(tmp_path / "tokenizer.model")  # before data, tokenizer and SFT


def test_a_non_finite_reward_is_rejected_on_the_host_naming_task_and_prompt():
  arithmetic = type(tasks.get_task("arithmetic"))

  class NaNTask(arithmetic):
    def score(self, problem, completion):
      return super().score(problem, completion)._replace(reward=float("nan"))

  problems = tuple(data.problems(tasks.get_task("arithmetic"), [0], 2, "rl"))
  rows = episodes.finished_rows(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3)))
  tokenizer = type("Sevens", (), {"decode": staticmethod(lambda ids: "7")})()
  with pytest.raises(ValueError, match=re.escape(
      f"task 'arithmetic' scored nan (not finite) for prompt '{problems[0].prompt}'")):
    episodes.step_turns(rows, 0, problems=list(problems), task=NaNTask(), seeds=[0, 1],
                        tokenizer=tokenizer, framing=None,
                        limits=episodes.Limits(max_turns=1, turn_tokens=3,
                                               observation_tokens=8, max_new_tokens=3),
                        read_only=True, rows_of=lambda r, _: r)


@pytest.mark.parametrize("override,message", [
    ("--config.rl.learning_rat=1e-3", "error: --config.rl.learning_rat=1e-3: the config has no "
     'field config.rl.learning_rat (did you mean "learning_rate"?)'),
    ("--config.rl.nonexistent_field=1", "error: --config.rl.nonexistent_field=1: the config has "
     "no field config.rl.nonexistent_field"),
    ("--config.rl.steps=many", "error: flag --config.rl.steps=many: invalid literal for int() "
     "with base 10: 'many'"),
])
@pytest.mark.slow
def test_cli_rejects_unknown_keys_and_wrong_types(override, message, tmp_path):
  result = subprocess.run(_cli(str(tmp_path), override), capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines() == [message]
  assert not os.path.exists(tmp_path / "checkpoints")


@pytest.mark.slow
def test_a_changed_config_is_refused_on_resume_unless_allowed_and_then_logged(tmp_path):
  workdir = _warm(toy_config(), str(tmp_path / "run"))
  loop.train_and_evaluate(toy_config(steps=2), workdir)
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  changed = toy_config(steps=3)
  changed.rl.learning_rate = 1e-4
  with pytest.raises(workdir_lib.ConfigChanged, match=re.escape(
      "rl.learning_rate: 2e-05 -> 0.0001; resume with the same config")):
    loop.train_and_evaluate(changed, workdir)
  assert read_jsonl(os.path.join(workdir, "metrics.jsonl")) == rows  # nothing written
  loop.train_and_evaluate(changed, workdir, allow_config_change=True)
  last = read_jsonl(os.path.join(workdir, "metrics.jsonl"))[-1]
  assert last["step"] == 3 and last["config_change"] == "rl.learning_rate: 2e-05 -> 0.0001"
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["rl"]["learning_rate"] == 1e-4  # the record follows the change
  loop.train_and_evaluate(changed, workdir)  # the same config again: no change to allow


@pytest.mark.slow
def test_a_second_writer_stops_at_once_naming_the_first(tmp_path):
  with workdir_lib.Lock(str(tmp_path)):
    result = subprocess.run(_cli(str(tmp_path), config="toy"), capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"error: {tmp_path} is in use by pid {os.getpid()} on ")
  assert sorted(os.listdir(tmp_path)) == [workdir_lib.LOCK]  # the second one wrote nothing


@pytest.mark.slow
def test_toy_lora_ppo_with_dynamic_filtering_runs(tmp_path):
  c = toy_config(steps=2)
  c.model.lora_rank = 4
  c.model.lora_targets = ("q", "v", "up")
  c.rl.algorithm = "ppo"
  c.rl.learning_rate = 1e-3
  c.curriculum.filter = "all_equal"
  c.curriculum.oversample = 2
  c.checkpoint.every = 2
  loop.train_and_evaluate(c, _warm(c, str(tmp_path / "run")))
  rows = read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert all(np.isfinite(r["value_loss"]) for r in rows[1:])
  assert all(r["groups_kept"] <= 4 for r in rows[1:])  # P = 4 of 8 sampled groups at most
  step, saved = _final_params(str(tmp_path / "run"))
  assert step == 2 and "value" in saved["train"]
  # Only the adapters are trained and saved: no base kernel in the train state's parameters.
  names = ["/".join(map(str, path)) for path, _ in
           jax.tree_util.tree_flatten_with_path(saved["train"]["params"])[0]]
  assert names and all("lora" in n for n in names), names[:5]


@pytest.mark.slow
def test_pcl_features_follow_the_policy(tmp_path):
  """PCL's prompt features are recomputed from the current policy every features_every steps
  (not only from the warm start), in batches of features_batch_size prompts."""
  c = toy_config(steps=2)
  c.curriculum.name = "pcl"
  c.curriculum.options = {}
  c.curriculum.features_every = 2
  c.curriculum.features_batch_size = 16  # 120 pool prompts: 8 batches
  c.rl.learning_rate = 1e-3
  workdir = _warm(c, str(tmp_path / "run"))
  loop.train_and_evaluate(c, workdir)
  run = prepare_lib.prepare(c, workdir, log=lambda _: None)  # cached: tokenizer, warm start
  _, saved = _final_params(workdir)
  kept = np.asarray(saved["curriculum"]["features"])
  warm = features.pool_features(c, run, run.model.trainable, run.model.frozen)
  trained = features.pool_features(c, run, saved["train"]["params"], run.model.frozen)
  assert not np.allclose(kept, warm, atol=1e-4)
  np.testing.assert_allclose(kept, trained, atol=1e-5)
