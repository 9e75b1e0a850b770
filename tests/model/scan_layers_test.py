"""The scanned layout of the block stack (`ModelConfig.scan_layers`) and rematerialisation
(`ModelConfig.remat`) in rl_curriculum/model/block_stack.py, with the stacked parameters of
layer_stacking.py and the stacked cache of kv_cache.py: both change no value."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_curriculum.model import decoding
from rl_curriculum.model import kv_cache
from rl_curriculum.model import layer_stacking
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
import test_util

BASE = dict(vocab_size=48, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2, mlp_dim=48)
VARIANTS = {
    "llama_gqa": dict(BASE),
    "qwen_bias_qknorm_untied": dict(BASE, qkv_bias=True, qk_norm=True, tie_embeddings=False),
}
_forward = jax.jit(transformer.forward, static_argnums=0)


def _configs(variant="llama_gqa", **overrides):
  """(unrolled config, scanned config) of a variant."""
  config = ModelConfig.tiny(**{**VARIANTS[variant], **overrides})
  return config, dataclasses.replace(config, scan_layers=True)


def _randomised(config, seed=0, std=0.2):
  """(graphdef, params) with every parameter random (norm scales near 1)."""
  graphdef, params = transformer.init_model(config, seed)
  flat = dict(nnx.to_flat_state(params))
  key = jax.random.key(seed + 100)
  for i, (path, var) in enumerate(sorted(flat.items(), key=lambda kv: str(kv[0]))):
    noise = std * jax.random.normal(jax.random.fold_in(key, i), var[...].shape)
    flat[path] = var.replace((1.0 + noise if path[-1] == "scale" else noise).astype(var.dtype))
  return graphdef, nnx.from_flat_state(flat)


def _both(variant="llama_gqa", seed=0, **overrides):
  """(graphdef, params) of the unrolled model and of the scanned one with the same weights."""
  config, scanned = _configs(variant, **overrides)
  graphdef, params = _randomised(config, seed)
  return (graphdef, params), (transformer.init_model(scanned)[0],
                              layer_stacking.stack_layers(params))


def _batch(seed, lengths, width, vocab=48):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, size=(len(lengths), width)).astype(np.int32)
  mask = np.arange(width)[None, :] >= (width - np.asarray(lengths))[:, None]
  return tokens, mask


def _assert_states_equal(a, b, atol=0.0, rtol=0.0):
  flat_a, flat_b = list(nnx.to_flat_state(a)), list(nnx.to_flat_state(b))
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    assert type(x) is type(y), path
    assert x.get_metadata() == y.get_metadata(), path
    np.testing.assert_allclose(np.asarray(x[...]), np.asarray(y[...]), atol=atol, rtol=rtol,
                               err_msg=str(path))


# --- layout --------------------------------------------------------------------------------------


def test_scanned_params_are_the_stacked_unrolled_params_with_a_layers_axis():
  config, scanned = _configs("qwen_bias_qknorm_untied")
  _, params = transformer.init_model(config, seed=3)
  _, stacked = transformer.init_model(scanned, seed=3)
  # Same draws in the same order: the scanned init is the stack of the unrolled one.
  _assert_states_equal(stacked, layer_stacking.stack_layers(params))
  assert jax.tree.structure(stacked) == jax.tree.structure(layer_stacking.stack_layers(params))
  flat = dict(nnx.to_flat_state(stacked))
  kernel = flat[("blocks", "attn", "q", "kernel")]
  assert kernel[...].shape == (3, 32, 4, 8)
  assert kernel.get_metadata("out_sharding") == ("layers", "embed", "heads", "head_dim")
  assert flat[("blocks", "attn_norm", "scale")].get_metadata("out_sharding") == ("layers", "embed")
  assert nnx.get_partition_spec(stacked)["blocks"]["mlp"]["down"]["kernel"].get_value() == (
      jax.sharding.PartitionSpec("layers", "mlp", "embed"))
  assert flat[("embed",)].get_metadata("out_sharding") == ("vocab", "embed")  # top level as is
  assert not any(layer_stacking.layer_of(p) is not None for p in flat)


def test_stack_and_unstack_round_trip_and_pass_the_other_layout_through():
  config, _ = _configs()
  _, params = _randomised(config, seed=1)
  stacked = layer_stacking.stack_layers(params)
  _assert_states_equal(layer_stacking.unstack_layers(stacked), params)
  assert jax.tree.structure(layer_stacking.unstack_layers(stacked)) == jax.tree.structure(params)
  _assert_states_equal(layer_stacking.stack_layers(stacked), stacked)      # already stacked
  _assert_states_equal(layer_stacking.unstack_layers(params), params)      # already per layer
  pair = layer_stacking.stack_layers((params, params))                     # tuples of states
  assert isinstance(pair, tuple) and len(pair) == 2
  _assert_states_equal(pair[1], stacked)
  # Abstract states convert too (shapes only).
  _, abstract = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(config,
                                                                         rngs=nnx.Rngs(0))))
  shapes = dict(nnx.to_flat_state(layer_stacking.stack_layers(abstract)))
  assert shapes[("blocks", "mlp", "up", "kernel")].get_value().shape == (3, 32, 48)


def test_stack_layers_rejects_missing_layers():
  config, _ = _configs()
  _, params = transformer.init_model(config)
  flat = {p: v for p, v in nnx.to_flat_state(params) if layer_stacking.layer_of(p) != 1}
  with pytest.raises(ValueError, match="not 0 .. 1"):
    layer_stacking.stack_layers(nnx.from_flat_state(flat))


# --- values and gradients ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", test_util.fast_first(sorted(VARIANTS)))
def test_scanned_forward_and_gradients_equal_unrolled(variant):
  (graphdef, params), (graphdef_s, params_s) = _both(variant, seed=2)
  tokens, mask = _batch(3, lengths=[7, 3, 1], width=7)
  np.testing.assert_allclose(_forward(graphdef_s, params_s, tokens, mask),
                             _forward(graphdef, params, tokens, mask), atol=1e-5, rtol=0)

  def loss(graphdef):
    def f(params):
      logits = transformer.forward(graphdef, params, tokens, mask)
      return jnp.sum(jnp.where(mask[:, :, None], jax.nn.log_softmax(logits), 0.0)[..., :5])
    return jax.jit(jax.grad(f))

  grads = loss(graphdef)(params)
  grads_s = loss(graphdef_s)(params_s)
  # A whole transformer's gradients: the module tolerance. Entries reach about 30 and some near
  # 0.1 are sums of such terms, so a CPU that vectorises the sums differently moves them by ~2e-5.
  _assert_states_equal(grads_s, layer_stacking.stack_layers(grads), atol=1e-4, rtol=1e-5)


def test_scanned_cache_decoding_equals_full_forward_and_unrolled():
  (graphdef, params), (graphdef_s, params_s) = _both("qwen_bias_qknorm_untied", seed=4)
  prompts, prompt_mask = _batch(5, lengths=[5, 2, 4], width=5)
  new_tokens = np.random.default_rng(6).integers(0, 48, size=(3, 3)).astype(np.int32)
  length = 8
  prefill = jax.jit(decoding.prefill, static_argnums=(0, 4))
  step = jax.jit(decoding.decode_step, static_argnums=0)

  def decode(graphdef, params):
    logits, cache = prefill(graphdef, params, prompts, prompt_mask, length)
    out = [logits]
    key_mask = kv_cache.cache_key_mask(jnp.asarray(prompt_mask), length)
    positions = prompt_mask.sum(axis=1).astype(np.int32)
    for t in range(2):
      logits, cache = step(graphdef, params, new_tokens[:, t], positions + t, key_mask, cache,
                           jnp.int32(5 + t))
      out.append(logits)
    return np.stack(out, 1), cache

  scanned, cache_s = decode(graphdef_s, params_s)
  unrolled, cache = decode(graphdef, params)
  assert cache_s.k.shape == (3, 3, length, 2, 8) and kv_cache.cache_batch_axis(cache_s) == 1
  np.testing.assert_allclose(cache_s.k, np.stack(cache.k), atol=1e-5, rtol=0)
  np.testing.assert_allclose(cache_s.v, np.stack(cache.v), atol=1e-5, rtol=0)
  np.testing.assert_allclose(scanned, unrolled, atol=1e-5, rtol=0)
  full = _forward(graphdef_s, params_s, np.concatenate([prompts, new_tokens[:, :2]], 1),
                  np.concatenate([prompt_mask, np.ones((3, 2), bool)], 1))
  np.testing.assert_allclose(scanned, full[:, 4:], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_scanned_shared_prefix_equals_unrolled_values_and_gradients():
  (graphdef, params), (graphdef_s, params_s) = _both("llama_gqa", seed=7)
  prefix, prefix_mask = _batch(8, lengths=[4, 2], width=4)
  tokens = np.random.default_rng(9).integers(0, 48, size=(6, 3)).astype(np.int32)
  probe = np.random.default_rng(10).normal(size=(1, 7, 32)).astype(np.float32)

  def run(graphdef):
    def f(params):
      prefix_hidden, hidden = transformer.shared_prefix_hidden(graphdef, params, prefix,
                                                               prefix_mask, tokens)
      prefix_hidden = jnp.where(prefix_mask[:, :, None], prefix_hidden, 0.0)
      loss = jnp.sum(prefix_hidden * probe[:, :4]) + jnp.sum(hidden * probe[:, 4:])
      return loss, (prefix_hidden, hidden)
    return jax.jit(jax.value_and_grad(f, has_aux=True))

  (loss, hiddens), grads = run(graphdef)(params)
  (loss_s, hiddens_s), grads_s = run(graphdef_s)(params_s)
  for a, b in zip(hiddens_s, hiddens):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  np.testing.assert_allclose(loss_s, loss, rtol=1e-5)
  # A whole transformer's gradients: the module tolerance. Entries reach about 30 and some near
  # 0.1 are sums of such terms, so a CPU that vectorises the sums differently moves them by ~2e-5.
  _assert_states_equal(grads_s, layer_stacking.stack_layers(grads), atol=1e-4, rtol=1e-5)


# --- rematerialisation ---------------------------------------------------------------------------


@pytest.mark.parametrize("scan_layers", test_util.fast_first([False, True]))
@pytest.mark.parametrize("remat", test_util.fast_first(["block", "dots"]))
def test_remat_keeps_values_and_gradients(scan_layers, remat):
  config = ModelConfig.tiny(**VARIANTS["llama_gqa"], scan_layers=scan_layers)
  graphdef, params = _randomised(config, seed=11)
  graphdef_r = transformer.init_model(dataclasses.replace(config, remat=remat))[0]
  tokens, mask = _batch(12, lengths=[6, 4], width=6)

  def loss(graphdef):
    def f(params):
      logits = transformer.forward(graphdef, params, tokens, mask)
      return jnp.sum(jnp.where(mask[:, :, None], jax.nn.log_softmax(logits), 0.0)[..., :5])
    return f

  np.testing.assert_array_equal(_forward(graphdef_r, params, tokens, mask),
                                _forward(graphdef, params, tokens, mask))
  grads = jax.jit(jax.grad(loss(graphdef)))(params)
  grads_r = jax.jit(jax.grad(loss(graphdef_r)))(params)
  # The simple-kernel tolerance, as everywhere in this file: XLA may order the recomputed
  # forward's sums differently from the saved one's.
  _assert_states_equal(grads_r, grads, atol=1e-5)
  # The backward pass really recomputes: one rematerialised call per block in the gradient
  # program (one in the scan body when scanned), none without remat.
  jaxpr = str(jax.make_jaxpr(jax.grad(loss(graphdef_r)))(params))
  assert jaxpr.count("remat2[") == (1 if scan_layers else config.num_layers)
  assert "remat2[" not in str(jax.make_jaxpr(jax.grad(loss(graphdef)))(params))


@pytest.mark.slow
def test_remat_with_a_cache_keeps_shared_prefix_gradients():
  config, scanned = _configs("llama_gqa")
  graphdef, params = _randomised(scanned, seed=13)
  graphdef_r = transformer.init_model(dataclasses.replace(scanned, remat="block"))[0]
  prefix, prefix_mask = _batch(14, lengths=[3, 2], width=3)
  tokens = np.random.default_rng(15).integers(0, 48, size=(4, 2)).astype(np.int32)

  def grad(graphdef):
    def f(params):
      _, hidden = transformer.shared_prefix_hidden(graphdef, params, prefix, prefix_mask, tokens)
      return jnp.sum(jnp.sin(hidden))
    return jax.jit(jax.grad(f))(params)

  # A whole transformer's gradients, up to ~26 here: the module tolerance. XLA may order the
  # recomputed forward's sums differently from the saved one's.
  _assert_states_equal(grad(graphdef_r), grad(graphdef), atol=1e-4, rtol=1e-5)


# --- program size ---------------------------------------------------------------------------------


def _forward_program_size(num_layers, scan_layers):
  config = ModelConfig.tiny(**{**BASE, "num_layers": num_layers}, scan_layers=scan_layers)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(config,
                                                                              rngs=nnx.Rngs(0))))
  tokens = jax.ShapeDtypeStruct((2, 5), jnp.int32)
  mask = jax.ShapeDtypeStruct((2, 5), bool)
  return len(jax.jit(transformer.forward, static_argnums=0).lower(graphdef, params, tokens,
                                                                  mask).as_text())


def test_scanned_program_does_not_grow_with_depth():
  scanned = [_forward_program_size(n, True) for n in (2, 8)]
  unrolled = [_forward_program_size(n, False) for n in (2, 8)]
  assert abs(scanned[1] - scanned[0]) <= 0.03 * scanned[0], scanned
  assert unrolled[1] > 2.0 * unrolled[0], unrolled


# --- caches ---------------------------------------------------------------------------------------


def test_init_cache_follows_the_layout_and_a_mismatch_is_reported():
  config, scanned = _configs()
  stacked = kv_cache.init_cache(scanned, 2, 6)
  assert stacked.k.shape == stacked.v.shape == (3, 2, 6, 2, 8)
  per_layer = kv_cache.init_cache(config, 2, 6)
  assert len(per_layer.k) == 3 and per_layer.k[0].shape == (2, 6, 2, 8)
  assert kv_cache.cache_batch_axis(per_layer) == 0
  model = transformer.Transformer(scanned, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="scan_layers=True"):
    model(jnp.zeros((2, 1), jnp.int32), jnp.zeros((2, 1), jnp.int32), jnp.ones((2, 6), bool),
          per_layer, jnp.int32(0))
