"""Tests of rl_curriculum/model/lora.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rl_curriculum.model import layer_stacking
from rl_curriculum.model import lora
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig

CONFIG = ModelConfig.tiny(vocab_size=48, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          mlp_dim=48, qkv_bias=True, init_std=0.2)
TOKENS = np.array([[3, 9, 27, 4, 11], [0, 0, 5, 40, 2]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], bool)
_forward = jax.jit(transformer.forward, static_argnums=0)


def _models(targets=tuple(lora.TARGETS), rank=3, alpha=6.0):
  """(base graphdef, base params, lora graphdef, full lora state) from the same seed."""
  base_graphdef, base_params = transformer.init_model(CONFIG, seed=0)
  model = transformer.Transformer(CONFIG, rngs=nnx.Rngs(0))
  lora.attach(model, lora.LoRAConfig(rank=rank, alpha=alpha, targets=targets), rngs=nnx.Rngs(1))
  graphdef, params = nnx.split(model)
  return base_graphdef, base_params, graphdef, params


def _with_random_b(params, seed=2, std=0.3):
  flat = dict(nnx.to_flat_state(params))
  for i, (path, var) in enumerate(sorted(flat.items(), key=lambda kv: str(kv[0]))):
    if path[-1] == "lora_b":
      noise = std * jax.random.normal(jax.random.key(seed * 1000 + i), var[...].shape)
      flat[path] = var.replace(noise)
  return nnx.from_flat_state(flat)


def _adapters(params):
  return {path: var[...] for path, var in nnx.to_flat_state(params)
          if isinstance(var, lora.LoRAWeight)}


def test_zero_b_equals_base_model_exactly():
  base_graphdef, base_params, graphdef, params = _models()
  assert len(_adapters(params)) == 2 * 7 * CONFIG.num_layers
  np.testing.assert_array_equal(_forward(graphdef, params, TOKENS, MASK),
                                _forward(base_graphdef, base_params, TOKENS, MASK))


def test_adapters_change_the_function_and_merge_equals_unmerged():
  base_graphdef, base_params, graphdef, params = _models()
  params = _with_random_b(params)
  unmerged = _forward(graphdef, params, TOKENS, MASK)
  assert np.max(np.abs(unmerged - _forward(base_graphdef, base_params, TOKENS, MASK))) > 1e-2
  merged = lora.merge(params)
  np.testing.assert_allclose(_forward(graphdef, merged, TOKENS, MASK), unmerged, atol=1e-5,
                             rtol=0)
  assert all(np.all(v == 0) for p, v in _adapters(merged).items() if p[-1] == "lora_b")


def test_merge_folds_scaled_product_into_kernel():
  _, _, _, params = _models(targets=("o",), rank=2, alpha=5.0)
  params = _with_random_b(params)
  merged = lora.merge(params)
  o = params["blocks"][1]["attn"]["o"]
  a, b, w = (np.asarray(o[name][...], np.float64) for name in ("lora_a", "lora_b", "kernel"))
  expected = w.copy()  # [heads, head_dim, embed] += 2.5 * sum_r A[h, d, r] B[r, e]
  for h in range(a.shape[0]):
    for d in range(a.shape[1]):
      for e in range(b.shape[1]):
        expected[h, d, e] += 2.5 * sum(a[h, d, r] * b[r, e] for r in range(2))
  np.testing.assert_allclose(merged["blocks"][1]["attn"]["o"]["kernel"][...], expected,
                             atol=1e-6, rtol=0)


def test_gradients_reach_only_the_adapters_and_are_nonzero():
  _, _, graphdef, params = _models()
  params = _with_random_b(params)
  lora_params, base_params = nnx.split_state(params, lora.LoRAWeight, ...)

  def loss(lora_params):
    logits = transformer.forward(graphdef, (lora_params, base_params), TOKENS, MASK)
    return -jnp.sum(jnp.where(MASK, jax.nn.log_softmax(logits)[:, :, 1], 0.0))

  grads = jax.jit(jax.grad(loss))(lora_params)
  assert jax.tree.structure(grads) == jax.tree.structure(lora_params)
  flat = list(nnx.to_flat_state(grads))
  assert len(flat) == 2 * 7 * CONFIG.num_layers
  for path, grad in flat:
    assert isinstance(grad, lora.LoRAWeight), path
    assert np.all(np.isfinite(grad[...])) and np.any(grad[...] != 0), path
  # Optimizer state is built from the adapter subtree alone: no base-shaped moments.
  opt_state = optax.adam(1e-3).init(lora_params)
  adapter_sizes = sum(x.size for x in jax.tree.leaves(lora_params))
  assert sum(x.size for x in jax.tree.leaves(opt_state)) == 2 * adapter_sizes + 1


def test_trainable_mask_selects_adapter_leaves_for_optax_masked():
  _, _, graphdef, params = _models(targets=("q", "down"))
  mask = lora.trainable_mask(params)
  assert sum(jax.tree.leaves(mask)) == 2 * 2 * CONFIG.num_layers
  optimizer = optax.masked(optax.sgd(1.0), mask)
  ones = jax.tree.map(jnp.ones_like, params)
  updates, _ = optimizer.update(ones, optimizer.init(params), params)
  for path, update in nnx.to_flat_state(updates):
    # masked-out leaves pass the incoming update through unchanged (1); adapters get -lr * 1.
    expected = -1.0 if path[-1] in ("lora_a", "lora_b") else 1.0
    assert np.all(update[...] == expected), path


def test_merge_and_reinit_preserves_function_and_resets_adapters():
  _, _, graphdef, params = _models()
  params = _with_random_b(params)
  before = _forward(graphdef, params, TOKENS, MASK)
  fresh = lora.merge_and_reinit(params, jax.random.key(7))
  np.testing.assert_allclose(_forward(graphdef, fresh, TOKENS, MASK), before, atol=1e-5, rtol=0)
  old, new = _adapters(params), _adapters(fresh)
  for path, value in new.items():
    if path[-1] == "lora_b":
      assert np.all(value == 0), path
    else:
      bound = 1.0 / np.sqrt(np.prod(value.shape[:-1]))
      assert np.all(np.abs(value) <= bound) and not np.allclose(value, old[path]), path
      assert np.std(value) > 0.3 * bound, path  # spread over the init range, not collapsed
  # The same key gives the same adapters; a different key different ones.
  again = _adapters(lora.merge_and_reinit(params, jax.random.key(7)))
  other = _adapters(lora.merge_and_reinit(params, jax.random.key(8)))
  a_path = next(p for p in new if p[-1] == "lora_a")
  np.testing.assert_array_equal(again[a_path], new[a_path])
  assert not np.allclose(other[a_path], new[a_path])


def test_disabled_adapters_equal_base_model():
  base_graphdef, base_params, graphdef, params = _models()
  params = _with_random_b(params)
  base = _forward(base_graphdef, base_params, TOKENS, MASK)
  np.testing.assert_array_equal(_forward(graphdef, lora.disable(params), TOKENS, MASK), base)
  # Also on split states, as the trainer holds them, and under jit.
  lora_params, rest = nnx.split_state(params, lora.LoRAWeight, ...)
  reference = jax.jit(lambda l, r: transformer.forward(graphdef, lora.disable((l, r)), TOKENS,
                                                       MASK))(lora_params, rest)
  np.testing.assert_array_equal(reference, base)


def test_lora_split_separates_subtrees():
  model = transformer.Transformer(CONFIG, rngs=nnx.Rngs(0))
  lora.attach(model, lora.LoRAConfig(rank=2, alpha=2.0, targets=("v",)), rngs=nnx.Rngs(1))
  _, lora_params, base_params = lora.split(model)
  assert all(isinstance(v, lora.LoRAWeight)
             for _, v in nnx.to_flat_state(lora_params))
  assert not any(isinstance(v, lora.LoRAWeight) for _, v in nnx.to_flat_state(base_params))
  assert sum(x.size for x in jax.tree.leaves(base_params)) == CONFIG.num_params
  v = lora_params["blocks"][0]["attn"]["v"]
  assert v["lora_a"].get_metadata("out_sharding") == ("embed", None)
  assert v["lora_b"].get_metadata("out_sharding") == (None, "kv_heads", "head_dim")


def test_unknown_target_raises_naming_it():
  with pytest.raises(ValueError, match="'qq'"):
    lora.LoRAConfig(rank=2, alpha=1.0, targets=("q", "qq"))


@pytest.mark.parametrize("kwargs, field", [
    (dict(rank=0, alpha=1.0), "rank"), (dict(rank=2, alpha=0.0), "alpha"),
    (dict(rank=2, alpha=1.0, targets=()), "targets")])
def test_invalid_lora_config_raises(kwargs, field):
  with pytest.raises(ValueError, match=field):
    lora.LoRAConfig(**kwargs)


def test_string_targets_are_split_on_commas():
  assert lora.LoRAConfig(rank=1, alpha=1.0, targets="q, v,down").targets == ("q", "v", "down")


def test_target_missing_from_the_model_raises_naming_it():

  class AttentionOnly(nnx.Module):

    def __init__(self):
      self.attn = transformer.Attention(CONFIG, rngs=nnx.Rngs(0))

  class NoMLP(nnx.Module):

    def __init__(self):
      self.blocks = nnx.List([AttentionOnly()])

  with pytest.raises(ValueError, match="'gate'"):
    lora.attach(NoMLP(), lora.LoRAConfig(rank=2, alpha=1.0, targets=("q", "gate")),
                rngs=nnx.Rngs(0))


def test_attaching_twice_and_merging_adapters_alone_raise():
  model = transformer.Transformer(CONFIG, rngs=nnx.Rngs(0))
  config = lora.LoRAConfig(rank=2, alpha=1.0, targets=("q",))
  lora.attach(model, config, rngs=nnx.Rngs(1))
  with pytest.raises(ValueError, match="already"):
    lora.attach(model, config, rngs=nnx.Rngs(1))
  _, lora_params, _ = lora.split(model)
  with pytest.raises(ValueError, match="full state"):
    lora.merge(lora_params)


@pytest.mark.parametrize("targets", [("q", "k", "v"), ("q", "v"), ("k",), ("gate", "up")])
def test_projections_sharing_an_input_equal_each_projection_alone(targets):
  # project_shared_input runs x . [A_q | A_k | A_v] as one matmul; values and adapter gradients
  # must equal y = x . W + b + s (x . A) . B computed projection by projection.
  _, _, graphdef, params = _models(targets=targets, rank=3, alpha=6.0)
  params = _with_random_b(params)
  model = nnx.merge(graphdef, params)
  block = model.blocks[0]
  projections = ((block.mlp.gate, block.mlp.up) if "gate" in targets
                 else (block.attn.q, block.attn.k, block.attn.v))
  x = jax.random.normal(jax.random.key(5), (2, 4, CONFIG.d_model))

  def alone(p, a, x):
    y = jnp.tensordot(x, p.kernel[...], axes=1)
    if p.bias is not None:
      y = y + p.bias[...][None, None]
    if a is not None:
      y = y + 2.0 * jnp.tensordot(jnp.tensordot(x, a, axes=1), p.lora_b[...], axes=1)
    return y

  a_s = [None if p.lora_a is None else p.lora_a[...] for p in projections]
  expected = [alone(p, a, x) for p, a in zip(projections, a_s)]
  fused = transformer.project_shared_input(x, projections)
  assert sum(a is not None for a in a_s) == len(targets)
  for got, want in zip(fused, expected):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)

  names = ("gate", "up") if "gate" in targets else ("q", "k", "v")
  part = block.mlp if "gate" in targets else block.attn
  part_graphdef, adapters, rest = nnx.split(part, lora.LoRAWeight, ...)

  def loss_fused(adapters):
    module = nnx.merge(part_graphdef, adapters, rest)
    ys = transformer.project_shared_input(x, [getattr(module, n) for n in names])
    return sum(jnp.sum(jnp.sin(y)) for y in ys)

  def loss_alone(a_s):
    return sum(jnp.sum(jnp.sin(alone(p, a, x))) for p, a in zip(projections, a_s))

  grads_fused, grads_alone = jax.grad(loss_fused)(adapters), jax.grad(loss_alone)(a_s)
  for name, want in zip(names, grads_alone):
    if want is not None:
      assert np.max(np.abs(want)) > 1e-3
      np.testing.assert_allclose(grads_fused[name]["lora_a"][...], want, atol=1e-4, rtol=0)


# --- scanned layout ------------------------------------------------------------------------------

SCANNED = dataclasses.replace(CONFIG, scan_layers=True)


def _scanned_models(targets=tuple(lora.TARGETS), rank=3, alpha=6.0):
  """(unrolled lora graphdef, its state, scanned lora graphdef, its state), same seeds."""
  configs = lora.LoRAConfig(rank=rank, alpha=alpha, targets=targets)
  out = []
  for config in (CONFIG, SCANNED):
    model = transformer.Transformer(config, rngs=nnx.Rngs(0))
    lora.attach(model, configs, rngs=nnx.Rngs(1))
    out += list(nnx.split(model))
  return tuple(out)


def _assert_states_equal(a, b, atol=0.0):
  flat_a, flat_b = list(nnx.to_flat_state(a)), list(nnx.to_flat_state(b))
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    assert type(x) is type(y) and x.get_metadata() == y.get_metadata(), path
    np.testing.assert_allclose(np.asarray(x[...]), np.asarray(y[...]), atol=atol, rtol=0,
                               err_msg=str(path))


def test_scanned_attach_stacks_the_unrolled_adapters():
  graphdef, params, graphdef_s, params_s = _scanned_models(targets=("q", "v", "down"))
  # A drawn per layer in the same order as the unrolled model, B zero, `layers` axis first.
  _assert_states_equal(params_s, layer_stacking.stack_layers(params))
  a = params_s["blocks"]["attn"]["v"]["lora_a"]
  assert a[...].shape == (CONFIG.num_layers, CONFIG.d_model, 3)
  assert a.get_metadata("out_sharding") == ("layers", "embed", None)
  assert params_s["blocks"]["attn"]["v"]["lora_b"].get_metadata("out_sharding") == (
      "layers", None, "kv_heads", "head_dim")
  assert not np.allclose(a[...][0], a[...][1])  # each layer its own draw
  assert sum(jax.tree.leaves(lora.trainable_mask(params_s))) == 2 * 3
  _, lora_params, base_params = lora.split(nnx.merge(graphdef_s, params_s))
  assert all(isinstance(v, lora.LoRAWeight) for _, v in nnx.to_flat_state(lora_params))
  assert sum(x.size for x in jax.tree.leaves(base_params)) == CONFIG.num_params


def test_scanned_lora_forward_gradients_and_merges_equal_unrolled():
  graphdef, params, graphdef_s, params_s = _scanned_models()
  params = _with_random_b(params)
  params_s = layer_stacking.stack_layers(params)
  expected = _forward(graphdef, params, TOKENS, MASK)
  np.testing.assert_allclose(_forward(graphdef_s, params_s, TOKENS, MASK), expected, atol=1e-5,
                             rtol=0)
  # Gradients w.r.t. the adapters alone, as the trainer takes them.
  def grads(graphdef, params):
    lora_params, base_params = nnx.split_state(params, lora.LoRAWeight, ...)
    def loss(lora_params):
      logits = transformer.forward(graphdef, (lora_params, base_params), TOKENS, MASK)
      return -jnp.sum(jnp.where(MASK, jax.nn.log_softmax(logits)[:, :, 1], 0.0))
    return jax.jit(jax.grad(loss))(lora_params)
  # Gradients of a whole two-layer model (a module: 1e-4; entries reach ~6, and the scanned and
  # unrolled programs sum in different orders, about 1e-5 apart on some CPUs).
  _assert_states_equal(grads(graphdef_s, params_s),
                       layer_stacking.stack_layers(grads(graphdef, params)), atol=1e-4)
  _assert_states_equal(lora.merge(params_s), layer_stacking.stack_layers(lora.merge(params)),
                       atol=1e-6)
  _assert_states_equal(lora.disable(params_s), layer_stacking.stack_layers(lora.disable(params)))
  key = jax.random.key(7)
  _assert_states_equal(lora.merge_and_reinit(params_s, key),
                       layer_stacking.stack_layers(lora.merge_and_reinit(params, key)), atol=1e-6)
  np.testing.assert_allclose(_forward(graphdef_s, lora.merge(params_s), TOKENS, MASK), expected,
                             atol=1e-5, rtol=0)
