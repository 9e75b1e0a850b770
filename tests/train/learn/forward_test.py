"""Tests of rl_curriculum/train/learn/forward.py: the chunked output head, row blocks, prompt features."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.rl import logprobs as logprobs_lib
from rl_curriculum.train.learn import forward


def _tiny(**overrides):
  fields = dict(vocab_size=16, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=64)
  return transformer.init_model(ModelConfig.tiny(**{**fields, **overrides}), seed=0)


def _full_head(graphdef, params, hidden, tokens, temperature):
  logits = transformer.logits_from_hidden(graphdef, params, hidden) / temperature
  return (logprobs_lib.token_logprobs(logits, tokens),
          logprobs_lib.token_entropy(jax.lax.stop_gradient(logits)))


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 7, 8])
@pytest.mark.parametrize("tie", [True, False])
def test_chunked_head_equals_the_full_logits_in_values_and_gradients(chunk_size, tie):
  """T = 7 positions in chunks of c (remainders padded): log-probs, entropies and the gradients
  of a loss on the log-probs, w.r.t. the parameters and the hidden states, as with full logits."""
  graphdef, params = _tiny(tie_embeddings=tie)
  rng = np.random.default_rng(0)
  b, t = 3, 7
  hidden = jnp.asarray(rng.normal(size=(b, t, 32)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, 16, (b, t)), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)

  def loss(fn, prm, h):
    logp, entropy = fn(prm, h)
    return jnp.sum(weights * logp), (logp, entropy)

  chunked = lambda prm, h: forward.head_logprobs(graphdef, prm, h, tokens, temperature=0.7,
                                                 chunk_size=chunk_size)
  full = lambda prm, h: _full_head(graphdef, prm, h, tokens, 0.7)
  grad = lambda fn: jax.grad(lambda prm, h: loss(fn, prm, h), argnums=(0, 1), has_aux=True)(
      params, hidden)
  (g_params, g_hidden), (logp, entropy) = grad(chunked)
  (e_params, e_hidden), (e_logp, e_entropy) = grad(full)
  np.testing.assert_allclose(logp, e_logp, atol=1e-5)
  np.testing.assert_allclose(entropy, e_entropy, atol=1e-5)
  np.testing.assert_allclose(g_hidden, e_hidden, atol=1e-5)
  for a, e in zip(jax.tree.leaves(g_params), jax.tree.leaves(e_params)):
    np.testing.assert_allclose(a, e, atol=1e-5)


def test_chunked_head_keeps_no_full_logits_in_the_backward_pass():
  """With chunks of 4 positions of 64, no [B, T, V] float32 array is live in the compiled
  gradient program: its temporaries stay below the full logits' size (V = 4096)."""
  graphdef, params = _tiny(vocab_size=4096)
  b, t = 4, 64
  hidden = jnp.zeros((b, t, 32), jnp.float32)
  tokens = jnp.zeros((b, t), jnp.int32)
  full_bytes = b * t * 4096 * 4

  def temp_bytes(chunk_size):
    fn = jax.grad(lambda prm: jnp.sum(forward.head_logprobs(
        graphdef, prm, hidden, tokens, chunk_size=chunk_size)[0]))
    return jax.jit(fn).lower(params).compile().memory_analysis().temp_size_in_bytes

  chunk_bytes = full_bytes // 16                 # one chunk's logits: 4 of 64 positions
  assert temp_bytes(None) >= full_bytes          # the unchunked program holds the logits
  # A few chunk-sized arrays (logits, probabilities, their gradient) and the head's gradient
  # accumulator: far below one full [B, T, V] array.
  assert temp_bytes(4) < 6 * chunk_bytes


def test_chunked_head_rejects_a_bad_chunk_size():
  graphdef, params = _tiny()
  with pytest.raises(ValueError, match="chunk_size"):
    forward.head_logprobs(graphdef, params, jnp.zeros((1, 4, 32)), jnp.zeros((1, 4), jnp.int32),
                          chunk_size=0)


@pytest.mark.parametrize("num_blocks", [1, 2, 3, 6])
def test_row_blocks_take_whole_groups_and_restore_row_order(num_blocks):
  group, groups = 2, 6
  rows = np.arange(group * groups)
  x = {"a": jnp.asarray(rows), "b": jnp.asarray(np.stack([rows, -rows], 1))}
  blocks = forward.split_row_blocks(x, group=group, num_blocks=num_blocks)
  assert blocks["a"].shape == (num_blocks, group * groups // num_blocks)
  for block in np.asarray(blocks["a"]):   # whole groups: rows 2k and 2k + 1 together
    pairs = block.reshape(-1, group)
    np.testing.assert_array_equal(pairs[:, 1], pairs[:, 0] + 1)
    np.testing.assert_array_equal(pairs[:, 0] % group, 0)
  back = forward.merge_row_blocks(blocks, group=group)
  np.testing.assert_array_equal(back["a"], x["a"])
  np.testing.assert_array_equal(back["b"], x["b"])
  doubled = forward.in_row_blocks(lambda t: jax.tree.map(lambda v: 2 * v, t), x, group=group,
                                  num_blocks=num_blocks)
  np.testing.assert_array_equal(doubled["b"], 2 * x["b"])
  with pytest.raises(ValueError, match="blocks"):
    forward.split_row_blocks(x, group=group, num_blocks=4)


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
