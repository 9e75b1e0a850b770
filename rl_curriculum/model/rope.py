"""Rotary position embeddings, rotate-half layout as in HF Llama.

A query or key vector x[D] at position p is rotated pairwise: with x = (x1, x2) split in halves
and angles a_i = p * f_i for the inverse frequencies f_i = theta^(-2i / D), i < D / 2,

  rope(x, p) = (x1 cos a - x2 sin a,  x2 cos a + x1 sin a),

so the dot product of a rotated query and key depends on their positions only through p_q - p_k.

References: Su et al. (2021), "RoFormer: Enhanced Transformer with Rotary Position Embedding",
arXiv:2104.09864; the Llama 3 frequency scaling: Meta (2024), "The Llama 3 Herd of Models",
arXiv:2407.21783, as in HF transformers' `_compute_llama3_parameters`.
"""

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.model.config import ModelConfig


def rope_frequencies(config: ModelConfig) -> np.ndarray:
  """Inverse rotary frequencies f32[head_dim / 2]: theta^(-2i / head_dim), Llama-3 scaled if set.

  Llama 3 scaling (Meta 2024, as in HF `_compute_llama3_parameters`): wavelengths longer than
  L / low_freq_factor are divided by `factor`, shorter than L / high_freq_factor kept, and the band
  between interpolated smoothly, with L = rope_original_max_len.
  """
  d = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
  if config.rope_scaling_factor is not None:
    factor = config.rope_scaling_factor
    low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
    old_len = config.rope_original_max_len
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    inv_freq = np.where(medium, smoothed, scaled)
  return inv_freq.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotates x[B, T, H, D] by angle positions[B, T] * inv_freq[D / 2] (rotate-half layout)."""
  angles = positions.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq)[None, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  cos = jnp.cos(angles)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """Rotary positions i32[B, T] of a left-padded batch: the first real token of a row is 0.

  positions[b, t] = max(sum_{t' <= t} mask[b, t'] - 1, 0); padding slots get 0 (they are masked).
  """
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)
