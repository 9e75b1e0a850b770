"""Tests of rl_curriculum/model/gguf_io.py (no torch needed)."""

import numpy as np
import pytest

from rl_curriculum.model import gguf_io
from rl_curriculum.model.checkpoint_errors import UnsupportedCheckpointError
from rl_curriculum.model.config import ModelConfig


# --- Q/K permutation ------------------------------------------------------------------------------


def _loop_permute(w, num_heads):
  """llama.cpp's permutation written row by row: within a head of width d, output row 2i is
  input row i and output row 2i + 1 is input row d/2 + i."""
  d = w.shape[0] // num_heads
  out = np.empty_like(w)
  for h in range(num_heads):
    for i in range(d // 2):
      out[h * d + 2 * i] = w[h * d + i]
      out[h * d + 2 * i + 1] = w[h * d + d // 2 + i]
  return out


@pytest.mark.parametrize("num_heads,head_dim", [(1, 2), (3, 8), (4, 64)])
def test_permute_matches_row_loop_and_unpermute_inverts_it(num_heads, head_dim):
  w = np.random.default_rng(0).normal(size=(num_heads * head_dim, 5)).astype(np.float32)
  permuted = gguf_io.permute_qk(w, num_heads)
  np.testing.assert_array_equal(permuted, _loop_permute(w, num_heads))
  np.testing.assert_array_equal(gguf_io.unpermute_qk(permuted, num_heads), w)
  assert not np.array_equal(permuted, w) or head_dim == 2


# --- names and config -----------------------------------------------------------------------------


def test_gguf_names():
  assert gguf_io.gguf_to_hf_name("token_embd.weight") == "model.embed_tokens.weight"
  assert (gguf_io.gguf_to_hf_name("blk.11.attn_output.weight")
          == "model.layers.11.self_attn.o_proj.weight")
  assert (gguf_io.gguf_to_hf_name("blk.0.attn_k_norm.weight")
          == "model.layers.0.self_attn.k_norm.weight")
  assert gguf_io.gguf_to_hf_name("rope_freqs.weight") is None


def test_config_from_gguf():
  metadata = {
      "general.architecture": "llama", "llama.block_count": 30, "llama.embedding_length": 576,
      "llama.feed_forward_length": 1536, "llama.attention.head_count": 9,
      "llama.attention.head_count_kv": 3, "llama.rope.freq_base": 100000.0,
      "llama.attention.layer_norm_rms_epsilon": float(np.float32(1e-5)), "llama.vocab_size": 49152,
  }
  config, family = gguf_io.config_from_gguf(metadata, ["token_embd.weight"])
  assert family == "llama"
  assert config == ModelConfig.smollm2_135m()
  untied, _ = gguf_io.config_from_gguf(metadata, ["token_embd.weight", "output.weight"])
  assert not untied.tie_embeddings
  with pytest.raises(UnsupportedCheckpointError, match="qwen2, qwen3"):
    gguf_io.config_from_gguf(dict(metadata, **{"general.architecture": "phi3"}), [])
  with pytest.raises(UnsupportedCheckpointError, match="rope_freqs"):
    gguf_io.config_from_gguf(metadata, ["rope_freqs.weight"])
