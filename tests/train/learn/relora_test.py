"""LoRA merged into the base every N steps (`relora`), and the adapters' health in the learn step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import toy
from rl_curriculum import curriculum as cur
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.train.learn import examples, relora
from rl_curriculum.train.setup import builders, validation
from rl_curriculum.train.state import init_train_state, init_value_head, RunState
import test_util

P, G, TP, T, V = 4, 4, 5, 3, 16
RANK, ALPHA = 4, 8.0


def _lora_model():
  """A one-layer model with adapters on q, v and up whose B already moved away from 0."""
  config = ModelConfig.tiny(vocab_size=V, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            mlp_dim=64)
  model = nnx.merge(*transformer.init_model(config, seed=0))
  lora_lib.attach(model, lora_lib.LoRAConfig(rank=RANK, alpha=ALPHA, targets=("q", "v", "up")),
                  rngs=nnx.Rngs(1))
  graphdef, adapters, base = lora_lib.split(model)
  adapters = jax.tree.map(lambda x: x + 0.1 * jnp.cos(jnp.arange(x.size)).reshape(x.shape),
                          adapters)
  return graphdef, adapters, base


def _tokens():
  tokens = jax.random.randint(jax.random.PRNGKey(3), (3, 7), 3, V)
  return tokens, jnp.ones(tokens.shape, bool)


def _flat(state):
  """{"blocks/0/attn/q/lora_a": array, ...} of an nnx.State."""
  return {"/".join(map(str, path)): np.asarray(var.get_value())
          for path, var in nnx.to_flat_state(state)}


def _stepped_state(adapters, optimizer, value=None):
  """A train state whose optimizer has taken one step (nonzero moments, count 1)."""
  state = init_train_state(adapters, optimizer, value)
  trained = adapters if value is None else (adapters, value)
  grads = jax.tree.map(jnp.ones_like, trained)
  updates, opt_state = optimizer.update(grads, state.opt_state, trained)
  trained = optax.apply_updates(trained, updates)
  params, value = (trained, None) if value is None else trained
  return state._replace(params=params, value=value, opt_state=opt_state,
                        step=jnp.asarray(5, jnp.int32), skipped=jnp.asarray(2, jnp.int32))


def test_merge_keeps_the_function_and_restarts_the_adapters():
  graphdef, adapters, base = _lora_model()
  optimizer = optax.adam(1e-2)
  state = _stepped_state(adapters, optimizer)
  key = jax.random.PRNGKey(7)
  tokens, mask = _tokens()
  logits = transformer.forward(graphdef, (state.params, base), tokens, mask)
  new_state, new_base = relora.merge(state, base, key, optimizer=optimizer)
  # The same function: (alpha / r) A . B moved into the kernels.
  np.testing.assert_allclose(
      np.asarray(transformer.forward(graphdef, (new_state.params, new_base), tokens, mask)),
      np.asarray(logits), atol=1e-4)
  # The trees keep their structure (the graphdef and the jitted step stay valid).
  assert jax.tree.structure(new_state.params) == jax.tree.structure(state.params)
  assert jax.tree.structure(new_base) == jax.tree.structure(base)
  old, new = _flat(state.params), _flat(new_state.params)
  old_base, merged_base = _flat(base), _flat(new_base)
  targeted = set()
  for name in old:
    if name.endswith("lora_b"):
      assert not np.any(new[name]), name           # B = 0 after the merge
      assert np.any(old[name]), name
    else:
      assert not np.allclose(new[name], old[name]), name  # A redrawn
      parent = name[:-len("lora_a")]
      targeted.add(parent + "kernel")
      a, b = old[parent + "lora_a"], old[parent + "lora_b"]
      expected = old_base[parent + "kernel"] + ALPHA / RANK * np.tensordot(a, b, axes=1)
      np.testing.assert_allclose(merged_base[parent + "kernel"], expected, atol=1e-5)
  assert len(targeted) == 3
  for name in old_base:  # every other base weight is as it was
    if name not in targeted:
      np.testing.assert_array_equal(merged_base[name], old_base[name])
  # A is the draw `merge_and_reinit` makes with the same key.
  reference = lora_lib.merge_and_reinit(nnx.merge_state(state.params, base), key)
  reference_adapters, _ = nnx.split_state(reference, lora_lib.LoRAWeight, ...)
  for name, x in _flat(reference_adapters).items():
    np.testing.assert_array_equal(new[name], x)
  # The optimizer restarts; the counters and the whitening stay.
  fresh = jax.tree.leaves(optimizer.init(new_state.params))
  assert all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(new_state.opt_state), fresh))
  assert any(np.any(np.asarray(x)) for x in jax.tree.leaves(state.opt_state))
  assert int(new_state.step) == 5 and int(new_state.skipped) == 2


def test_merge_with_a_value_head_keeps_it_and_restarts_its_moments():
  graphdef, adapters, base = _lora_model()
  del graphdef
  optimizer = optax.adam(1e-2)
  state = _stepped_state(adapters, optimizer, init_value_head(32))
  new_state, _ = relora.merge(state, base, jax.random.PRNGKey(7), optimizer=optimizer)
  for x, y in zip(jax.tree.leaves(new_state.value), jax.tree.leaves(state.value)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  fresh = optimizer.init((new_state.params, new_state.value))
  assert jax.tree.structure(new_state.opt_state) == jax.tree.structure(fresh)
  assert all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(new_state.opt_state), jax.tree.leaves(fresh)))


def test_jitted_merge_equals_the_eager_one():
  _, adapters, base = _lora_model()
  optimizer = optax.adam(1e-2)
  state = _stepped_state(adapters, optimizer)
  key = jax.random.PRNGKey(7)
  eager = relora.merge(state, base, key, optimizer=optimizer)
  copy = jax.tree.map(lambda x: jnp.array(x, copy=True), (state, base))  # the inputs are donated
  jitted = relora.make_merge(optimizer, None, None)(*copy, key)
  for x, y in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def _config(every, rank=4):
  c = toy.get_config()
  c.model.lora_rank = rank
  c.model.lora_merge_every = every
  return c


def test_merges_every_n_steps_with_a_key_of_their_own():
  assert [relora.due(_config(2), s) for s in range(1, 7)] == [False, True] * 3
  assert not any(relora.due(_config(0), s) for s in range(1, 7))
  root = jax.random.PRNGKey(0)
  keys = [np.asarray(jax.random.key_data(relora.merge_key(root, s))) for s in (2, 4)]
  step_keys = np.asarray(jax.random.key_data(
      jax.random.split(jax.random.fold_in(root, 2), 4)))
  assert not np.array_equal(keys[0], keys[1])
  assert not any(np.array_equal(keys[0], k) for k in step_keys)


def test_maybe_merge_reports_lora_merged_only_when_configured():
  _, adapters, base = _lora_model()
  state = RunState(train=init_train_state(adapters, optax.adam(1e-2)), curriculum=None,
                   base=base, prompts=None, health=None)
  calls = []

  def merge_fn(train_state, frozen, key):
    calls.append(key)
    return train_state._replace(step=train_state.step + 1), frozen

  root = jax.random.PRNGKey(0)
  assert relora.maybe_merge(_config(0), 2, root, state, merge_fn) == (state, {})
  assert relora.maybe_merge(_config(2), 1, root, state, merge_fn) == (state, {"lora_merged": 0.0})
  assert not calls
  merged, metrics = relora.maybe_merge(_config(2), 2, root, state, merge_fn)
  assert metrics == {"lora_merged": 1.0} and int(merged.train.step) == 1
  assert merged.base is base
  np.testing.assert_array_equal(jax.random.key_data(calls[0]),
                                jax.random.key_data(relora.merge_key(root, 2)))


@pytest.mark.parametrize("every,rank,message", [
    (2, 0, "model.lora_merge_every: merges LoRA adapters every 2 steps, but model.lora_rank = 0"),
    (-1, 4, "model.lora_merge_every: must be a whole number >= 0"),
])
def test_bad_merge_period_is_refused(every, rank, message):
  with pytest.raises(validation.ConfigError, match=message):
    validation.validate(_config(every, rank))
  validation.validate(_config(2, 4))


# --- The adapters' health in the learn step -----------------------------------------------------


def _learn(graphdef, optimizer, use_lora, **overrides):
  config = dataclasses.replace(builders.learn_config(toy.get_config()),
                               **{"minibatches": 1, "max_kl": None, "ratio_guard": 0.0,
                                  "max_tokens": T, **overrides})
  curriculum = cur.sec(2, batch_size=P, alpha=1.0)
  learn = test_util.make_learn(graphdef, optimizer, curriculum, config, use_lora=use_lora)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 1] * 3), jax.random.PRNGKey(0))
  return learn, cur_state


def _batch():
  key = jax.random.PRNGKey(1)
  prompts = jnp.repeat(jax.random.randint(key, (P, TP), 4, V), G, axis=0)
  tokens = jax.random.randint(jax.random.fold_in(key, 1), (P * G, T), 4, V)
  rewards = np.array([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 0, 1], [1, 0, 1, 0]], np.float32)
  return examples.make_batch(prompts, tokens, rewards, num_arms=2)


def _norm(tree):
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                           for x in jax.tree.leaves(tree))))


def test_learn_reports_adapter_health_under_lora():
  graphdef, adapters, base = _lora_model()
  optimizer = optax.adam(1e-2)
  learn, cur_state = _learn(graphdef, optimizer, use_lora=True)
  state = init_train_state(adapters, optimizer)
  before = jax.tree.map(np.asarray, adapters)
  new_state, _, metrics = learn(state, cur_state, _batch(), jax.random.PRNGKey(2), base, None)
  delta = jax.tree.map(lambda a, b: np.asarray(b, np.float64) - a, before, new_state.params)
  # One optimizer step: the step's update and the adapters after it; the gradient is the
  # minibatch's, whose norm grad_norm reports too (the adapters are all that trains).
  np.testing.assert_allclose(float(metrics["adapter_update_norm"]), _norm(delta), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["adapter_param_norm"]), _norm(new_state.params),
                             rtol=1e-5)
  np.testing.assert_allclose(float(metrics["adapter_grad_norm"]), float(metrics["grad_norm"]),
                             rtol=1e-5)
  assert float(metrics["adapter_grad_norm"]) > 0 and float(metrics["adapter_frozen"]) == 0.0


def test_adapters_that_do_not_move_are_reported_frozen():
  graphdef, adapters, base = _lora_model()
  optimizer = optax.sgd(0.0)  # a gradient, but no update
  learn, cur_state = _learn(graphdef, optimizer, use_lora=True)
  state = init_train_state(adapters, optimizer)
  _, _, metrics = learn(state, cur_state, _batch(), jax.random.PRNGKey(2), base, None)
  assert float(metrics["adapter_grad_norm"]) > 0
  assert float(metrics["adapter_update_norm"]) == 0.0
  assert float(metrics["adapter_frozen"]) == 1.0


@pytest.mark.parametrize("signal,frozen", test_util.fast_first([(True, 0.0), (False, 1.0)]))
def test_adapters_are_frozen_only_when_no_optimizer_step_moves_them(signal, frozen):
  """Two minibatches: every group with an advantage (both steps move the adapters), or none (no
  gradient on either step)."""
  graphdef, adapters, base = _lora_model()
  optimizer = optax.adam(1e-2)
  learn, cur_state = _learn(graphdef, optimizer, use_lora=True, minibatches=2)
  state = init_train_state(adapters, optimizer)
  rewards = np.tile(np.array([1, 0, 0, 1], np.float32) if signal else np.ones(G, np.float32),
                    (P, 1))
  batch = _batch()._replace(rewards=jnp.asarray(rewards), correct=jnp.asarray(rewards > 0.5))
  _, _, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(2), base, None)
  assert float(metrics["steps_taken"]) == 2.0
  assert float(metrics["adapter_frozen"]) == frozen
  assert (float(metrics["adapter_grad_norm"]) > 0) == signal


@pytest.mark.slow
def test_full_fine_tuning_reports_no_adapter_health():
  config = ModelConfig.tiny(vocab_size=V, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            mlp_dim=64)
  graphdef, params = transformer.init_model(config, seed=0)
  optimizer = optax.adam(1e-2)
  learn, cur_state = _learn(graphdef, optimizer, use_lora=False)
  state = init_train_state(params, optimizer)
  _, _, metrics = learn(state, cur_state, _batch(), jax.random.PRNGKey(2), None, params)
  assert not [name for name in metrics if name.startswith("adapter_")]
