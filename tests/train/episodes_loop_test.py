"""End-to-end tests of training on environments at toy size (configs/toy_episodes.py): the three
environments as one mixture with (environment, level) arms, multi-turn episodes on the continuous
engine, the horizon curriculum, held-out episodes, and a run killed while its episodes are in
flight, which resumes to the uninterrupted run's parameters and metrics bit for bit."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy_episodes
from rl_curriculum.environments import base as env_base
from rl_curriculum.train import loop
from rl_curriculum.train import programs
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.rollout import batches, engines, pipeline
from rl_curriculum.train.setup import prepare, validation
import test_util


def _config(steps=4, **fields):
  c = toy_episodes.get_config()
  c.rl.steps = steps
  return test_util.set_fields(c, **fields) if fields else c


def _warm(config, workdir: str) -> str:
  test_util.copy_warm_start(test_util.shared_warm_start(config), workdir)
  return workdir


@pytest.mark.slow
def test_three_environments_train_end_to_end_with_a_rising_horizon(tmp_path):
  workdir = _warm(_config(), str(tmp_path / "run"))
  loop.train_and_evaluate(_config(), workdir)
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  steps = [r for r in rows if r["step"] > 0 and "episode/turns" in r]
  assert [r["step"] for r in steps] == [1, 2, 3, 4]
  # curriculum.horizon = linear from 1 to rl.max_turns = 3 over 4 steps.
  assert [r["episode/horizon"] for r in steps] == [1.0, 2.0, 2.0, 3.0]
  for r in steps:
    assert 1 <= r["episode/turns"] <= r["episode/horizon"]
    assert r["episode/staleness_max"] == 0.0  # one step's episodes, one version
    assert 0 <= r["episode/tool_call_rate"] <= 1 and np.isfinite(r["loss"])
    arms = [k for k in r if k.startswith("curriculum/arm_frac/")]
    assert len(arms) == 5  # (environment, level) arms
    assert sum(r[k] for k in arms) == pytest.approx(1.0)
  with open(os.path.join(workdir, "heldout", "step_4_episodes.json")) as f:
    held_out = json.load(f)
  assert sorted(held_out) == ["calculator/l0", "guess/l0"]
  assert set(held_out["guess/l0"]) >= {"episode/tool_call_rate", "episode/well_formed_calls",
                                       "episode/success", "episode/turns"}


@pytest.mark.slow
def test_turns_of_one_token_play_every_turn(tmp_path):
  """With rl.turn_tokens = 1 every row's first turn ends with its first token, drawn when the
  batch is queued, so no row is decoding when its step comes: the episodes must still be
  answered and played to the horizon (3 turns of 1 token and a reply fit in 48 positions)."""
  config = _config(steps=1, rl__turn_tokens=1)
  workdir = _warm(config, str(tmp_path / "run"))
  loop.train_and_evaluate(config, workdir)
  step = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["step"] == 1][0]
  assert step["episode/horizon"] == 3.0
  assert step["episode/turns"] == 3.0


class _Killed(BaseException):
  """Stands for the process being killed (not an Exception: no guard of the run catches it)."""


# The synchronous schedule, and episodes in flight across steps (k = 1) with partial rollouts:
# each step decodes 20 iterations, so episodes span steps and versions.
_SCHEDULES = {"synchronous": {},
              "in_flight": dict(rl__max_staleness=1, rl__decode_budget=20,
                                rl__off_policy_correction="none")}


@pytest.mark.slow
@pytest.mark.parametrize("schedule", list(_SCHEDULES))
def test_a_run_killed_with_episodes_in_flight_resumes_bit_exact(schedule, tmp_path, monkeypatch):
  """Killed in step 3 while episodes wait for their environments' replies (in flight: those of
  batches 3 and 4, some begun in earlier steps under older weights); started again with the
  same command, the run resumes from step 2's checkpoint (which holds the engine's rows, with
  their turns and replies, when they are in flight) and ends with the uninterrupted run's
  parameters, horizon bandit and metrics, bit for bit."""
  config = lambda: _config(curriculum__horizon="bandit", **_SCHEDULES[schedule])
  straight = _warm(config(), str(tmp_path / "straight"))
  resumed = _warm(config(), str(tmp_path / "resumed"))
  loop.train_and_evaluate(config(), straight)
  step, run_step, now = env_base.Environment.step, loop.run_step, [0]

  def counting(loop_, state, k, *args, **kwargs):
    now[0] = k
    return run_step(loop_, state, k, *args, **kwargs)

  def dies_in_step_3(self, problem, state, text):
    if now[0] == 3:  # every episode of the step has written a turn and waits for its reply
      raise _Killed()
    return step(self, problem, state, text)

  monkeypatch.setattr(env_base.Environment, "step", dies_in_step_3)
  monkeypatch.setattr(loop, "run_step", counting)
  with pytest.raises(_Killed):
    loop.train_and_evaluate(config(), resumed)
  monkeypatch.undo()
  assert test_util.saved_state(resumed)[0] == 2
  loop.train_and_evaluate(config(), resumed)
  a, b = test_util.saved_state(straight), test_util.saved_state(resumed)
  assert a[0] == b[0] == 4 and "horizon" in a[1]
  assert ("rollouts" in a[1]) == (schedule == "in_flight")
  for x, y in zip(jax.tree.leaves(a[1]), jax.tree.leaves(b[1]), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  rows_a = test_util.deterministic(read_jsonl(os.path.join(straight, "metrics.jsonl")))
  rows_b = test_util.deterministic(read_jsonl(os.path.join(resumed, "metrics.jsonl")))
  assert rows_a == rows_b


@pytest.mark.parametrize("fields,message", [
    (dict(rl__engine="static", rl__page_size=0), "config.rl.engine: an environment's episodes"),
    (dict(rl__page_size=0), "config.rl.engine: an environment's episodes"),
    (dict(rl__kv_pages=64), "config.rl.kv_pages: episodes size their page pool"),
    (dict(rl__max_staleness=1, rl__decode_budget=4, rl__admission="drop",
          rl__off_policy_correction="none"), "config.rl.admission: episodes in flight wait"),
    (dict(parallel__rollout_devices=1), "config.parallel.rollout_devices: episodes decode"),
    (dict(rl__observation_tokens=48), "config.rl.observation_tokens: an observation"),
    (dict(rl__turn_tokens=49), "config.rl.turn_tokens: must be a whole number in"),
    (dict(curriculum__horizon="tti"), "config.curriculum.horizon: must be one of"),
    (dict(curriculum__horizon_start=4), "config.curriculum.horizon_start: must be"),
])
def test_bad_episode_configs_fail_before_anything_is_built(fields, message):
  with pytest.raises(validation.ConfigError, match=message):
    validation.checked_task(_config(**fields))


def _loop(config, workdir):
  """(the loop's shared parts, a placed fresh run state with an empty pipeline), as the loop
  builds them."""
  run = prepare.prepare(config, workdir, log=lambda _: None)
  mesh = prepare.run_mesh(config)
  progs, state = loop.fresh_state(config, run, mesh)
  side = pipeline.rollout_side(config, prepare.rollout_mesh(config, mesh), mesh)
  steps = loop.Loop(config=config, run=run, programs=progs,
                    layout=batches.row_layout(config, mesh), ref=None,
                    root=prepare.rl_root_key(config), manager=None, merge=None,
                    log=lambda _: None, workdir=workdir, side=side)
  state = programs.place(progs, state)
  return steps, pipeline.attach(config, run, progs, side, steps.root, state)


@pytest.mark.slow
def test_partial_rollouts_of_episodes_decode_their_budget_across_turn_ends(tmp_path):
  """rl.decode_budget = 40 with 4 decode slots for 16 episodes: one call of the engine stops at
  the first turn end that leaves a slot idle, but a step's decoding answers that turn, queues its
  row again and goes on, round after round, until the 40 iterations are spent or no row can
  take the idle slot."""
  config = _config(steps=2, rl__max_staleness=1, rl__decode_budget=40, rl__decode_slots=4,
                   rl__off_policy_correction="none", curriculum__horizon="fixed")
  steps, state = _loop(config, _warm(config, str(tmp_path / "run")))
  params = pipeline.rollout_policy(steps, state)
  state = pipeline.queue(steps, state, params, 1, 0)
  engine = state.rollouts.engine
  first = int(engine.iterations)
  one_call = engines.run(steps, jax.tree.map(jnp.copy, engine), params, jnp.float32(1.0), 0,
                         budget=40, fed=True)
  state = pipeline.decode(steps, state, params, 0)
  rounds = int(state.rollouts.engine.iterations) - first
  assert int(one_call.iterations) - first < rounds
  pending = engines.pending(state.rollouts.engine, 1)
  assert rounds == 40 or not pending, (rounds, pending)
  rows = jax.device_get(engines.rows_of(state.rollouts.engine, 1))
  replies = (np.diff((rows.mask > 0).astype(int), axis=1) == 1).sum()  # turns after the first
  assert replies > 0


@pytest.mark.slow
def test_a_batch_marks_episodes_a_limit_cut_as_truncated_and_keeps_each_turns_reward(tmp_path):
  """Step 1's batch as the learn step takes it: an episode cut by its turn limit (or whose last
  turn the token limit cut) is truncated, one its environment ended is not; each turn's reward
  is there, adding up to the return."""
  config = _config(steps=1, curriculum__horizon="fixed", rl__max_turns=2)
  steps, state = _loop(config, _warm(config, str(tmp_path / "run")))
  params = pipeline.rollout_policy(steps, state)
  state, _ = pipeline.finish(steps, pipeline.queue(steps, state, params, 1, 0), params, 1, 0)
  batch, _ = pipeline.learn_batch(steps, state, 1, jax.random.PRNGKey(0))
  played = state.rollouts.records.played
  cut = np.asarray(played.cut[1 % pipeline.generations(config)])
  truncated = np.asarray(batch.truncated).reshape(-1)
  assert cut.any() and (truncated[cut]).all()
  rows = jax.device_get(engines.harvest(state.rollouts.engine, 0))
  last = [int(np.flatnonzero(m)[-1]) for m in rows.mask]
  unclosed = np.array([t[i] != steps.run.tokenizer.eos_id for t, i in zip(rows.tokens, last)])
  np.testing.assert_array_equal(truncated, cut | unclosed)
  turn_rewards = np.asarray(batch.turn_rewards)
  assert turn_rewards.shape[-1] == 2
  np.testing.assert_allclose(turn_rewards.sum(-1), np.asarray(batch.rewards), atol=1e-6)


def test_an_observation_cap_below_the_framing_fails_in_one_line_before_anything_compiles(
    tmp_path):
  """rl.observation_tokens too small for the template's framing of a reply: a one-line
  ConfigError from `prepare` once the tokenizer is known, before the SFT warm start and any
  compilation."""
  with pytest.raises(validation.ConfigError,
                     match=r"^config.rl.observation_tokens: 2 ids cannot hold an observation"):
    prepare.prepare(_config(rl__observation_tokens=2), str(tmp_path), log=lambda _: None)
  assert not os.path.exists(tmp_path / "sft")
