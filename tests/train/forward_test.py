"""Tests of rl_curriculum/train/forward.py: prompt features in batches."""

import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.train import forward


@pytest.mark.parametrize("batch_size", [1, 3, 7, 64])
def test_prompt_features_in_batches_equal_one_pass(batch_size):
  graphdef, params = transformer.init_model(
      ModelConfig.tiny(vocab_size=16, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                       mlp_dim=64), seed=0)
  rng = np.random.default_rng(0)
  n, tp = 10, 6
  tokens = rng.integers(1, 16, (n, tp)).astype(np.int32)
  mask = np.arange(tp)[None, :] >= rng.integers(0, tp, n)[:, None]  # left padding
  hidden = np.asarray(transformer.forward_hidden(graphdef, params, jnp.asarray(tokens),
                                                 jnp.asarray(mask)), np.float64)
  expected = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  got = forward.prompt_features(graphdef, params, tokens, mask, batch_size=batch_size)
  assert got.shape == (n, 32) and got.dtype == np.float32
  np.testing.assert_allclose(got, expected, atol=1e-5)


def test_prompt_features_reject_an_empty_batch():
  with pytest.raises(ValueError, match="batch_size"):
    forward.prompt_features(None, None, np.zeros((2, 2), np.int32), np.ones((2, 2), bool),
                            batch_size=0)
