"""The adaptive sampling temperature (`rl.temperature_target` > 0): the learn step reads the
rollout's temperature from the train state and moves it from the entropy it measured; end to end,
the rollouts sample at it, it survives a resume, and changing it compiles no new sampler."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from configs import toy
from rl_curriculum import curriculum as cur
from rl_curriculum.rl import stability
from rl_curriculum.sampling import sampler
from rl_curriculum.train import loop
from rl_curriculum.train.durable import checkpointing
from rl_curriculum.train.learn import examples, objective, rl_step
from rl_curriculum.train.learn import view as view_lib
from rl_curriculum.train.learn.rl_types import LearnConfig
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.state import init_train_state
import test_util

P, G, TP, T, V = test_util.P, test_util.G, test_util.TP, test_util.T, test_util.V
# Float32 values of one program against another: the same operations, rounding apart.
TOL = dict(rtol=1e-5, atol=1e-6)


def _adaptive(**overrides) -> LearnConfig:
  """The controller on, its static start (config.temperature = 1) unlike the tested state's."""
  return test_util.learn_config(**{**dict(temperature_target=2.0, temperature_rate=0.2,
                                 temperature_min=0.05, temperature_max=4.0), **overrides})


def _batch(rewards):
  key = jax.random.PRNGKey(1)
  prompts = jnp.repeat(jax.random.randint(key, (P, TP), 4, V), G, axis=0)
  tokens = jax.random.randint(jax.random.fold_in(key, 1), (P * G, T), 4, V)
  mask = (np.arange(T)[None, :] < np.random.default_rng(2).integers(1, T + 1, P * G)[:, None])
  return examples.make_batch(prompts, tokens, rewards, mask=mask.astype(np.float32), num_arms=2)


def _learn(config, temperature, optimizer=None):
  """(train state at `temperature`, curriculum state, the jitted learn step, params)."""
  graphdef, params = test_util.tiny_model()
  optimizer = optimizer or optax.sgd(0.5)
  curriculum = cur.sec(2, batch_size=P, alpha=1.0)
  learn = test_util.make_learn(graphdef, optimizer, curriculum, config)
  state = init_train_state(params, optimizer, temperature=temperature)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 0, 1, 1, 0, 1]), jax.random.PRNGKey(0))
  return state, cur_state, learn, params


# --- The learn step -----------------------------------------------------------------------------


def test_traced_temperature_gives_the_loss_and_gradients_of_the_static_one():
  """The objective at a traced tau equals the objective of LearnConfig(temperature=tau)."""
  tau = 0.7
  graphdef, params = test_util.tiny_model()
  batch = _batch(test_util.LEARN_REWARDS.copy())
  static = test_util.learn_config(temperature=tau, minibatches=1, entropy_coef=0.1)
  traced = dataclasses.replace(static, temperature=1.0)
  scores = rl_step.score_groups(batch, stability.whitening_init(), static)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=None,
                            config=static, use_lora=False)

  def loss_and_grads(config, temperature):
    def loss(prm, temperature):
      return objective.policy_objective(prm, view, graphdef=graphdef, frozen=None, group=G,
                                        config=config, temperature=temperature)
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params, temperature)

  (loss_s, metrics_s), grads_s = loss_and_grads(static, None)
  (loss_t, metrics_t), grads_t = loss_and_grads(traced, jnp.float32(tau))
  np.testing.assert_allclose(float(loss_t), float(loss_s), **TOL)
  for name in ("entropy", "entropy_bonus", "pg_loss"):
    np.testing.assert_allclose(float(metrics_t[name]), float(metrics_s[name]), **TOL)
  for a, b in zip(jax.tree.leaves(grads_t), jax.tree.leaves(grads_s)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)
  # At temperature 1 the gradients differ: the comparison can tell the temperatures apart.
  (_, _), grads_1 = loss_and_grads(traced, None)
  assert max(float(jnp.max(jnp.abs(a - b)))
             for a, b in zip(jax.tree.leaves(grads_1), jax.tree.leaves(grads_s))) > 1e-4


@pytest.mark.slow
def test_learn_step_at_the_state_temperature_equals_the_static_step():
  """Every pass of the step (old policy, reference, loss, rollback's new policy) reads the train
  state's temperature: the update equals that of the static LearnConfig(temperature=tau)."""
  tau = 0.7
  passes = dict(minibatches=2, kl_coef=0.1, max_kl=5.0)
  static_state, cur_state, static_learn, params = _learn(
      test_util.learn_config(temperature=tau, **passes), temperature=tau)
  state, _, learn, _ = _learn(_adaptive(**passes), temperature=tau)
  batch, key = _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2)
  new_static, _, m_static = static_learn(static_state, cur_state, batch, key, None, params)
  new_state, _, m_adaptive = learn(state, cur_state, batch, key, None, params)
  for name in ("loss", "pg_loss", "entropy", "kl", "update_kl", "approx_kl", "grad_norm"):
    np.testing.assert_allclose(float(m_adaptive[name]), float(m_static[name]), err_msg=name,
                               **TOL)
  for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(new_static.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)
  assert float(m_adaptive["temperature"]) == np.float32(tau)
  # The static step leaves the state's temperature alone and reports none.
  assert float(new_static.temperature) == np.float32(tau) and "temperature" not in m_static


@pytest.mark.parametrize("target", test_util.fast_first([4.0, 0.05]))
def test_controller_moves_the_temperature_toward_the_target(target):
  """tau' = clip(tau exp(rate (target - H)), min, max) with H the step's "entropy" metric: up
  for a target above the policy's entropy, down for one below; one compiled program."""
  config = _adaptive(temperature_target=target)
  state, cur_state, learn, params = _learn(config, temperature=0.7)
  taus = [0.7]
  for i in range(3):
    state, cur_state, metrics = learn(state, cur_state, _batch(np.roll(test_util.LEARN_REWARDS.copy(), i, axis=1)),
                                      jax.random.PRNGKey(i), None, params)
    entropy = float(metrics["entropy"])
    assert 0.0 < entropy < np.log(V)
    assert float(metrics["temperature"]) == np.float32(taus[-1])
    expected = np.clip(taus[-1] * np.exp(0.2 * (target - entropy)), 0.05, 4.0)
    np.testing.assert_allclose(float(state.temperature), expected, rtol=1e-5)
    taus.append(float(state.temperature))
  steps = np.diff(taus)
  assert np.all(steps > 0) if target > 1 else np.all(steps < 0), taus
  assert learn.jitted._cache_size() == 1  # pylint: disable=protected-access


@pytest.mark.slow
def test_a_skipped_update_keeps_the_temperature():
  config = _adaptive(curriculum_feedback="reward")
  state, cur_state, learn, params = _learn(config, temperature=0.7)
  rewards = test_util.LEARN_REWARDS.copy()
  rewards[0, 0] = np.nan
  new_state, _, metrics = learn(state, cur_state, _batch(rewards), jax.random.PRNGKey(2), None,
                                params)
  assert float(metrics["update_skipped"]) == 1.0
  assert float(new_state.temperature) == np.float32(0.7)


def test_a_step_that_trained_no_token_keeps_the_temperature():
  """Every slot is padding (a filter found nothing): no entropy was measured, tau stays."""
  state, cur_state, learn, params = _learn(_adaptive(), temperature=0.7)
  batch = _batch(test_util.LEARN_REWARDS.copy())._replace(train_valid=jnp.zeros(P, bool))
  new_state, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, params)
  assert float(metrics["steps_taken"]) == 0.0
  assert float(new_state.temperature) == np.float32(0.7)


def test_the_controller_needs_a_temperature_in_the_state():
  state, cur_state, learn, params = _learn(_adaptive(), temperature=0.7)
  with pytest.raises(ValueError, match="TrainState.temperature"):
    learn(state._replace(temperature=None), cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2),
          None, params)


# --- End to end at toy size ---------------------------------------------------------------------

STEPS = 4
TARGET, RATE, T_MAX = 10.0, 0.02, 3.0  # a target above any entropy of a 64-token vocabulary


def _config(steps):
  c = toy.get_config()
  c.rl.steps = steps
  c.rl.temperature_target = TARGET
  c.rl.temperature_rate = RATE
  c.rl.temperature_max = T_MAX
  return c


def _rows(workdir):
  return [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["step"] >= 1]


def _deterministic(rows):
  """The rows without wall-clock measurements, which differ between runs by nature."""
  return [{k: v for k, v in r.items() if not k.startswith(("time/", "tokens_per_s"))}
          for r in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  """An uninterrupted run, every rollout's temperature and the sampler's programs recorded."""
  workdir = str(tmp_path_factory.mktemp("temperature") / "straight")
  test_util.copy_warm_start(test_util.shared_warm_start(_config(STEPS)), workdir)
  calls = []
  sample = sampler.sample

  def recording(*args, **kwargs):
    before = test_util.compiled_programs(sampler.prefill, sampler.decode)
    out = sample(*args, **kwargs)
    if not kwargs.get("greedy"):
      calls.append((float(kwargs["temperature"]), before,
                    test_util.compiled_programs(sampler.prefill, sampler.decode)))
    return out

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sampler, "sample", recording)
    loop.train_and_evaluate(_config(STEPS), workdir)
  return workdir, _rows(workdir), calls


@pytest.fixture(scope="module")
def resumed(straight, tmp_path_factory):
  """The same run stopped after step 2 and started again in its workdir."""
  workdir = str(tmp_path_factory.mktemp("temperature") / "resumed")
  test_util.copy_warm_start(straight[0], workdir)
  loop.train_and_evaluate(_config(2), workdir)
  loop.train_and_evaluate(_config(STEPS), workdir)
  return workdir, _rows(workdir)


@pytest.mark.slow
def test_temperature_rises_toward_a_high_target(straight):
  _, rows, calls = straight
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
  taus = [r["temperature"] for r in rows]
  assert taus[0] == 1.0  # rl.temperature
  assert np.all(np.diff(taus) > 0), taus
  for before, after in zip(rows, rows[1:]):  # the controller, fed the logged entropy
    expected = min(before["temperature"] * np.exp(RATE * (TARGET - before["entropy"])), T_MAX)
    np.testing.assert_allclose(after["temperature"], expected, rtol=1e-5)
  # The rollouts sampled at the logged temperatures, and the hotter policy is more random.
  np.testing.assert_allclose([c[0] for c in calls], taus, rtol=1e-6)
  assert rows[-1]["entropy"] > rows[0]["entropy"]
  assert all(r["skipped_total"] == 0 for r in rows)


@pytest.mark.slow
def test_a_new_temperature_compiles_no_sampler_program(straight):
  _, _, calls = straight
  assert len(calls) == STEPS
  for _, before, after in calls[1:]:
    assert after == before


@pytest.mark.slow
def test_resume_continues_from_the_saved_temperature(straight, resumed):
  assert _deterministic(resumed[1]) == _deterministic(straight[1])
  manager = checkpointing.make_manager(os.path.join(resumed[0], "checkpoints"))
  saved = manager.restore(manager.latest_step(),
                          args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  last = straight[1][-1]
  expected = min(last["temperature"] * np.exp(RATE * (TARGET - last["entropy"])), T_MAX)
  np.testing.assert_allclose(float(saved["state"]["train"]["temperature"]), expected, rtol=1e-5)
