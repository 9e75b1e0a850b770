"""Tests of rl_curriculum/model/transformer.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_curriculum.model import decoding
from rl_curriculum.model import kv_cache
from rl_curriculum.model import transformer
import test_util

WIDTH = 9  # every batch here is [3, WIDTH] so the jitted forward compiles once per variant
LOGICAL_AXES = {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp"}
# Jitted once per module so tests with equal configs and shapes share the compiled programs.
_forward = jax.jit(transformer.forward, static_argnums=0)


# --- NumPy reference, written with loops over rows, positions and heads --------------------------


def _np_rms(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _np_rope(x, position, theta):
  """x[H, D] rotated at one position: pair (i, i + D/2) by angle position * theta^(-2i/D)."""
  out = x.copy()
  d = x.shape[-1]
  for i in range(d // 2):
    angle = position * theta ** (-2.0 * i / d)
    a, b = x[:, i], x[:, i + d // 2]
    out[:, i] = a * np.cos(angle) - b * np.sin(angle)
    out[:, i + d // 2] = b * np.cos(angle) + a * np.sin(angle)
  return out


def _np_forward(c, params, tokens, mask):
  """float64 logits [B, T, V]; each row computed on its unpadded tokens, NaN at padding."""
  w = jax.tree.map(lambda x: np.asarray(x, np.float64), nnx.to_pure_dict(params))
  out = np.full(tokens.shape + (c.vocab_size,), np.nan)
  group = c.num_heads // c.num_kv_heads
  for row in range(tokens.shape[0]):
    idx = [t for t in range(tokens.shape[1]) if mask[row, t]]
    n = len(idx)
    x = w["embed"][tokens[row, idx]]
    for layer in range(c.num_layers):
      p = w["blocks"][layer]
      a = p["attn"]
      h = _np_rms(x, p["attn_norm"]["scale"], c.rms_eps)
      q = np.zeros((n, c.num_heads, c.head_dim))
      k = np.zeros((n, c.num_kv_heads, c.head_dim))
      v = np.zeros((n, c.num_kv_heads, c.head_dim))
      for t in range(n):
        for head in range(c.num_heads):
          q[t, head] = h[t] @ a["q"]["kernel"][:, head, :]
          if c.qkv_bias:
            q[t, head] += a["q"]["bias"][head]
        for head in range(c.num_kv_heads):
          k[t, head] = h[t] @ a["k"]["kernel"][:, head, :]
          v[t, head] = h[t] @ a["v"]["kernel"][:, head, :]
          if c.qkv_bias:
            k[t, head] += a["k"]["bias"][head]
            v[t, head] += a["v"]["bias"][head]
        if c.qk_norm:
          q[t] = _np_rms(q[t], a["q_norm"]["scale"], c.rms_eps)
          k[t] = _np_rms(k[t], a["k_norm"]["scale"], c.rms_eps)
        q[t] = _np_rope(q[t], t, c.rope_theta)
        k[t] = _np_rope(k[t], t, c.rope_theta)
      attended = np.zeros((n, c.num_heads, c.head_dim))
      for head in range(c.num_heads):
        kv = head // group
        for t in range(n):
          scores = np.array([q[t, head] @ k[j, kv] / np.sqrt(c.head_dim) for j in range(t + 1)])
          probs = np.exp(scores - scores.max())
          probs /= probs.sum()
          attended[t, head] = sum(probs[j] * v[j, kv] for j in range(t + 1))
      for t in range(n):
        x[t] = x[t] + sum(attended[t, head] @ a["o"]["kernel"][head]
                          for head in range(c.num_heads))
      h = _np_rms(x, p["mlp_norm"]["scale"], c.rms_eps)
      gate = h @ p["mlp"]["gate"]["kernel"]
      x = x + (gate / (1.0 + np.exp(-gate)) * (h @ p["mlp"]["up"]["kernel"])) @ p["mlp"]["down"][
          "kernel"]
    x = _np_rms(x, w["final_norm"]["scale"], c.rms_eps)
    head_w = w["embed"].T if c.tie_embeddings else w["head"]
    out[row, idx] = x @ head_w
  return out


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(test_util.MODEL_VARIANTS))
def test_forward_matches_numpy_reference(variant):
  config = test_util.variant_config(variant)
  graphdef, params = test_util.randomised_model(config)
  tokens, mask = test_util.left_padded_batch(1, config.vocab_size, lengths=[9, 4, 1], width=WIDTH)
  logits = _forward(graphdef, params, tokens, mask)
  expected = _np_forward(config, params, tokens, mask)
  assert logits.dtype == jnp.float32 and logits.shape == (3, 9, config.vocab_size)
  np.testing.assert_allclose(np.asarray(logits)[mask], expected[mask], atol=1e-4, rtol=0)


def test_forward_jit_and_no_jit_agree():
  config = test_util.variant_config("llama_gqa")
  graphdef, params = test_util.randomised_model(config, seed=3)
  tokens, mask = test_util.left_padded_batch(2, config.vocab_size, lengths=[9, 5, 2], width=WIDTH)
  eager = transformer.forward(graphdef, params, tokens, mask)
  jitted = _forward(graphdef, params, tokens, mask)
  np.testing.assert_allclose(eager, jitted, atol=1e-5, rtol=0)


def test_left_padded_row_equals_unpadded_row():
  config = test_util.variant_config("llama_gqa")
  graphdef, params = test_util.randomised_model(config, seed=4)
  row = np.array([5, 17, 3, 40, 8, 1, 33, 21, 9], np.int32)
  # Row 0 unpadded; rows 1 and 2 hold its first 6 and 1 tokens behind garbage padding. By
  # causality row 0's first n logits are those of its n-token prefix.
  tokens = np.stack([row, np.r_[[47, 0, 12], row[:6]], np.r_[[7] * 8, row[:1]]]).astype(np.int32)
  mask = np.stack([np.ones(WIDTH, bool), np.arange(WIDTH) >= 3, np.arange(WIDTH) >= 8])
  logits = np.asarray(_forward(graphdef, params, tokens, mask))
  np.testing.assert_allclose(logits[1, 3:], logits[0, :6], atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits[2, 8:], logits[0, :1], atol=1e-4, rtol=0)
  assert np.all(np.isfinite(logits))


@pytest.mark.parametrize("variant", test_util.fast_first(sorted(test_util.MODEL_VARIANTS)))
def test_shared_prefix_equals_full_forward_values_and_gradients(variant):
  """Two prefixes (left-padded, lengths 5 and 2), three continuations each: the shared-prefix
  pass equals the full forward pass over each row's prefix ++ continuation, and so does the
  gradient of a loss that reads both the prefix's and the continuations' hidden states."""
  config = test_util.variant_config(variant)
  graphdef, params = test_util.randomised_model(config, seed=12)
  tp, t, group = 5, 4, 3
  prefix, prefix_mask = test_util.left_padded_batch(13, config.vocab_size, lengths=[5, 2], width=tp)
  tokens = np.random.default_rng(14).integers(0, config.vocab_size, size=(2 * group, t))
  full_tokens = np.concatenate([np.repeat(prefix, group, axis=0), tokens], axis=1)
  full_mask = np.concatenate([np.repeat(prefix_mask, group, axis=0),
                              np.ones((2 * group, t), bool)], axis=1)
  probe = np.random.default_rng(15).normal(size=(1, tp + t, config.d_model)).astype(np.float32)

  def shared(params):
    prefix_hidden, hidden = transformer.shared_prefix_hidden(graphdef, params, prefix,
                                                             prefix_mask, tokens)
    prefix_hidden = jnp.where(prefix_mask[:, :, None], prefix_hidden, 0.0)
    loss = jnp.sum(prefix_hidden * probe[:, :tp]) * group + jnp.sum(hidden * probe[:, tp:])
    return loss, (prefix_hidden, hidden)

  def full(params):
    hidden = transformer.forward_hidden(graphdef, params, full_tokens, full_mask)
    hidden = jnp.where(full_mask[:, :, None], hidden, 0.0)
    return jnp.sum(hidden * probe), hidden

  (loss_s, (prefix_hidden, hidden)), grads_s = jax.jit(
      jax.value_and_grad(shared, has_aux=True))(params)
  (loss_f, full_hidden), grads_f = jax.jit(jax.value_and_grad(full, has_aux=True))(params)
  assert hidden.shape == (2 * group, t, config.d_model)
  np.testing.assert_allclose(hidden, full_hidden[:, tp:], atol=1e-5, rtol=0)
  np.testing.assert_allclose(prefix_hidden, full_hidden[::group, :tp], atol=1e-5, rtol=0)
  np.testing.assert_allclose(loss_s, loss_f, rtol=1e-5)
  for (path, a), (_, b) in zip(nnx.to_flat_state(grads_s), nnx.to_flat_state(grads_f)):
    np.testing.assert_allclose(a[...], b[...], atol=1e-4, rtol=1e-4, err_msg=str(path))


def test_shared_prefix_rejects_rows_that_do_not_split_into_groups():
  config = test_util.variant_config("llama_gqa")
  graphdef, params = transformer.init_model(config)
  with pytest.raises(ValueError, match="groups"):
    transformer.shared_prefix_hidden(graphdef, params, np.zeros((2, 3), np.int32),
                                     np.ones((2, 3), bool), np.zeros((5, 2), np.int32))


def test_hidden_states_then_head_equal_forward():
  config = test_util.variant_config("qwen2_bias_untied")
  graphdef, params = test_util.randomised_model(config, seed=8)
  tokens, mask = test_util.left_padded_batch(9, config.vocab_size, lengths=[9, 4, 2], width=WIDTH)

  @jax.jit
  def hidden_then_head(params):
    hidden = transformer.forward_hidden(graphdef, params, tokens, mask)
    return hidden, transformer.logits_from_hidden(graphdef, params, hidden)

  hidden, logits = hidden_then_head(params)
  assert hidden.shape == (3, WIDTH, config.d_model)
  np.testing.assert_allclose(logits, _forward(graphdef, params, tokens, mask), atol=1e-6, rtol=0)
  # The final norm has been applied: rms of each hidden row equals that of final_norm's scale.
  scale = np.asarray(params["final_norm"]["scale"][...])
  unit = np.asarray(hidden)[mask] / scale[None, :]
  np.testing.assert_allclose(np.sqrt(np.mean(unit ** 2, axis=-1)), 1.0, atol=1e-4)


def test_every_parameter_gets_a_gradient():
  config = test_util.variant_config("qwen2_bias_untied", qk_norm=True, num_layers=1)  # every kind of parameter
  graphdef, params = test_util.randomised_model(config, seed=10)
  tokens, mask = test_util.left_padded_batch(11, config.vocab_size, lengths=[4, 3], width=4)

  def loss(params):
    logits = transformer.forward(graphdef, params, tokens, mask)
    return jnp.sum(jnp.where(mask[:, :, None], jax.nn.log_softmax(logits)[..., :7], 0.0))

  grads = jax.jit(jax.grad(loss))(params)
  for path, grad in nnx.to_flat_state(grads):
    assert np.all(np.isfinite(grad[...])), path
    assert np.any(grad[...] != 0), path


def test_parameters_carry_logical_axis_names():
  config = test_util.variant_config("qwen3_qknorm_mqa", qkv_bias=True, tie_embeddings=False)
  _, params = transformer.init_model(config)
  for path, var in nnx.to_flat_state(params):
    names = var.get_metadata("out_sharding")
    assert len(names) == var[...].ndim, path
    assert set(names) <= LOGICAL_AXES, (path, names)
  specs = nnx.get_partition_spec(params)
  assert specs["blocks"][0]["attn"]["k"]["kernel"].get_value() == jax.sharding.PartitionSpec(
      "embed", "kv_heads", "head_dim")
  assert specs["embed"].get_value() == jax.sharding.PartitionSpec("vocab", "embed")


def test_bfloat16_params_and_activations_give_finite_logits():
  config = test_util.variant_config("qwen3_qknorm_mqa", dtype="bfloat16", param_dtype="bfloat16")
  # Random float32 weights of the same shapes, stored in bfloat16 (cheaper than a bfloat16 init).
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(config,
                                                                      rngs=nnx.Rngs(0))))[0]
  graphdef_f32, params_f32 = test_util.randomised_model(test_util.variant_config("qwen3_qknorm_mqa"), seed=12)
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params_f32)
  tokens, mask = test_util.left_padded_batch(12, config.vocab_size, lengths=[5, 2, 4], width=5)

  @jax.jit
  def run(params):
    logits = transformer.forward(graphdef, params, tokens, mask)
    last, cache = decoding.prefill(graphdef, params, tokens, mask, WIDTH)
    key_mask = kv_cache.cache_key_mask(jnp.asarray(mask), WIDTH)
    step, cache = decoding.decode_step(graphdef, params, jnp.argmax(last, -1).astype(jnp.int32),
                                       jnp.asarray(mask.sum(1), jnp.int32), key_mask, cache,
                                       jnp.int32(5))
    return logits, last, step, cache

  logits, last, step, cache = run(params)
  assert cache.k[0].dtype == jnp.bfloat16
  for out in (logits, last, step):
    assert out.dtype == jnp.float32 and np.all(np.isfinite(out))
  # A sanity bound, not a parity test: bfloat16 keeps 8 mantissa bits, so logits of a few units
  # move by a few hundredths; a wrong cast or mask would move them by units.
  f32 = _forward(graphdef_f32, params_f32, np.pad(tokens, ((0, 0), (4, 0))),
                 np.pad(mask, ((0, 0), (4, 0))))
  err = np.max(np.abs(np.asarray(f32)[:, 4:][mask] - np.asarray(logits)[mask]))
  assert err < 0.25


def test_cache_without_index_raises():
  config = test_util.variant_config("llama_gqa")
  model = transformer.Transformer(config, rngs=nnx.Rngs(0))
  cache = kv_cache.init_cache(config, 1, 4)
  with pytest.raises(ValueError, match="cache_index"):
    model(jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 4), bool),
          cache=cache)
