"""Tests of rl_curriculum/model/decoding.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.model import decoding
from rl_curriculum.model import kv_cache
from rl_curriculum.model import transformer
import test_util

WIDTH = 9  # every batch here is [3, WIDTH] so the jitted forward compiles once per variant
# Jitted once per module so tests with equal configs and shapes share the compiled programs.
_forward = jax.jit(transformer.forward, static_argnums=0)
_prefill = jax.jit(decoding.prefill, static_argnums=(0, 4))
_decode_step = jax.jit(decoding.decode_step, static_argnums=0)


@pytest.mark.parametrize("variant", sorted(test_util.MODEL_VARIANTS))
def test_kv_cache_decoding_equals_full_forward(variant):
  config = test_util.variant_config(variant)
  graphdef, params = test_util.randomised_model(config, seed=5)
  prompt_len, num_new = 5, 4
  prompts, prompt_mask = test_util.left_padded_batch(6, config.vocab_size, lengths=[5, 2, 4],
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
