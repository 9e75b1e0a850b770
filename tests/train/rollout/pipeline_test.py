"""Rollouts in flight across steps (rl_curriculum/train/rollout/pipeline.py), end to end at toy size.

The toy run's completions stop at random lengths (an untrained model draws EOS at random), which
is what the staleness bound, the admission rules and resuming with rows in flight are about.
"""

import os
import shutil
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

from configs import toy
from rl_curriculum.train import loop
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.rollout import pipeline
import test_util

STEPS = 5
# The run the resume and SIGKILL tests continue: k = 2 with a decode budget (batches partly
# decoded, scored or not, at every checkpoint), checkpoints every 2 steps.
K2_STEPS, K2_FLAGS = 6, ("--config.rl.engine=continuous", "--config.rl.decode_slots=8",
                         "--config.rl.max_staleness=2", "--config.rl.decode_budget=2",
                         "--config.rl.off_policy_correction=none",
                         "--config.rl.steps=6", "--config.checkpoint.every=2",
                         "--config.checkpoint.keep=100")


def _config(k=0, budget=0, admission="wait", steps=STEPS, seed=0, **fields):
  c = toy.get_config()
  c.rl.steps = steps
  c.rl.seed = seed
  c.rl.engine = "continuous"
  c.rl.decode_slots = 8
  c.rl.max_staleness = k
  c.rl.decode_budget = budget
  c.rl.admission = admission
  c.rl.off_policy_correction = "none"  # the schedule is under test, not the correction
  c.checkpoint.keep = 100
  return test_util.set_fields(c, **fields)


_run = test_util.run_rl


def _params(workdir, step):
  return test_util.saved_state(workdir, step)[1]


def _assert_same_tree(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _trained(row):
  """Groups trained at a step, summed over the arms ("curriculum/arm_trained/<arm>")."""
  return sum(v for k, v in row.items() if k.startswith("curriculum/arm_trained/"))


def _assert_close_params(a, b):
  """The module tolerance: one learn program reads the tokens' versions (for its staleness
  metrics) and XLA fuses it differently from the other."""
  for x, y in zip(jax.tree.leaves(a["train"]["params"]), jax.tree.leaves(b["train"]["params"]),
                  strict=True):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-6)


def _k2_config():
  """The in-process config of K2_FLAGS."""
  return _config(k=2, budget=2, steps=K2_STEPS, checkpoint__every=2)


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
  """(workdir, rows) of the synchronous loop through the engine, 3 steps, every step saved."""
  workdir = str(tmp_path_factory.mktemp("sync") / "run")
  return workdir, _run(_config(steps=3), workdir)


@pytest.fixture(scope="module")
def k1_run(tmp_path_factory):
  """(workdir, rows) of k = 1 with no decode budget, STEPS steps, every step saved."""
  workdir = str(tmp_path_factory.mktemp("k1") / "run")
  return workdir, _run(_config(k=1), workdir)


@pytest.fixture(scope="module")
def k2_run(tmp_path_factory):
  """(workdir, rows) of the k = 2 run of K2_FLAGS, in this process."""
  workdir = str(tmp_path_factory.mktemp("k2") / "run")
  return workdir, _run(_k2_config(), workdir)


def test_k0_with_a_decode_budget_is_the_synchronous_run(sync_run, tmp_path):
  """k = 0 with a decode budget decodes each batch to its end before learning from it, on the
  one step path: the synchronous run's parameters and metrics, bit for bit (its in-flight
  metrics besides: no feedback delay, no group dropped)."""
  sync_dir, sync = sync_run
  piped = _run(_config(budget=2, steps=3), str(tmp_path / "piped"))
  _assert_same_tree(_params(sync_dir, 3), _params(str(tmp_path / "piped"), 3))
  for a, b in zip(test_util.deterministic(sync), test_util.deterministic(piped), strict=True):
    assert b["curriculum/feedback_delay"] == 0 and b["rollout/groups_dropped"] == 0
    assert {k: b[k] for k in a} == a


def test_k1_learns_step_1_as_the_synchronous_loop_then_a_step_behind(sync_run, tmp_path):
  """Batch 1 is selected and sampled with step 1's keys from the starting state in both loops;
  with k = 1, batch 2 is selected before step 1's feedback and sampled by version 0."""
  (sync_dir, sync), piped_dir = sync_run, str(tmp_path / "k1")
  rows = _run(_config(k=1, steps=2), piped_dir)
  _assert_close_params(_params(sync_dir, 1), _params(piped_dir, 1))
  for name in ("reward_mean", "correct_mean", "nonzero_adv_frac", "completion_len"):
    assert rows[0][name] == sync[0][name], name
  assert [r["staleness_max"] for r in rows] == [0, 1]
  assert [r["curriculum/feedback_delay"] for r in rows] == [1, 1]
  second = [np.asarray(x) for x in jax.tree.leaves(_params(piped_dir, 2)["train"]["params"])]
  assert any(not np.array_equal(x, np.asarray(y)) for x, y in
             zip(second, jax.tree.leaves(_params(sync_dir, 2)["train"]["params"])))


@pytest.mark.parametrize("k,budget,seed", [(1, 0, 0), (2, 2, 0), (2, 1, 3), (3, 2, 5)])
def test_no_trained_token_is_older_than_k_and_wait_trains_every_group(k, budget, seed, request,
                                                                     tmp_path):
  """Random completion lengths (the toy model's, over seeds): every trained token was drawn at
  most k versions before the update; with `wait` every selected group is trained, k steps after
  its selection. (k = 1 and k = 2 with a budget of 2 are the runs the resume tests continue.)"""
  shared = {(1, 0, 0): "k1_run", (2, 2, 0): "k2_run"}.get((k, budget, seed))
  if shared:
    rows = request.getfixturevalue(shared)[1]
  else:
    rows = _run(_config(k=k, budget=budget, seed=seed), str(tmp_path / "run"))
  assert 1 <= max(r["staleness_max"] for r in rows) <= k  # the tokens do lag, within the bound
  for step, r in enumerate(rows, start=1):
    assert 0 <= r["staleness_mean"] <= r["staleness_max"] <= k
    assert r["curriculum/feedback_delay"] == min(step, k)
    assert r["rollout/groups_dropped"] == 0 and r["groups_trained"] == 4
    assert _trained(r) == 4


def test_drop_discards_the_groups_whose_rows_are_late(tmp_path):
  """One decode iteration a step on 8 slots cannot finish 16 rows of up to 4 tokens in k = 2
  steps: late groups are dropped (counted nowhere), the others trained, none older than k."""
  rows = _run(_config(k=2, budget=1, admission="drop"), str(tmp_path / "run"))
  dropped = [r["rollout/groups_dropped"] for r in rows]
  assert sum(dropped) > 0
  for r, d in zip(rows, dropped):
    assert _trained(r) == r["groups_trained"] == 4 - d
    assert r["staleness_max"] <= 2


def _resume_from_step_2(straight: str, resumed: str, config, steps: int) -> None:
  """Continues a copy of run `straight` from its checkpoint of step 2 and checks that it ends as
  the uninterrupted run: every array of the state equal, the same metrics."""
  shutil.copytree(straight, resumed)
  for name in os.listdir(os.path.join(resumed, "checkpoints")):
    if name.isdigit() and int(name) > 2:
      shutil.rmtree(os.path.join(resumed, "checkpoints", name))
  os.remove(os.path.join(resumed, "summary.json"))
  loop.train_and_evaluate(config, resumed)
  _assert_same_tree(_params(straight, steps), _params(resumed, steps))
  assert (test_util.deterministic(read_jsonl(os.path.join(straight, "metrics.jsonl")))
          == test_util.deterministic(read_jsonl(os.path.join(resumed, "metrics.jsonl"))))


def test_resumed_with_rows_in_flight_equals_uninterrupted_k1(k1_run, tmp_path):
  """The checkpoint of step 2 holds the batch in flight (queued or decoded): continuing from it
  ends as the uninterrupted run."""
  _resume_from_step_2(k1_run[0], str(tmp_path / "resumed"), _config(k=1), STEPS)


def test_resumed_with_rows_in_flight_equals_uninterrupted_k2(k2_run, tmp_path):
  """With a decode budget the checkpoint of step 2 holds batches partly decoded, scored or not:
  continuing from it ends as the uninterrupted run."""
  _resume_from_step_2(k2_run[0], str(tmp_path / "resumed"), _k2_config(), K2_STEPS)


@pytest.mark.slow
def test_sigkill_with_rows_in_flight_then_same_command_matches_uninterrupted(k2_run, tmp_path):
  """The command line of the k = 2 run, killed with SIGKILL after step 3 is logged (between its
  checkpoints of steps 2 and 4), then run again as it was: what a killed run's user does. It
  ends as the uninterrupted run made in this process."""
  straight, killed = k2_run[0], str(tmp_path / "killed")
  test_util.copy_warm_start(test_util.shared_warm_start(_config()), killed)
  command = test_util.train_command(killed, *K2_FLAGS, config="toy")
  proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          cwd=test_util.ROOT)
  deadline = time.time() + 900
  while time.time() < deadline and proc.poll() is None:
    rows = read_jsonl(os.path.join(killed, "metrics.jsonl"))
    if rows and rows[-1]["step"] >= 3:
      break
    time.sleep(0.1)
  assert proc.poll() is None, "the run ended before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert read_jsonl(os.path.join(killed, "metrics.jsonl"))[-1]["step"] < K2_STEPS
  subprocess.run(command, check=True, capture_output=True, cwd=test_util.ROOT, timeout=900)
  _assert_same_tree(_params(straight, K2_STEPS), _params(killed, K2_STEPS))
  assert (test_util.deterministic(read_jsonl(os.path.join(straight, "metrics.jsonl")))
          == test_util.deterministic(read_jsonl(os.path.join(killed, "metrics.jsonl"))))


def test_the_planner_counts_the_bytes_a_checkpoint_with_rows_in_flight_holds(k2_run):
  """The planner's checkpoint bytes for the k = 2 config (no program compiled) are those of the
  k = 2 run's checkpoint as written: the train and curriculum states, the engine's rows and KV
  cache, each batch's records. The engine state holds no logits (tokens, cache and counters)."""
  from rl_curriculum.plan import planner as plan
  from rl_curriculum.train.setup import prepare  # pylint: disable=import-outside-toplevel
  workdir = k2_run[0]
  _, saved = test_util.saved_state(workdir)
  assert "logits" not in saved["rollouts"]["engine"]
  written = sum(np.asarray(x).nbytes for x in jax.tree.leaves(saved))
  run = prepare.prepare(_k2_config(), workdir, log=lambda _: None)
  report = plan.plan(_k2_config(), hbm_gib=1.0, prompt_len=run.pool.tokens.shape[1],
                     vocab_size=run.tokenizer.vocab_size, programs=())
  assert report["checkpoint"]["gib"] * plan.GIB == written
  assert report["checkpoint"]["gib_per_host"] == report["checkpoint"]["gib"]  # one process


def test_a_group_is_complete_only_when_every_sampled_row_stopped():
  """`drop` evicts the rows that have not stopped: their groups count nowhere. A group with one
  unfinished sampled row is incomplete; a row that was never sampled does not count."""
  done = np.array([[True, False], [True, True], [False, False], [True, False]])
  valid = np.array([[True, True], [True, True], [True, True], [True, False]])
  np.testing.assert_array_equal(pipeline.complete_groups(done, valid),
                                [False, True, False, True])


def test_resumed_on_a_paged_cache_with_rows_in_flight_equals_uninterrupted(tmp_path):
  """The k = 2 run with a budget on a paged KV cache of the fewest pages its 8 slots allow (rows
  may run out of pages and restart): the checkpoint of step 2 holds pages, page tables and free
  stacks with rows in flight, and continuing from it ends as the uninterrupted run."""
  config = _config(k=2, budget=2, steps=4, checkpoint__every=2, rl__page_size=2)
  config.rl.kv_pages = -(-config.rl.max_new_tokens // 2) + 1 + 8 - 1
  straight = str(tmp_path / "straight")
  rows = _run(config, straight)
  assert rows[-1]["step"] == 4
  _resume_from_step_2(straight, str(tmp_path / "resumed"), config, 4)


def test_the_horizon_bandit_moves_only_with_a_kept_update():
  """After a step's update, the horizon bandit learns from the step's episodes (`pipeline.learned`);
  a discarded update teaches it nothing, as it teaches the curriculum nothing."""
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from configs import toy_episodes  # pylint: disable=import-outside-toplevel
  from rl_curriculum.curriculum import horizon  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.setup import builders  # pylint: disable=import-outside-toplevel
  config = toy_episodes.get_config()
  config.curriculum.horizon = "bandit"
  loop_ = SimpleNamespace(config=config, run=SimpleNamespace(task=builders.build_task(config)))
  records = pipeline.empty_records(config, width=3)
  records.batch_step[0], records.horizon[0] = 1, 2
  records.valid[0], records.complete[0] = True, True
  records.played.rewards[0] = np.tile([1.0, 0.0, 0.0, 0.0], records.valid.shape[1])
  state = SimpleNamespace(rollouts=pipeline.InFlight(engine=None, records=records),
                          horizon=horizon.init(3))
  state._replace = lambda **kw: SimpleNamespace(**{**vars(state), **kw})
  kept = pipeline.learned(loop_, state, 1, skipped=False)
  assert float(kept.horizon.q[1]) > 0 and int(kept.horizon.visits[1]) == 1
  assert pipeline.learned(loop_, state, 1, skipped=True) is state
