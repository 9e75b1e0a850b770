"""The jitted learn step and its phases: feedback, view, objective, updates, rollback, metrics."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import scratch
from rl_curriculum import curriculum as cur
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import transformer
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import losses, stability
from rl_curriculum.sampling import sampler
from rl_curriculum.train.learn import examples, forward, objective, rl_step
from rl_curriculum.train.learn import view as view_lib
from rl_curriculum.train.setup import builders, validation
from rl_curriculum.train.state import init_train_state, init_value_head
import test_util

P, G, TP, T, V = test_util.P, test_util.G, test_util.TP, test_util.T, test_util.V


def _completion_logits(graphdef, params, prompt_tokens, prompt_mask, tokens):
  """Logits [B, T, V] predicting each completion token: one full forward pass, no group sharing."""
  hidden = forward.completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens)
  return transformer.logits_from_hidden(graphdef, params, hidden)


def _setup(optimizer=None, **overrides):
  graphdef, params = test_util.tiny_model()
  optimizer = optimizer or builders.build_optimizer(1e-2, max_grad_norm=1.0)
  curriculum = cur.sec(2, batch_size=P, alpha=1.0)
  config = test_util.learn_config(**overrides)
  learn = test_util.make_learn(graphdef, optimizer, curriculum, config)
  value = init_value_head(32) if config.algorithm == "ppo" else None
  state = init_train_state(params, optimizer, value)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 0, 1, 1, 0, 1]), jax.random.PRNGKey(0))
  return params, state, cur_state, learn


def _batch(rewards, train_groups=None, train_valid=None, mask=None, correct=None):
  key = jax.random.PRNGKey(1)
  s = rewards.shape[0]
  b = s * G
  # One prompt per group, repeated for its G rows; left padding of 0..s-1 slots.
  prompts = jnp.repeat(jax.random.randint(key, (s, TP), 4, V), G, axis=0)
  pad = jnp.repeat(jnp.arange(s) % TP, G)
  prompt_mask = jnp.arange(TP)[None, :] >= pad[:, None]
  tokens = jax.random.randint(jax.random.fold_in(key, 1), (b, T), 4, V)
  return examples.make_batch(jnp.where(prompt_mask, prompts, 0), tokens, rewards,
                             prompt_mask=prompt_mask, mask=mask, correct=correct, num_arms=2,
                             train_groups=train_groups, train_valid=train_valid)


def _rloo(rewards):
  r = np.asarray(rewards, np.float64)
  g = r.shape[1]
  return r - (r.sum(1, keepdims=True) - r) / (g - 1)


def _sec_q(rewards):
  """SEC's q after one update with alpha = 1: per arm (prompt index % 2), mean |RLOO advantage|."""
  adv = np.abs(_rloo(rewards))
  return [adv[arm::2].mean() for arm in (0, 1)]


def _tree_equal(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_update_changes_params_and_curriculum():
  params, state, cur_state, learn = _setup(kl_coef=1e-3)
  before = jax.tree.map(np.asarray, params)
  new_state, new_cur, metrics = learn(state, cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2),
                                      None, params)
  assert int(new_state.step) == 1 and int(new_state.skipped) == 0
  assert not _tree_equal(before, new_state.params)
  # SEC with alpha = 1: q = mean |RLOO advantage| of the arm. Arm 0 = prompts 0, 2; arm 1 = 1, 3.
  np.testing.assert_allclose(np.asarray(new_cur.q), _sec_q(test_util.LEARN_REWARDS.copy()), atol=1e-6)
  assert float(metrics["nonzero_adv_frac"]) == 0.5
  assert float(metrics["mixed_correct_frac"]) == 0.5
  assert float(metrics["steps_taken"]) == 2.0
  # The reference is the pre-update policy: KL is 0 in the first minibatch, > 0 after an update.
  assert 0.0 < float(metrics["kl"]) < 1.0


@pytest.mark.parametrize("whiten", test_util.fast_first([False, True]))
def test_non_finite_reward_rolls_back_params_curriculum_and_whitening(whiten):
  # The curriculum is fed the rewards here, so a NaN reaches SEC's Q unless the step is undone.
  params, state, cur_state, learn = _setup(whiten_rewards=whiten, curriculum_feedback="reward")
  first, cur_state, _ = learn(state, cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2), None,
                              params)
  before = jax.tree.map(np.asarray, (first.params, first.opt_state, first.whitening, cur_state))
  rewards = test_util.LEARN_REWARDS.copy()
  rewards[0, 0] = np.nan
  second, new_cur, metrics = learn(first, cur_state, _batch(rewards), jax.random.PRNGKey(3),
                                   None, params)
  assert float(metrics["update_skipped"]) == 1.0 and int(second.skipped) == 1
  assert int(second.step) == 2
  # Nothing of the step is kept: parameters, optimizer, whitening and the curriculum's state.
  assert _tree_equal(before, (second.params, second.opt_state, second.whitening, new_cur))
  assert np.all(np.isfinite(np.asarray(new_cur.q)))
  # Training continues: the next finite batch updates normally.
  third, newer_cur, metrics = learn(second, new_cur, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(4),
                                    None, params)
  assert float(metrics["update_skipped"]) == 0.0 and int(third.skipped) == 1
  assert np.all(np.isfinite(np.asarray(newer_cur.q)))


def test_minibatch_rollback_discards_only_the_optimizer_step_that_is_not_finite():
  """rollback = "minibatch": a NaN reward makes one of the two minibatches' loss NaN; that
  optimizer step is not applied and the other is (no copy of the train state is held for a
  rollback), while the curriculum state the NaN reached is discarded as under "step"."""
  params, state, cur_state, learn = _setup(rollback="minibatch", curriculum_feedback="reward")
  rewards = test_util.LEARN_REWARDS.copy()
  rewards[0, 0] = np.nan
  before = jax.tree.map(np.asarray, (params, cur_state))
  new_state, new_cur, metrics = learn(state, cur_state, _batch(rewards), jax.random.PRNGKey(2),
                                      None, params)
  assert float(metrics["steps_taken"]) == 1.0 and float(metrics["steps_discarded"]) == 1.0
  assert np.isfinite(float(metrics["loss"]))
  assert stability.all_finite((new_state.params, new_state.opt_state))
  assert not _tree_equal(before[0], new_state.params)
  assert float(metrics["update_skipped"]) == 1.0 and _tree_equal(before[1], new_cur)
  # Under rollback = "step" the same batch is discarded whole, parameters included.
  params, state, cur_state, learn = _setup(curriculum_feedback="reward")
  rolled, _, metrics = learn(state, cur_state, _batch(rewards), jax.random.PRNGKey(2), None,
                             params)
  assert float(metrics["update_skipped"]) == 1.0 and _tree_equal(before[0], rolled.params)
  assert float(metrics["steps_discarded"]) == 0.0


@pytest.mark.slow
def test_curriculum_sees_all_groups_policy_only_kept_ones():
  params, state, cur_state, learn = _setup(minibatches=1)
  # Six sampled groups; the filter kept groups 0 and 2 and could not fill two slots.
  rewards = np.concatenate([test_util.LEARN_REWARDS.copy(), np.array([[1, 0, 1, 0], [0, 1, 1, 1]], np.float32)])
  batch = _batch(rewards, train_groups=jnp.array([0, 2, 0, 0], jnp.int32),
                 train_valid=jnp.array([True, True, False, False]))
  _, new_cur, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, params)
  np.testing.assert_allclose(np.asarray(new_cur.q), _sec_q(rewards), atol=1e-6)
  np.testing.assert_allclose(float(metrics["nonzero_adv_frac"]), 4 / 6, rtol=1e-6)  # all six
  assert "kl" not in metrics  # kl_coef = 0: no reference pass, KL not measured
  # Padding slots carry no weight: the same update as training on groups 0 and 2 alone.
  _, _, alone = learn(*_setup(minibatches=1)[1:3], _batch(
      rewards, train_groups=jnp.array([0, 2, 0, 2], jnp.int32),
      train_valid=jnp.array([True, True, False, False])), jax.random.PRNGKey(2), None, params)
  np.testing.assert_allclose(float(metrics["loss"]), float(alone["loss"]), atol=1e-6)


@pytest.mark.slow
def test_curriculum_feedback_from_correctness_ignores_a_format_bonus():
  # Group 1 is all wrong; two of its completions earn the format bonus. GRPO gives that group the
  # same |advantage| as a group with real successes; its correctness advantages are 0.
  rewards = test_util.LEARN_REWARDS.copy()
  rewards[1] = [0.1, 0.0, 0.1, 0.0]
  correct = test_util.LEARN_REWARDS.copy() > 0.5
  q = {}
  for source in ("correct", "reward"):
    params, state, cur_state, learn = _setup(algorithm="grpo", curriculum_feedback=source)
    _, new_cur, metrics = learn(state, cur_state, _batch(rewards, correct=correct),
                                jax.random.PRNGKey(2), None, params)
    q[source] = np.asarray(new_cur.q)
  # Arm 1 holds groups 1 (all wrong) and 3 (all right): no correctness signal at all.
  assert q["correct"][1] == 0.0 and q["reward"][1] > 0.4
  np.testing.assert_allclose(q["correct"][0], q["reward"][0], rtol=1e-6)  # arm 0: no bonus
  assert float(metrics["nonzero_adv_frac"]) == 0.75  # the loss still trains on the format
  assert float(metrics["mixed_correct_frac"]) == 0.5


def test_ppo_step_trains_policy_and_value_head():
  params, state, cur_state, learn = _setup(algorithm="ppo", value_detach=False)
  new_state, new_cur, metrics = learn(state, cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2),
                                      None, params)
  assert float(metrics["update_skipped"]) == 0.0
  assert float(metrics["value_loss"]) > 0.0  # the head starts at 0, the returns are 0/1
  assert float(jnp.abs(new_state.value["w"]).sum()) > 0.0
  assert not _tree_equal(params, new_state.params)
  # The curriculum is fed group-relative (RLOO) advantages under PPO too.
  np.testing.assert_allclose(np.asarray(new_cur.q), _sec_q(test_util.LEARN_REWARDS.copy()), atol=1e-6)
  # The critic learns: on the same batch, its loss falls over a few steps.
  value_losses = [float(metrics["value_loss"])]
  for i in range(3):
    new_state, _, metrics = learn(new_state, cur_state, _batch(test_util.LEARN_REWARDS.copy()),
                                  jax.random.PRNGKey(3 + i), None, params)
    value_losses.append(float(metrics["value_loss"]))
  assert value_losses[-1] < value_losses[0], value_losses


@pytest.mark.slow
@pytest.mark.parametrize("detach", test_util.fast_first([True, False]))
def test_detached_value_head_leaves_the_policy_update_alone(detach):
  """With value_detach the value loss trains the head only: the policy's update does not depend
  on vf_coef. Without it, the value loss's gradient reaches the trunk."""
  updates = []
  for vf_coef in (0.5, 50.0):
    params, state, cur_state, learn = _setup(optax.sgd(0.1), algorithm="ppo", minibatches=1,
                                             value_detach=detach, vf_coef=vf_coef)
    # A trained-looking head, so that the value loss has a gradient through the hidden states.
    state = state._replace(value={"w": jnp.full((32,), 0.3), "b": jnp.zeros(())})
    new_state, _, _ = learn(state, cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2), None,
                            params)
    updates.append(new_state.params)
  assert _tree_equal(updates[0], updates[1]) == detach


@pytest.mark.slow
def test_gae_advantages_and_returns_match_a_float64_loop():
  """PPO's view: outcome reward on the last counted token (EOS mid-row), GAE over a trained
  value head's estimates, whitened over tokens; against a float64 loop."""
  graphdef, params = test_util.tiny_model()
  gamma, lam = 0.9, 0.8
  config = test_util.learn_config(algorithm="ppo", gamma=gamma, lam=lam)
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, T + 1, P * G)
  mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
  rewards = test_util.LEARN_REWARDS.copy()
  batch = _batch(rewards, mask=mask)
  value = {"w": jnp.asarray(rng.normal(0, 0.3, 32), jnp.float32), "b": jnp.float32(0.1)}
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=None,
                            config=config, use_lora=False, value=value)
  hidden = forward.completion_hidden(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                                     batch.tokens, G)
  values = np.asarray(forward.values_from_hidden(value, hidden), np.float64)
  adv = np.zeros((P * G, T))
  ret = np.zeros((P * G, T))
  for b in range(P * G):
    n = lengths[b]
    r = np.zeros(n)
    r[-1] = rewards.reshape(-1)[b]
    running = 0.0
    for t in reversed(range(n)):
      next_v = values[b, t + 1] if t + 1 < n else 0.0
      delta = r[t] + gamma * next_v - values[b, t]
      running = delta + gamma * lam * running
      adv[b, t] = running
      ret[b, t] = running + values[b, t]
  on = mask > 0
  whitened = np.where(on, (adv - adv[on].mean()) / (adv[on].std() + 1e-6), 0.0)
  np.testing.assert_allclose(np.asarray(view.values_old), values * mask, atol=1e-5)
  np.testing.assert_allclose(np.asarray(view.returns), ret, atol=1e-5)
  np.testing.assert_allclose(np.asarray(view.advantages), whitened, atol=1e-4)


def test_kl_is_zero_while_the_policy_equals_the_reference():
  params, state, cur_state, learn = _setup(minibatches=1, kl_coef=0.1)
  _, _, metrics = learn(state, cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2), None, params)
  assert abs(float(metrics["kl"])) < 1e-6  # one minibatch: the policy is the reference


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", test_util.fast_first(losses.AGGREGATIONS))
def test_kl_term_is_aggregated_like_the_policy_loss(aggregation):
  graphdef, params = test_util.tiny_model()
  config = test_util.learn_config(kl_coef=0.5, kl_estimator="k2", aggregation=aggregation)
  mask = np.ones((P * G, T), np.float32)
  mask[::3, 1:] = 0.0  # ragged rows: the aggregations differ
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  ref = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size).reshape(x.shape)), params)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=ref,
                            config=config, use_lora=False)
  loss, metrics = objective.policy_objective(params, view, graphdef=graphdef, frozen=None,
                                             group=G, config=config)
  logp = forward.completion_logprobs(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                                     batch.tokens)
  logp_ref = forward.completion_logprobs(graphdef, ref, batch.prompt_tokens, batch.prompt_mask,
                                         batch.tokens)
  per_token = 0.5 * np.square(np.asarray(logp, np.float64) - np.asarray(logp_ref, np.float64))
  if aggregation == "token_mean":
    expected = (per_token * mask).sum() / mask.sum()
  elif aggregation == "seq_mean_token_mean":
    expected = np.mean((per_token * mask).sum(1) / mask.sum(1))
  else:
    expected = (per_token * mask).sum() / (P * G * T)
  assert float(metrics["kl"]) > 1e-4
  np.testing.assert_allclose(float(metrics["kl"]), expected, rtol=1e-4)
  np.testing.assert_allclose(float(loss), float(metrics["pg_loss"]) + 0.5 * expected, rtol=1e-4)


def test_k1_as_a_loss_is_rejected():
  c = scratch.get_config()
  c.rl.kl_coef, c.rl.kl_estimator = 0.1, "k1"
  with pytest.raises(validation.ConfigError, match="config.rl.kl_estimator: k1 cannot be a loss"):
    validation.validate(c)


@pytest.mark.slow
def test_update_kl_measures_the_last_update_and_rolls_back_past_max_kl():
  # One optimizer step (on-policy): the pre-update ratio is 1 on every token, so only a KL taken
  # after the update can see it.
  lr = 2.0
  params, state, cur_state, learn = _setup(optax.sgd(lr), minibatches=1, max_kl=100.0)
  graphdef, _ = test_util.tiny_model()
  batch = _batch(test_util.LEARN_REWARDS.copy())
  new_state, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, params)
  assert float(metrics["approx_kl"]) == 0.0  # measured before the update
  logp_of = lambda prm: forward.completion_logprobs(  # pylint: disable=unnecessary-lambda-assignment
      graphdef, prm, batch.prompt_tokens, batch.prompt_mask, batch.tokens)
  expected = np.mean(np.asarray(logp_of(params)) - np.asarray(logp_of(new_state.params)))
  assert expected > 1e-3
  np.testing.assert_allclose(float(metrics["update_kl"]), expected, rtol=1e-4)
  # Above max_kl the update is discarded.
  params, state, cur_state, learn = _setup(optax.sgd(lr), minibatches=1,
                                           max_kl=float(expected) / 2)
  rolled, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, params)
  assert float(metrics["update_skipped"]) == 1.0
  assert _tree_equal(params, rolled.params)


def test_minibatch_of_padding_groups_takes_no_step():
  params, state, cur_state, learn = _setup(minibatches=2)
  stepped, cur_state, _ = learn(state, cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(2), None,
                                params)
  # Adam now carries momentum: a step on a zero gradient would still move every weight.
  padding = _batch(test_util.LEARN_REWARDS.copy(), train_valid=jnp.zeros(P, bool))
  before = jax.tree.map(np.asarray, (stepped.params, stepped.opt_state))  # (stepped is donated)
  after, _, metrics = learn(stepped, cur_state, padding, jax.random.PRNGKey(3), None, params)
  assert float(metrics["steps_taken"]) == 0.0 and float(metrics["update_skipped"]) == 0.0
  assert _tree_equal(before, (after.params, after.opt_state))


@pytest.mark.slow
def test_metrics_average_only_the_minibatches_that_stepped():
  # Groups 0 and 1 are real, 2 and 3 padding; with two minibatches of two groups the key below
  # puts both padding groups in one minibatch, which takes no step and must not halve the means.
  params, state, cur_state, learn = _setup(minibatches=2)
  key = jax.random.PRNGKey(2)
  first = np.asarray(objective.minibatch_rows(jax.random.fold_in(key, 0), P, G, 2))[0] // G
  real = np.isin(np.arange(P), first)
  batch = _batch(test_util.LEARN_REWARDS.copy(), train_valid=jnp.asarray(real))
  _, _, metrics = learn(state, cur_state, batch, key, None, params)
  assert float(metrics["steps_taken"]) == 1.0
  # The same two groups as one minibatch (two more padding slots): the same minibatch metrics.
  _, state_1, cur_state_1, learn_1 = _setup(minibatches=1)
  _, _, alone = learn_1(state_1, cur_state_1, batch._replace(
      train_groups=jnp.asarray(np.concatenate([np.flatnonzero(real)] * 2), jnp.int32),
      train_valid=jnp.asarray([True, True, False, False])), key, None, params)
  assert float(alone["steps_taken"]) == 1.0
  for name in ("loss", "entropy", "approx_kl", "ratio_mean"):
    np.testing.assert_allclose(float(metrics[name]), float(alone[name]), rtol=1e-5, atol=1e-7)
  assert float(metrics["entropy"]) > 1.0 and float(metrics["ratio_mean"]) == 1.0


@pytest.mark.slow
def test_tokens_after_a_stop_change_nothing():
  """Masks that end mid-row (EOS at different positions): the padding tokens after a row's stop
  change neither the loss nor the update."""
  rng = np.random.default_rng(1)
  lengths = rng.integers(1, T + 1, P * G)
  mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  noise = jax.random.randint(jax.random.PRNGKey(9), batch.tokens.shape, 4, V)
  other = batch._replace(tokens=jnp.where(mask > 0, batch.tokens, noise))
  assert not np.array_equal(np.asarray(other.tokens), np.asarray(batch.tokens))
  results = []
  for b in (batch, other):
    params, state, cur_state, learn = _setup(optax.sgd(0.5), minibatches=2, kl_coef=0.1)
    new_state, _, metrics = learn(state, cur_state, b, jax.random.PRNGKey(2), None, params)
    results.append((new_state.params, float(metrics["loss"]), float(metrics["kl"])))
  np.testing.assert_allclose(results[0][1:], results[1][1:], rtol=1e-6, atol=1e-7)
  for x, y in zip(jax.tree.leaves(results[0][0]), jax.tree.leaves(results[1][0])):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_epochs_keep_logp_old_frozen_and_clipping_engages():
  graphdef, params = test_util.tiny_model()
  config = test_util.learn_config(epochs=2, minibatches=1)
  optimizer = optax.sgd(20.0)
  batch = _batch(test_util.LEARN_REWARDS.copy())
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=None,
                            config=config, use_lora=False)
  before = forward.completion_logprobs(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                                       batch.tokens)
  np.testing.assert_allclose(np.asarray(view.logp_old), np.asarray(before), atol=1e-6)
  new, _, metrics, logp_old = objective.minibatch_updates(
      params, optimizer.init(params), view, jax.random.PRNGKey(0), graphdef=graphdef, frozen=None,
      group=G, optimizer=optimizer, config=config)
  np.testing.assert_array_equal(np.asarray(logp_old), np.asarray(view.logp_old))
  assert float(metrics["steps_taken"]) == 2.0
  # Epoch 1 starts at ratio 1 (no clipping); epoch 2 compares the moved policy with the frozen
  # old one, and the large step pushes ratios out of [0.8, 1.2].
  assert float(metrics["clipfrac_low"]) + float(metrics["clipfrac_high"]) > 0.0
  assert float(metrics["approx_kl"]) > 0.0
  assert not _tree_equal(params, new)


@pytest.mark.parametrize("level", test_util.fast_first(["token", "sequence"]))
@pytest.mark.parametrize("aggregation", test_util.fast_first(losses.AGGREGATIONS))
def test_one_minibatch_step_equals_the_textbook_update(level, aggregation):
  """One epoch of one minibatch skips the old policy's forward pass (logp_old = stop_gradient of
  the loss's own log-probs); the update must equal the textbook one computed here with an
  explicit old-policy pass: the same loss, gradient norm and SGD parameters, for every level and
  aggregation, on ragged masks."""
  lr = 0.5
  params, state, cur_state, learn = _setup(optax.sgd(lr), minibatches=1, level=level,
                                           aggregation=aggregation)
  rng = np.random.default_rng(2)
  mask = (np.arange(T)[None, :] < rng.integers(1, T + 1, P * G)[:, None]).astype(np.float32)
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  new_state, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, params)

  graphdef, _ = test_util.tiny_model()
  adv_tokens = jnp.asarray(np.repeat(_rloo(test_util.LEARN_REWARDS.copy()).reshape(P * G, 1), T, axis=1) * mask,
                           jnp.float32)

  def logp_of(prm):
    return forward.completion_logprobs(graphdef, prm, batch.prompt_tokens, batch.prompt_mask,
                                       batch.tokens)

  logp_old = jax.lax.stop_gradient(logp_of(params))

  def loss_fn(prm):
    loss, _ = losses.policy_loss(logp_of(prm), logp_old, adv_tokens, batch.mask, eps_low=0.2,
                                 eps_high=0.2, level=level, aggregation=aggregation,
                                 max_tokens=T)
    return loss

  loss, grads = jax.value_and_grad(loss_fn)(params)
  np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(float(metrics["grad_norm"]), float(optax.tree.norm(grads)),
                             rtol=1e-4)
  expected = jax.tree.map(lambda p, g: p - lr * g, params, grads)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(new_state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_grouped_completion_logprobs_equal_the_per_row_pass():
  """The learn step's grouped pass (each group's prompt once) gives the per-row pass's log-probs
  and gradients."""
  graphdef, params = test_util.tiny_model()
  batch = _batch(test_util.LEARN_REWARDS.copy())
  weights = jax.random.normal(jax.random.PRNGKey(3), batch.tokens.shape)

  def loss(prm, group):
    logp = forward.completion_logprobs(graphdef, prm, batch.prompt_tokens, batch.prompt_mask,
                                       batch.tokens, group)
    return jnp.sum(logp * weights), logp

  (value_g, logp_g), grads_g = jax.value_and_grad(loss, has_aux=True)(params, G)
  (value_1, logp_1), grads_1 = jax.value_and_grad(loss, has_aux=True)(params, 1)
  np.testing.assert_allclose(logp_g, logp_1, atol=1e-5, rtol=0)
  np.testing.assert_allclose(value_g, value_1, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_g), jax.tree.leaves(grads_1)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def _lora_model(dtype="float32", b_scale=0.0):
  graphdef, params = test_util.tiny_model(dtype)
  model = nnx.merge(graphdef, params)
  lora_lib.attach(model, lora_lib.LoRAConfig(rank=4, alpha=8.0, targets=("q", "v", "up")),
                  rngs=nnx.Rngs(1))
  graphdef, adapters, base = lora_lib.split(model)
  if b_scale:  # adapters that already moved away from B = 0
    adapters = jax.tree.map(lambda x: x + b_scale * jnp.cos(jnp.arange(x.size)).reshape(x.shape),
                            adapters)
  return graphdef, adapters, base


@pytest.mark.slow
def test_shared_prefix_pass_with_lora_in_bfloat16_is_as_exact_as_the_per_row_pass():
  """In bfloat16 the grouped pass (prompt once per group) and the per-row pass differ by
  rounding; the grouped one must be no further from the float32 answer than the per-row one."""
  batch = _batch(test_util.LEARN_REWARDS.copy())
  out = {}
  for dtype in ("float32", "bfloat16"):
    graphdef, adapters, base = _lora_model(dtype, b_scale=0.05)
    for group in (1, G):
      out[dtype, group] = np.asarray(forward.completion_logprobs(
          graphdef, (adapters, base), batch.prompt_tokens, batch.prompt_mask, batch.tokens,
          group), np.float64)
  np.testing.assert_allclose(out["float32", G], out["float32", 1], atol=1e-5)
  exact = out["float32", 1]
  err_grouped = np.abs(out["bfloat16", G] - exact).max()
  err_rows = np.abs(out["bfloat16", 1] - exact).max()
  assert err_grouped <= 2.0 * err_rows + 1e-3, (err_grouped, err_rows)
  assert err_grouped < 0.1  # bfloat16 keeps 8 bits of mantissa: log-probs within a tenth of a nat


@pytest.mark.slow
def test_lora_with_kl_trains_only_adapters_against_the_base_model():
  graphdef, adapters, base = _lora_model()
  optimizer = optax.adam(5e-2)
  curriculum = cur.sec(2, batch_size=P, alpha=1.0)
  learn = test_util.make_learn(graphdef, optimizer, curriculum,
                               test_util.learn_config(kl_coef=0.1, minibatches=2), use_lora=True)
  state = init_train_state(adapters, optimizer)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 1] * 3), jax.random.PRNGKey(0))
  batch = _batch(test_util.LEARN_REWARDS.copy())
  base_before = jax.tree.map(np.asarray, base)
  new_state, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), base, None)
  assert _tree_equal(base_before, base)
  assert not _tree_equal(adapters, new_state.params)
  # The reference is the adapters switched off, i.e. the base model: B starts at 0, so the first
  # minibatch's KL is 0 and the mean over two minibatches is that of the second, after a step.
  assert float(metrics["kl"]) > 0.0
  config = test_util.learn_config(kl_coef=0.1)
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  view = view_lib.train_view(batch, scores, (new_state.params, base), graphdef=graphdef,
                            ref_params=None, config=config, use_lora=True)
  plain_graphdef, plain_params = test_util.tiny_model()
  base_logp = forward.completion_logprobs(plain_graphdef, plain_params, batch.prompt_tokens,
                                          batch.prompt_mask, batch.tokens)
  np.testing.assert_allclose(np.asarray(view.logp_ref), np.asarray(base_logp), atol=1e-5)


def test_learner_logprobs_are_those_of_the_sampling_temperature():
  """Tokens drawn at temperature 0.7: the sampler reports log_softmax(logits / 0.7) of the drawn
  tokens, and the learner's old log-probs equal the sampler's."""
  tau = 0.7
  graphdef, params = test_util.tiny_model()
  batch = _batch(test_util.LEARN_REWARDS.copy())
  rollout = sampler.sample(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                           jax.random.PRNGKey(5), max_new_tokens=T, eos_id=V, temperature=tau,
                           group=G)
  logits = _completion_logits(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                              rollout.tokens)
  expected = jnp.take_along_axis(jax.nn.log_softmax(logits / tau, axis=-1),
                                 rollout.tokens[..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(np.asarray(rollout.logprobs), np.asarray(expected), atol=1e-5)
  config = test_util.learn_config(temperature=tau)  # two minibatches: the old policy's pass runs
  batch = batch._replace(tokens=rollout.tokens, mask=rollout.mask,
                         sampler_logprobs=rollout.logprobs)
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=None,
                            config=config, use_lora=False)
  np.testing.assert_allclose(np.asarray(view.logp_old), np.asarray(rollout.logprobs), atol=1e-5)
  # The temperature-1 log-probs of the same tokens differ: the test can tell the difference.
  untempered = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1),
                                   rollout.tokens[..., None], axis=-1)[..., 0]
  assert np.abs(np.asarray(view.logp_old) - np.asarray(untempered)).max() > 1e-2


def test_one_minibatch_ratio_guard_and_metrics():
  params, state, cur_state, learn = _setup(minibatches=1, ratio_guard=1.0)
  batch = _batch(test_util.LEARN_REWARDS.copy())
  logp = forward.completion_logprobs(*test_util.tiny_model(), batch.prompt_tokens,
                                     batch.prompt_mask, batch.tokens)
  # The sampler's log-probs agree on the first completion token and are 3 nats off elsewhere.
  sampler_logp = logp.at[:, 1:].add(-3.0)
  _, _, metrics = learn(state, cur_state, batch._replace(sampler_logprobs=sampler_logp),
                        jax.random.PRNGKey(2), None, params)
  np.testing.assert_allclose(float(metrics["ratio_guard_frac"]), (T - 1) / T, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["sampler_logp_gap"]), 0.0, atol=1e-5)
  # The completion length counts the rollout's tokens, whatever the guard dropped.
  np.testing.assert_allclose(float(metrics["completion_len"]), T, rtol=1e-6)


@pytest.mark.slow
def test_make_learn_compiles_once_across_steps():
  params, state, cur_state, learn = _setup(minibatches=2, kl_coef=0.1, max_kl=5.0)
  for i in range(3):
    rewards = np.roll(test_util.LEARN_REWARDS.copy(), i, axis=1)
    state, cur_state, _ = learn(state, cur_state, _batch(rewards), jax.random.PRNGKey(i), None,
                                params)
  assert learn.jitted._cache_size() == 1  # pylint: disable=protected-access


def _ragged_mask(seed=2):
  rng = np.random.default_rng(seed)
  return (np.arange(T)[None, :] < rng.integers(1, T + 1, P * G)[:, None]).astype(np.float32)


def _step_with(optimizer, **overrides):
  params, state, cur_state, learn = _setup(optimizer, **overrides)
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=_ragged_mask())
  new_state, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, params)
  return new_state, metrics


@pytest.mark.parametrize("microbatches,level",
                         test_util.fast_first([(2, "token"), (4, "sequence"), (8, "token")]))
@pytest.mark.slow
@pytest.mark.parametrize("aggregation", test_util.fast_first(losses.AGGREGATIONS))
def test_gradient_accumulation_equals_one_pass_over_the_minibatch(microbatches, level,
                                                                  aggregation):
  """k microbatches of one minibatch give the loss, gradient and SGD parameters of one pass over
  it, for every aggregation (the minibatch's normaliser, not a mean of microbatch means), with
  ragged masks whose microbatches hold different numbers of tokens; with 8 microbatches of 4
  prompts each group's completions are split in halves over two microbatches."""
  sgd = optax.sgd(0.5)
  one, m_one = _step_with(sgd, minibatches=1, level=level, aggregation=aggregation, kl_coef=0.1)
  acc, m_acc = _step_with(sgd, minibatches=1, microbatches=microbatches, level=level,
                          aggregation=aggregation, kl_coef=0.1)
  for name in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "ratio_max", "clipfrac_high"):
    np.testing.assert_allclose(float(m_acc[name]), float(m_one[name]), rtol=1e-5, atol=1e-7,
                               err_msg=name)
  for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(one.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_gradient_accumulation_is_not_a_mean_of_microbatch_means():
  """Guards the test above: averaging per-microbatch token means differs on these ragged masks,
  so the equality there is not a coincidence of equal token counts."""
  mask = jnp.asarray(_ragged_mask())
  halves = mask.reshape(2, -1, T)
  per_token = jnp.arange(mask.size, dtype=jnp.float32).reshape(mask.shape)
  whole = losses.aggregate(per_token, mask)
  mean_of_means = jnp.mean(jnp.stack([losses.aggregate(x, m) for x, m in
                                      zip(per_token.reshape(2, -1, T), halves)]))
  assert abs(float(whole) - float(mean_of_means)) > 1e-2
  shared = losses.aggregation_normaliser(mask, "token_mean")
  summed = sum(losses.aggregate(x, m, normaliser=shared)
               for x, m in zip(per_token.reshape(2, -1, T), halves))
  np.testing.assert_allclose(float(summed), float(whole), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", test_util.fast_first(["rloo", "ppo"]))
def test_microbatches_with_several_minibatches_match_the_unaccumulated_step(algorithm):
  """Two minibatches (old-policy pass, PPO's value loss and KL reference) with two microbatches
  each, the constant passes in four row blocks: the same update as without accumulation (SGD:
  Adam turns rounding-level gradients into whole learning-rate steps, see docs/scaling.md)."""
  sgd = optax.sgd(0.5)
  one, m_one = _step_with(sgd, minibatches=2, algorithm=algorithm, kl_coef=0.1)
  acc, m_acc = _step_with(sgd, minibatches=2, microbatches=2, algorithm=algorithm, kl_coef=0.1)
  for name in ("loss", "grad_norm") + (("value_loss",) if algorithm == "ppo" else ()):
    np.testing.assert_allclose(float(m_acc[name]), float(m_one[name]), rtol=1e-5, atol=1e-7,
                               err_msg=name)
  for a, b in zip(jax.tree.leaves((acc.params, acc.value)),
                  jax.tree.leaves((one.params, one.value))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_chunked_head_in_the_learn_step_changes_nothing():
  """logits_chunk = 2 of T = 3 positions (one full chunk and a padded one), with an old-policy
  pass, a reference and the rollback's KL pass: the update of the unchunked head."""
  sgd = optax.sgd(0.5)
  full, m_full = _step_with(sgd, minibatches=2, kl_coef=0.1, max_kl=5.0, logits_chunk=0)
  chunked, m_chunked = _step_with(sgd, minibatches=2, kl_coef=0.1, max_kl=5.0, logits_chunk=2)
  for name in ("loss", "kl", "entropy", "update_kl"):
    np.testing.assert_allclose(float(m_chunked[name]), float(m_full[name]), rtol=1e-5,
                               atol=1e-7, err_msg=name)
  for a, b in zip(jax.tree.leaves(chunked.params), jax.tree.leaves(full.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_microbatches_must_split_the_minibatch_into_whole_groups_or_equal_parts_of_each():
  params, state, cur_state, learn = _setup(minibatches=2, microbatches=3)  # 2 prompts, 3 parts
  with pytest.raises(ValueError, match="do not split into 3 blocks"):
    learn(state, cur_state, _batch(test_util.LEARN_REWARDS.copy()), jax.random.PRNGKey(0), None, params)
  with pytest.raises(ValueError, match="do not split into 3 blocks"):
    forward.block_group(2 * G, G, 3)
  assert [forward.block_group(2 * G, G, n) for n in (1, 2, 4, 8)] == [G, G, G // 2, G // 4]


# --- Loss-side methods: dual clip, entropy bonus, TIS, CAPO, GRPO's std, Dr. GRPO, KL reward ----


def _view(config, batch, params, graphdef, ref_params=None):
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  value = init_value_head(32) if config.algorithm == "ppo" else None
  return view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=ref_params,
                            config=config, use_lora=False, value=value)


def _objective(config, view, params, graphdef):
  return objective.policy_objective(params, view, graphdef=graphdef, frozen=None, group=G,
                                    config=config)


def _token_advantages(mask):
  return np.repeat(_rloo(test_util.LEARN_REWARDS.copy()).reshape(P * G, 1), T, axis=1) * mask


@pytest.mark.slow
def test_dual_clip_bounds_the_loss_of_negative_advantages():
  """Old log-probs 3 nats below the policy's: ratio e^3 on every token. Positive advantages are
  clipped at 1 + eps_high; negative ones would cost -e^3 A, and the dual clip caps them at -3 A."""
  graphdef, params = test_util.tiny_model()
  mask = _ragged_mask()
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  config = test_util.learn_config(dual_clip=3.0)  # two minibatches: the view has old log-probs
  view = _view(config, batch, params, graphdef)
  view = view._replace(logp_old=view.logp_old - 3.0)
  loss, metrics = _objective(config, view, params, graphdef)
  adv = _token_advantages(mask)
  per_token = np.where(adv < 0, -3.0 * adv, -1.2 * adv)
  np.testing.assert_allclose(float(loss), (per_token * mask).sum() / mask.sum(), rtol=1e-4)
  negative = (adv < 0) & (mask > 0)
  np.testing.assert_allclose(float(metrics["dual_clipfrac"]), negative.sum() / mask.sum(),
                             rtol=1e-6)
  off, off_metrics = _objective(test_util.learn_config(), view, params, graphdef)
  assert float(off_metrics["dual_clipfrac"]) == 0.0 and float(off) > float(loss)


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", test_util.fast_first(losses.AGGREGATIONS))
def test_entropy_bonus_lowers_the_loss_by_coef_times_the_aggregated_entropy(aggregation):
  graphdef, params = test_util.tiny_model()
  mask = _ragged_mask()
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  config = test_util.learn_config(minibatches=1, entropy_coef=0.1, aggregation=aggregation)
  view = _view(config, batch, params, graphdef)
  loss, metrics = _objective(config, view, params, graphdef)
  logits = _completion_logits(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                              batch.tokens)
  logits = np.asarray(logits, np.float64)
  logz = logits.max(-1, keepdims=True)
  logz = logz + np.log(np.exp(logits - logz).sum(-1, keepdims=True))
  entropy = -(np.exp(logits - logz) * (logits - logz)).sum(-1)
  if aggregation == "token_mean":
    expected = (entropy * mask).sum() / mask.sum()
  elif aggregation == "seq_mean_token_mean":
    expected = np.mean((entropy * mask).sum(1) / mask.sum(1))
  else:
    expected = (entropy * mask).sum() / (P * G * T)
  np.testing.assert_allclose(float(metrics["entropy_bonus"]), expected, rtol=1e-4)
  np.testing.assert_allclose(float(loss), float(metrics["pg_loss"]) - 0.1 * expected, rtol=1e-4)
  # The bonus has a gradient: the policy's gradient moves.
  def grad(c):
    return jax.grad(lambda prm: _objective(c, view, prm, graphdef)[0])(params)

  with_bonus = grad(config)
  without = grad(test_util.learn_config(minibatches=1, aggregation=aggregation))
  assert float(optax.tree.norm(jax.tree.map(jnp.subtract, with_bonus, without))) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", test_util.fast_first(losses.AGGREGATIONS))
def test_entropy_bonus_accumulates_over_microbatches_and_chunks(aggregation):
  """Two microbatches and a chunked head (2 of T = 3 positions): the update of one pass."""
  sgd = optax.sgd(0.5)
  one, m_one = _step_with(sgd, minibatches=1, aggregation=aggregation, entropy_coef=0.5)
  acc, m_acc = _step_with(sgd, minibatches=1, microbatches=2, logits_chunk=2,
                          aggregation=aggregation, entropy_coef=0.5)
  for name in ("loss", "entropy_bonus", "grad_norm"):
    np.testing.assert_allclose(float(m_acc[name]), float(m_one[name]), rtol=1e-5, atol=1e-7,
                               err_msg=name)
  for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(one.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cap,weight", test_util.fast_first([(2.0, 1.5), (1.2, 1.2)]))
def test_truncated_importance_weights_scale_the_loss(cap, weight):
  """The sampler put every token at 1/1.5 of the trainer's probability: w = min(1.5, cap)."""
  graphdef, params = test_util.tiny_model()
  mask = _ragged_mask()
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  logp = forward.completion_logprobs(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                                     batch.tokens)
  batch = batch._replace(sampler_logprobs=logp - np.log(1.5))
  config = test_util.learn_config(minibatches=1, tis_cap=cap)
  view = _view(config, batch, params, graphdef)
  loss, metrics = _objective(config, view, params, graphdef)
  base, _ = _objective(test_util.learn_config(minibatches=1), view, params, graphdef)
  assert abs(float(base)) > 1e-3
  np.testing.assert_allclose(float(loss), weight * float(base), rtol=1e-4)
  np.testing.assert_allclose(float(metrics["tis_weight_mean"]), weight, rtol=1e-4)
  assert float(metrics["tis_truncated_frac"]) == (1.0 if cap < 1.5 else 0.0)


def test_decoupled_objective_with_interpolated_proximal_policy_matches_float64():
  """proximal="loglinear" with stale tokens (versions 0-3 behind the update's start) and a
  behaviour-weight cap: loss = -token_mean(w min(r A, clip(r) A)) with log pi_prox = log mu +
  s / (s + 1) (log pi - log mu), w = min(pi_prox / mu, cap), r = pi / pi_prox, by hand in float64.
  No old-policy pass runs."""
  graphdef, params = test_util.tiny_model()
  mask = _ragged_mask()
  rng = np.random.default_rng(5)
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  logp = np.asarray(forward.completion_logprobs(graphdef, params, batch.prompt_tokens,
                                                batch.prompt_mask, batch.tokens, G), np.float64)
  mu = logp + rng.normal(scale=0.5, size=logp.shape)
  versions = rng.integers(4, 8, size=logp.shape).astype(np.int32)   # the update starts at 7
  batch = batch._replace(sampler_logprobs=jnp.asarray(mu, jnp.float32),
                         versions=jnp.asarray(versions))
  cap, eps = 1.5, 0.2
  config = test_util.learn_config(minibatches=1, proximal="loglinear", tis_cap=cap)
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=None,
                             config=config, use_lora=False, version=jnp.asarray(7, jnp.int32))
  assert view.logp_old is None and view.staleness is not None
  loss, _ = _objective(config, view, params, graphdef)

  mu = np.asarray(batch.sampler_logprobs, np.float64)
  s = 7.0 - versions
  prox = mu + s / (s + 1) * (logp - mu)
  w = np.minimum(np.exp(prox - mu), cap)
  r = np.exp(logp - prox)
  adv = np.asarray(view.advantages, np.float64)
  m = np.asarray(view.mask, np.float64)
  per_token = -w * np.minimum(r * adv, np.clip(r, 1 - eps, 1 + eps) * adv)
  expected = (per_token * m).sum() / m.sum()
  assert abs(expected) > 1e-3 and np.any(s > 0)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-4, atol=1e-5)


def test_decoupled_objective_with_recomputed_proximal_policy_matches_float64():
  """Two minibatches (the proximal policy is recomputed at the update's start) and a behaviour
  policy mu that is not the proximal one (stale tokens): the policy, moved away from the
  proximal one, pays -token_mean(min(pi_prox / mu, cap) min(r A, clip(r) A)), r = pi / pi_prox,
  by hand in float64 (AReaL's decoupled PPO objective)."""
  graphdef, params = test_util.tiny_model()
  rng = np.random.default_rng(7)
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=_ragged_mask())
  logp_prox = np.asarray(forward.completion_logprobs(
      graphdef, params, batch.prompt_tokens, batch.prompt_mask, batch.tokens, G), np.float64)
  mu = logp_prox + rng.normal(scale=0.4, size=logp_prox.shape)
  batch = batch._replace(sampler_logprobs=jnp.asarray(mu, jnp.float32),
                         versions=jnp.asarray(rng.integers(0, 3, size=mu.shape), jnp.int32))
  cap, eps_low, eps_high = 1.5, 0.2, 0.28
  config = test_util.learn_config(tis_cap=cap, eps_low=eps_low, eps_high=eps_high)
  view = _view(config, batch, params, graphdef)
  assert view.logp_old is not None and view.staleness is None
  moved = jax.tree.map(lambda x: x + 0.05 * jnp.asarray(rng.normal(size=x.shape), x.dtype),
                       params)
  loss, _ = _objective(config, view, moved, graphdef)

  logp = np.asarray(forward.completion_logprobs(
      graphdef, moved, batch.prompt_tokens, batch.prompt_mask, batch.tokens, G), np.float64)
  prox = np.asarray(view.logp_old, np.float64)
  np.testing.assert_allclose(prox, logp_prox, atol=1e-5)
  w = np.minimum(np.exp(prox - np.asarray(batch.sampler_logprobs, np.float64)), cap)
  r = np.exp(logp - prox)
  adv = np.asarray(view.advantages, np.float64)
  m = np.asarray(view.mask, np.float64)
  per_token = -w * np.minimum(r * adv, np.clip(r, 1 - eps_low, 1 + eps_high) * adv)
  expected = (per_token * m).sum() / m.sum()
  assert abs(expected) > 1e-3 and np.abs(r - 1)[m > 0].max() > eps_high  # clipping matters
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-5)


def test_learn_logs_the_staleness_of_the_trained_tokens():
  """Tokens drawn by versions 4-7 learned from version 7 (the train state's counter): the
  largest and mean staleness over the counted tokens of the trained groups, by hand; a batch
  without versions logs none."""
  _, state, cur_state, learn = _setup(minibatches=1)
  mask = _ragged_mask()
  versions = np.random.default_rng(3).integers(4, 8, size=mask.shape).astype(np.int32)
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask, train_groups=np.array([0, 2], np.int32),
                 train_valid=np.array([True, True]))
  state = state._replace(step=jnp.asarray(7, jnp.int32))
  _, _, metrics = learn(state, cur_state, batch._replace(versions=jnp.asarray(versions)),
                        jax.random.PRNGKey(0), None, None)
  rows = np.concatenate([np.arange(0, G), np.arange(2 * G, 3 * G)])
  counted = np.asarray(mask)[rows] > 0
  staleness = (7 - versions[rows])[counted]
  assert float(metrics["staleness_max"]) == staleness.max()
  np.testing.assert_allclose(float(metrics["staleness_mean"]), staleness.mean(), rtol=1e-6)
  _, state, cur_state, learn = _setup(minibatches=1)
  _, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(0), None, None)
  assert "staleness_max" not in metrics


def test_loglinear_proximal_on_synchronous_rollouts_uses_the_samplers_logprobs():
  """Without versions (every token sampled by the policy the step starts from) the interpolated
  proximal policy is the sampler's: two minibatches of loglinear equal two minibatches against
  old log-probs set to the sampler's, with no old-policy pass."""
  graphdef, params = test_util.tiny_model()
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=_ragged_mask())
  logp = forward.completion_logprobs(graphdef, params, batch.prompt_tokens, batch.prompt_mask,
                                     batch.tokens, G)
  batch = batch._replace(sampler_logprobs=logp - 0.1)
  config = test_util.learn_config(minibatches=2, proximal="loglinear")
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  view = view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=None,
                             config=config, use_lora=False, version=jnp.asarray(3, jnp.int32))
  assert view.logp_old is None
  np.testing.assert_array_equal(view.staleness, 0.0)
  explicit = view._replace(staleness=None, logp_old=view.sampler_logprobs)
  optimizer = builders.build_optimizer(1e-2, max_grad_norm=1.0)
  run = lambda v: objective.minibatch_updates(
      params, optimizer.init(params), v, jax.random.PRNGKey(0), graphdef=graphdef, frozen=None,
      group=G, optimizer=optimizer, config=config)
  a, b = run(view), run(explicit)
  np.testing.assert_allclose(float(a[2]["loss"]), float(b[2]["loss"]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(a[3], np.asarray(view.sampler_logprobs), atol=1e-6)
  for x, y in zip(jax.tree.leaves(a[0]), jax.tree.leaves(b[0])):   # two Adam steps (rounding)
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_capo_trains_on_positive_advantages_first_then_phases_negatives_in():
  # On-policy (ratio 1): the loss is -token_mean(w A), with w = 0 on A < 0 in the first phase.
  mask = _ragged_mask()
  adv = _token_advantages(mask)
  weights = {}
  params, state, cur_state, learn = _setup(minibatches=1, capo_positive_steps=2,
                                           capo_ramp_steps=2)
  for step in range(4):
    batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
    state, cur_state, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(step), None,
                                      params)
    weights[step] = float(metrics["capo_negative_weight"])
    if step == 0:
      expected = -(np.maximum(adv, 0) * mask).sum() / mask.sum()
      np.testing.assert_allclose(float(metrics["loss"]), expected, rtol=1e-4)
  assert weights == {0: 0.0, 1: 0.0, 2: 0.5, 3: 1.0}
  # Off (both 0): no weighting and no metric.
  view = _view(test_util.learn_config(), _batch(test_util.LEARN_REWARDS.copy()), params, test_util.tiny_model()[0])
  same, extra = view_lib.advantage_curriculum(view, jnp.zeros((), jnp.int32),
                                              test_util.learn_config())
  assert same is view and not extra


def test_grpo_sample_std_shrinks_the_advantages_by_sqrt_of_n_minus_1_over_n():
  batch = _batch(test_util.LEARN_REWARDS.copy())
  scores = {std: rl_step.score_groups(batch, stability.whitening_init(),
                                      test_util.learn_config(algorithm="grpo", grpo_std=std))
            for std in adv_lib.GRPO_STDS}
  pop, sample = (np.asarray(scores[s].advantages) for s in ("population", "sample"))
  assert np.abs(pop).max() > 0.5
  np.testing.assert_allclose(sample, pop * np.sqrt((G - 1) / G), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(scores["sample"].feedback.advantages),
                             np.asarray(scores["population"].feedback.advantages)
                             * np.sqrt((G - 1) / G), rtol=1e-5, atol=1e-6)
  # Other estimators ignore it.
  rloo = [rl_step.score_groups(batch, stability.whitening_init(),
                                test_util.learn_config(grpo_std=s)) for s in adv_lib.GRPO_STDS]
  np.testing.assert_array_equal(np.asarray(rloo[0].advantages), np.asarray(rloo[1].advantages))


@pytest.mark.slow
def test_kl_in_the_reward_lowers_each_completions_reward_before_the_advantages():
  """RLOO of r - beta * sum_t k1, k1 = logp_old - logp_ref: on-policy the old policy's pass runs
  (the penalty needs it), and the reference's pass without a KL loss term."""
  graphdef, params = test_util.tiny_model()
  mask = _ragged_mask()
  batch = _batch(test_util.LEARN_REWARDS.copy(), mask=mask)
  ref = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size).reshape(x.shape)), params)
  config = test_util.learn_config(minibatches=1, kl_reward_coef=0.5)
  view = _view(config, batch, params, graphdef, ref_params=ref)
  def logp_of(prm):
    return np.asarray(forward.completion_logprobs(graphdef, prm, batch.prompt_tokens,
                                                  batch.prompt_mask, batch.tokens), np.float64)

  kl_sum = ((logp_of(params) - logp_of(ref)) * mask).sum(1).reshape(P, G)
  assert np.abs(kl_sum).max() > 1e-2
  expected = np.repeat(_rloo(test_util.LEARN_REWARDS.copy() - 0.5 * kl_sum).reshape(P * G, 1), T, axis=1) * mask
  np.testing.assert_allclose(np.asarray(view.advantages), expected, rtol=1e-4, atol=1e-5)
  _, metrics = _objective(config, view, params, graphdef)
  assert "kl" not in metrics  # kl_coef = 0: no KL loss term
  # The learn step reports the mean penalty per trained completion.
  _, state, cur_state, learn = _setup(minibatches=1, kl_reward_coef=0.5)
  _, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, ref)
  np.testing.assert_allclose(float(metrics["kl_reward"]), 0.5 * kl_sum.mean(), rtol=1e-4)


def test_kl_in_the_reward_of_ppo_is_a_per_token_penalty_before_gae():
  graphdef, params = test_util.tiny_model()
  batch = _batch(test_util.LEARN_REWARDS.copy())
  ref = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size).reshape(x.shape)), params)
  views = {beta: _view(test_util.learn_config(algorithm="ppo", kl_reward_coef=beta, lam=1.0), batch,
                       params, graphdef, ref_params=ref) for beta in (0.0, 0.5)}
  # gamma = lam = 1 and V = 0: the return of token t is r - beta * sum_{s >= t} k1(s).
  k1 = np.asarray(views[0.5].logp_old, np.float64) - np.asarray(views[0.5].logp_ref, np.float64)
  to_go = np.cumsum(k1[:, ::-1], axis=1)[:, ::-1]
  np.testing.assert_allclose(np.asarray(views[0.5].returns),
                             np.asarray(views[0.0].returns) - 0.5 * to_go, rtol=1e-4, atol=1e-5)
