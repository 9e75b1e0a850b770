"""The jitted learn step: updates, rollback on a non-finite loss, filtered groups."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_curriculum import curriculum as cur
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.rl import losses
from rl_curriculum.train import builders, rl_step

P, G, TP, T, V = 4, 4, 5, 3, 16


def _setup(minibatches=2, algorithm="rloo", kl_coef=0.0, optimizer=None, ratio_guard=0.0):
  config = ModelConfig.tiny(vocab_size=V, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            mlp_dim=64)
  graphdef, params = transformer.init_model(config, seed=0)
  optimizer = optimizer or builders.build_optimizer(1e-2, max_grad_norm=1.0)
  curriculum = cur.sec(2, batch_size=P, alpha=1.0)
  learn_config = rl_step.LearnConfig(algorithm=algorithm, minibatches=minibatches, lam=1.0,
                                     kl_coef=kl_coef, ratio_guard=ratio_guard)
  learn = rl_step.make_learn(graphdef=graphdef, optimizer=optimizer,
                             curriculum_update=curriculum.update, config=learn_config,
                             use_lora=False)
  value = rl_step.init_value_head(config.d_model) if algorithm == "ppo" else None
  state = rl_step.init_train_state(params, optimizer, value)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 0, 1, 1, 0, 1]), jax.random.PRNGKey(0))
  return params, state, cur_state, learn


def _batch(rewards, train_groups=None, train_valid=None):
  key = jax.random.PRNGKey(1)
  s = rewards.shape[0]
  b = s * G
  # One prompt per group, repeated for its G rows; left padding of 0..s-1 slots.
  prompts = jnp.repeat(jax.random.randint(key, (s, TP), 4, V), G, axis=0)
  pad = jnp.repeat(jnp.arange(s) % TP, G)
  prompt_mask = jnp.arange(TP)[None, :] >= pad[:, None]
  return rl_step.Batch(
      prompt_tokens=jnp.where(prompt_mask, prompts, 0), prompt_mask=prompt_mask,
      tokens=jax.random.randint(jax.random.fold_in(key, 1), (b, T), 4, V),
      mask=jnp.ones((b, T)), sampler_logprobs=jnp.zeros((b, T)),
      prompt_ids=jnp.arange(s, dtype=jnp.int32), arms=jnp.arange(s, dtype=jnp.int32) % 2,
      rewards=jnp.asarray(rewards, jnp.float32), correct=jnp.asarray(rewards) > 0.5,
      valid=jnp.ones(rewards.shape, bool),
      train_groups=jnp.arange(P, dtype=jnp.int32) if train_groups is None else train_groups,
      train_valid=jnp.ones(P, bool) if train_valid is None else train_valid)


def _rewards():
  return np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1], [1, 1, 1, 1]], np.float32)


def test_update_changes_params_and_curriculum():
  params, state, cur_state, learn = _setup(kl_coef=1e-3)
  before = jax.tree.map(np.asarray, params)
  new_state, new_cur, metrics = learn(state, cur_state, _batch(_rewards()), jax.random.PRNGKey(2),
                                      None, params)
  assert int(new_state.step) == 1 and int(new_state.skipped) == 0
  changed = [not np.array_equal(a, np.asarray(b))
             for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(new_state.params))]
  assert any(changed)
  # SEC with alpha = 1: q = mean |RLOO advantage| of the arm. Arm 0 = prompts 0, 2; arm 1 = 1, 3.
  np.testing.assert_allclose(np.asarray(new_cur.q), _sec_q(_rewards()), atol=1e-6)
  assert float(metrics["nonzero_adv_frac"]) == 0.5
  # The reference is the pre-update policy: KL is 0 in the first minibatch, > 0 after an update.
  assert 0.0 < float(metrics["kl"]) < 1.0


def _sec_q(rewards):
  """SEC's q after one update with alpha = 1: per arm (prompt index % 2), mean |RLOO advantage|."""
  expected = []
  for arm in (0, 1):
    vals = []
    for r in rewards[arm::2]:
      for g in range(G):
        vals.append(abs(r[g] - (r.sum() - r[g]) / (G - 1)))
    expected.append(np.mean(vals))
  return expected


def test_non_finite_loss_skips_and_rolls_back():
  params, state, cur_state, learn = _setup()
  before = jax.tree.map(np.asarray, params)
  rewards = _rewards()
  rewards[0, 0] = np.nan
  new_state, _, metrics = learn(state, cur_state, _batch(rewards), jax.random.PRNGKey(2), None,
                                params)
  assert float(metrics["update_skipped"]) == 1.0 and int(new_state.skipped) == 1
  assert int(new_state.step) == 1
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(new_state.params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  # Training continues: the next finite batch updates normally.
  newer, _, metrics = learn(new_state, cur_state, _batch(_rewards()), jax.random.PRNGKey(3), None,
                            params)
  assert float(metrics["update_skipped"]) == 0.0 and int(newer.skipped) == 1


def test_curriculum_sees_all_groups_policy_only_kept_ones():
  params, state, cur_state, learn = _setup(minibatches=1)
  # Six sampled groups; the filter kept groups 0 and 2 and could not fill two slots.
  rewards = np.concatenate([_rewards(), np.array([[1, 0, 1, 0], [0, 1, 1, 1]], np.float32)])
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


def test_outcome_token_rewards_sit_on_the_last_counted_token():
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], jnp.float32)
  got = rl_step.outcome_token_rewards(jnp.array([2.0, -1.0, 5.0]), mask)
  np.testing.assert_array_equal(np.asarray(got), [[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0]])


def test_ppo_step_trains_policy_and_value_head():
  params, state, cur_state, learn = _setup(algorithm="ppo")
  new_state, new_cur, metrics = learn(state, cur_state, _batch(_rewards()), jax.random.PRNGKey(2),
                                      None, params)
  assert float(metrics["update_skipped"]) == 0.0
  assert float(metrics["value_loss"]) > 0.0  # the head starts at 0, the returns are 0/1
  assert float(jnp.abs(new_state.value["w"]).sum()) > 0.0
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new_state.params)))
  # The curriculum is fed group-relative (RLOO) advantages under PPO too.
  np.testing.assert_allclose(np.asarray(new_cur.q), _sec_q(_rewards()), atol=1e-6)
  # The critic learns: on the same batch, its loss falls over a few steps.
  value_losses = [float(metrics["value_loss"])]
  for i in range(3):
    new_state, _, metrics = learn(new_state, cur_state, _batch(_rewards()),
                                  jax.random.PRNGKey(3 + i), None, params)
    value_losses.append(float(metrics["value_loss"]))
  assert value_losses[-1] < value_losses[0], value_losses


def test_kl_is_zero_while_the_policy_equals_the_reference():
  params, state, cur_state, learn = _setup(minibatches=1, kl_coef=0.1)
  _, _, metrics = learn(state, cur_state, _batch(_rewards()), jax.random.PRNGKey(2), None, params)
  assert abs(float(metrics["kl"])) < 1e-6  # one minibatch: the policy is the reference


def test_one_minibatch_step_equals_the_two_pass_update():
  """One epoch of one minibatch skips the old policy's forward pass (logp_old = stop_gradient of
  the loss's own log-probs); the update must equal the textbook one computed here with an
  explicit old-policy pass: the same loss, gradient norm and SGD parameters."""
  lr = 0.5
  params, state, cur_state, learn = _setup(minibatches=1, optimizer=optax.sgd(lr))
  batch = _batch(_rewards())
  new_state, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), None, params)

  graphdef, _ = _model()
  adv = np.zeros((P, G), np.float32)
  r = _rewards()
  for p in range(P):
    for g in range(G):
      adv[p, g] = r[p, g] - (r[p].sum() - r[p, g]) / (G - 1)
  adv_tokens = jnp.asarray(np.repeat(adv.reshape(P * G, 1), T, axis=1))

  def logp_of(prm):
    return rl_step.completion_logprobs(graphdef, prm, batch.prompt_tokens, batch.prompt_mask,
                                       batch.tokens)

  logp_old = jax.lax.stop_gradient(logp_of(params))

  def loss_fn(prm):
    loss, _ = losses.policy_loss(logp_of(prm), logp_old, adv_tokens, batch.mask, eps_low=0.2,
                                 eps_high=0.2, level="token", aggregation="token_mean",
                                 max_tokens=T)
    return loss

  loss, grads = jax.value_and_grad(loss_fn)(params)
  np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(float(metrics["grad_norm"]), float(optax.tree.norm(grads)),
                             rtol=1e-4)
  expected = jax.tree.map(lambda p, g: p - lr * g, params, grads)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(new_state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_grouped_completion_logprobs_equal_the_per_row_pass():
  """The learn step's grouped pass (each group's prompt once) gives the per-row pass's log-probs
  and gradients."""
  graphdef, params = _model()
  batch = _batch(_rewards())
  weights = jax.random.normal(jax.random.PRNGKey(3), batch.tokens.shape)

  def loss(prm, group):
    logp = rl_step.completion_logprobs(graphdef, prm, batch.prompt_tokens, batch.prompt_mask,
                                       batch.tokens, group)
    return jnp.sum(logp * weights), logp

  (value_g, logp_g), grads_g = jax.value_and_grad(loss, has_aux=True)(params, G)
  (value_1, logp_1), grads_1 = jax.value_and_grad(loss, has_aux=True)(params, 1)
  np.testing.assert_allclose(logp_g, logp_1, atol=1e-5, rtol=0)
  np.testing.assert_allclose(value_g, value_1, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_g), jax.tree.leaves(grads_1)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_one_minibatch_ratio_guard_and_metrics():
  params, state, cur_state, learn = _setup(minibatches=1, ratio_guard=1.0)
  batch = _batch(_rewards())
  logp = rl_step.completion_logprobs(*_model(), batch.prompt_tokens, batch.prompt_mask,
                                     batch.tokens)
  # The sampler's log-probs agree on the first completion token and are 3 nats off elsewhere.
  sampler_logp = logp.at[:, 1:].add(-3.0)
  _, _, metrics = learn(state, cur_state, batch._replace(sampler_logprobs=sampler_logp),
                        jax.random.PRNGKey(2), None, params)
  np.testing.assert_allclose(float(metrics["ratio_guard_frac"]), (T - 1) / T, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["completion_len"]), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["sampler_logp_gap"]), 0.0, atol=1e-5)


def _model():
  config = ModelConfig.tiny(vocab_size=V, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            mlp_dim=64)
  return transformer.init_model(config, seed=0)
