"""The model's many-query attention on each backend (ModelConfig.attention, attention_block):
the blockwise reference and the splash kernel (under Pallas' TPU interpret mode) give the dense
model's hidden states and gradients, on a whole forward and on the learn step's shared-prompt
forward, and the blockwise model's memory grows linearly with the sequence."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from rl_curriculum.model import attention
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig

V, B, TP, T, G = 64, 4, 12, 20, 2


def _config(**overrides):
  # head_dim 64: a width the splash kernel tiles.
  fields = dict(vocab_size=V, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=64, mlp_dim=128, init_std=0.1)
  return ModelConfig.tiny(**{**fields, **overrides})


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  prompts = rng.integers(1, V, size=(B // G, TP)).astype(np.int32)
  prompt_mask = np.ones((B // G, TP), bool)
  prompt_mask[0, :5] = False
  tokens = rng.integers(1, V, size=(B, T)).astype(np.int32)
  seq = np.concatenate([np.repeat(prompts, G, axis=0), tokens], axis=1)
  seq_mask = np.concatenate([np.repeat(prompt_mask, G, axis=0), np.ones((B, T), bool)], axis=1)
  weights = rng.standard_normal((B, T, 128)).astype(np.float32)
  return prompts, prompt_mask, tokens, seq, seq_mask, weights


def _losses(config, seed=0):
  """(whole-forward loss, shared-prompt loss) as functions of the parameters, and the params."""
  graphdef, params = transformer.init_model(config, seed=0)
  prompts, prompt_mask, tokens, seq, seq_mask, weights = _inputs(seed)

  def whole(p):
    hidden = transformer.forward_hidden(graphdef, p, seq, seq_mask)
    return hidden[:, TP:], jnp.sum(hidden[:, TP:] * weights)

  def shared(p):
    _, hidden = transformer.shared_prefix_hidden(graphdef, p, prompts, prompt_mask, tokens)
    return hidden, jnp.sum(hidden * weights)

  return whole, shared, params


def _values_and_grads(config, fn_index):
  """(hidden states, gradients of the weighted sum) of loss `fn_index` (0 whole, 1 shared)."""
  fns = _losses(config)
  fn, params = fns[fn_index], fns[2]
  run = lambda p: (fn(p)[0], jax.grad(lambda q: fn(q)[1])(p))
  # Finished before returning: under Pallas' interpreter nothing else may run while its host
  # calls are pending.
  return jax.block_until_ready(jax.jit(run)(params))


def _assert_close(got, want):
  """Hidden states to 1e-4; each parameter's gradient to 1e-4 of its largest entry (they reach
  hundreds: a weighted sum over every position; the float32 rounding of the two summation
  orders, about 3e-7 of that, is what differs)."""
  hidden, grads = got
  np.testing.assert_allclose(hidden, want[0], atol=1e-4, rtol=0)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want[1]), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-4 * float(np.max(np.abs(b))), rtol=0)


@pytest.mark.parametrize("scan,remat", [(False, "none"), (True, "block")])
@pytest.mark.parametrize("fn_index", [0, 1], ids=["whole", "shared_prompt"])
def test_blockwise_model_equals_dense_model(scan, remat, fn_index):
  dense = _config(scan_layers=scan, remat=remat)
  blockwise = dataclasses.replace(dense, attention_block=8)
  _assert_close(_values_and_grads(blockwise, fn_index), _values_and_grads(dense, fn_index))


def test_splash_model_equals_dense_model_under_interpret_mode():
  """The TPU backend on the learn step's shared-prompt forward (static query offsets: splash),
  run by Pallas' TPU interpreter on the CPU (whose host callbacks `jax.checkpoint` cannot
  recompute: no remat here)."""
  dense = _config(scan_layers=True)
  with pltpu.force_tpu_interpret_mode():
    got = _values_and_grads(dataclasses.replace(dense, attention="tpu"), 1)
  _assert_close(got, _values_and_grads(dense, 1))


def test_the_backend_follows_the_config_and_the_query_offset():
  assert attention.many_query_backend("reference", 0, 0) == "dense"
  assert attention.many_query_backend("reference", 64, jnp.int32(3)) == "blockwise"
  assert attention.many_query_backend("tpu", 0, 12) == "splash"
  assert attention.many_query_backend("tpu", 0, jnp.int32(12)) == "blockwise"
  assert attention.many_query_backend("tpu", 0, 12, rows_left=2) == "blockwise"
  assert attention.backend("auto") == ("tpu" if jax.default_backend() == "tpu" else "reference")
  with pytest.raises(ValueError, match="attention"):
    _config(attention="flash")
  with pytest.raises(ValueError, match="attention_block"):
    _config(attention_block=-1)


def _temp_bytes(config, length):
  graphdef, params = transformer.init_model(config, seed=0)
  tokens = jax.ShapeDtypeStruct((1, length), jnp.int32)
  mask = jax.ShapeDtypeStruct((1, length), jnp.bool_)
  loss = lambda p, t, m: jnp.sum(transformer.forward_hidden(graphdef, p, t, m))
  compiled = jax.jit(jax.grad(loss)).lower(params, tokens, mask).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("remat", ["none", "block"])
def test_blockwise_models_memory_grows_linearly_with_the_sequence(remat):
  """XLA:CPU's temporaries of the model's gradient at 1024 and 2048 positions: about twice for
  the blockwise model, about four times for the dense one (its [T, T] scores). With each block
  recomputed in the backward pass too (`jax.checkpoint` once kept every key block's mask)."""
  dense = _config(d_model=64, num_heads=2, num_kv_heads=1, head_dim=32, num_layers=2,
                  scan_layers=True, remat=remat)
  blockwise = dataclasses.replace(dense, attention_block=128)
  grow = lambda c: _temp_bytes(c, 2048) / _temp_bytes(c, 1024)
  assert grow(blockwise) < 2.5
  assert grow(dense) > 3.5
