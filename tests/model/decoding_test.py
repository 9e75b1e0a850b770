"""Tests of rl_curriculum/model/decoding.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_curriculum.model import decoding
from rl_curriculum.model import kv_cache
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig

BASE = dict(vocab_size=48, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=48)
VARIANTS = {
    "llama_gqa": dict(BASE),
    "qwen2_bias_untied": dict(BASE, qkv_bias=True, tie_embeddings=False, rope_theta=500.0),
    "qwen3_qknorm_mqa": dict(BASE, qk_norm=True, num_kv_heads=1),
}
WIDTH = 9  # every batch here is [3, WIDTH] so the jitted forward compiles once per variant
# Jitted once per module so tests with equal configs and shapes share the compiled programs.
_forward = jax.jit(transformer.forward, static_argnums=0)
_prefill = jax.jit(decoding.prefill, static_argnums=(0, 4))
_decode_step = jax.jit(decoding.decode_step, static_argnums=0)


def _config(name, **overrides):
  return ModelConfig.tiny(**{**VARIANTS[name], **overrides})


def _randomised(config, seed=0, std=0.2):
  """A model whose every parameter (norm scales and biases too) is random, split."""
  graphdef, params = transformer.init_model(config, seed)
  return graphdef, _randomise(params, jax.random.key(seed + 100), std)


def _randomise(params, key, std):
  flat = dict(nnx.to_flat_state(params))
  for i, (path, var) in enumerate(sorted(flat.items(), key=lambda kv: str(kv[0]))):
    noise = std * jax.random.normal(jax.random.fold_in(key, i), var[...].shape)
    value = 1.0 + noise if path[-1] == "scale" else noise
    flat[path] = var.replace(value.astype(var[...].dtype))
  return nnx.from_flat_state(flat)


def _left_padded_batch(seed, vocab, lengths, width):
  """tokens i32[B, width] (garbage in the padding), mask bool[B, width], right-aligned rows."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, size=(len(lengths), width)).astype(np.int32)
  mask = np.zeros((len(lengths), width), bool)
  for b, n in enumerate(lengths):
    mask[b, width - n:] = True
  return tokens, mask


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kv_cache_decoding_equals_full_forward(variant):
  config = _config(variant)
  graphdef, params = _randomised(config, seed=5)
  prompt_len, num_new = 5, 4
  prompts, prompt_mask = _left_padded_batch(6, config.vocab_size, lengths=[5, 2, 4],
                                            width=prompt_len)
  assert prompt_len + num_new == WIDTH
  new_tokens = np.random.default_rng(7).integers(0, config.vocab_size, size=(3, num_new))
  logits, cache = _prefill(graphdef, params, prompts, prompt_mask, prompt_len + num_new)
  decoded = [logits]
  key_mask = kv_cache.cache_key_mask(jnp.asarray(prompt_mask), prompt_len + num_new)
  positions = prompt_mask.sum(axis=1).astype(np.int32)
  for t in range(num_new - 1):
    logits, cache = _decode_step(graphdef, params, new_tokens[:, t], positions + t, key_mask, cache,
                         jnp.int32(prompt_len + t))
    decoded.append(logits)

  full_tokens = np.concatenate([prompts, new_tokens], axis=1)
  full_mask = np.concatenate([prompt_mask, np.ones((3, num_new), bool)], axis=1)
  full = _forward(graphdef, params, full_tokens, full_mask)
  for t, logits in enumerate(decoded):
    np.testing.assert_allclose(logits, full[:, prompt_len - 1 + t], atol=1e-4, rtol=0)
