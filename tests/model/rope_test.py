"""Tests of rl_curriculum/model/rope.py: rotary frequencies, rotation, positions of a padded batch."""

import jax.numpy as jnp
import numpy as np

import test_util
from rl_curriculum.model import rope
from rl_curriculum.model.config import ModelConfig


def test_positions_from_mask():
  mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], bool)
  expected = np.array([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(rope.positions_from_mask(mask), expected)


def test_llama3_rope_scaling_matches_reference():
  config = ModelConfig.tiny(vocab_size=8, d_model=256, num_heads=2, rope_theta=500_000.0,
                            rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                            rope_high_freq_factor=4.0, rope_original_max_len=8192)
  d = config.head_dim
  expected = []
  for i in range(d // 2):
    freq = 1.0 / 500_000.0 ** (2 * i / d)
    wavelen = 2 * np.pi / freq
    if wavelen < 8192 / 4.0:
      expected.append(freq)
    elif wavelen > 8192 / 1.0:
      expected.append(freq / 8.0)
    else:
      smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
      expected.append((1 - smooth) * freq / 8.0 + smooth * freq)
  np.testing.assert_allclose(rope.rope_frequencies(config), expected, rtol=1e-6)
  unscaled = rope.rope_frequencies(ModelConfig.tiny(vocab_size=8, d_model=256,
                                                    num_heads=2, rope_theta=500_000.0))
  assert unscaled[0] == expected[0] and unscaled[-1] > expected[-1]


@test_util.JIT
def test_rotation_keeps_norms_and_scores_depend_on_relative_position(use_jit):
  config = ModelConfig.tiny(vocab_size=8, d_model=32, num_heads=2)
  inv_freq = rope.rope_frequencies(config)
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(1, 1, 1, config.head_dim)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 1, 1, config.head_dim)), jnp.float32)
  rotate = test_util.maybe_jit(rope.apply_rope, use_jit, inv_freq=inv_freq)

  def score(pos_q, pos_k):
    return float(jnp.sum(rotate(q, jnp.full((1, 1), pos_q)) * rotate(k, jnp.full((1, 1), pos_k))))

  np.testing.assert_allclose(np.linalg.norm(rotate(q, jnp.full((1, 1), 7))),
                             np.linalg.norm(q), **test_util.TOL)
  np.testing.assert_allclose(score(0, 0), float(jnp.sum(q * k)), **test_util.TOL)
  np.testing.assert_allclose(score(9, 4), score(5, 0), **test_util.TOL)
  np.testing.assert_allclose(score(12, 15), score(0, 3), **test_util.TOL)
