"""Per-token log-probabilities and entropies from logits, in float32 whatever the logits' dtype.

The vocabulary of a language model makes `logits` the largest activation of an RL step: B * T * V
values. Converting all of them to float32 at once doubles (bfloat16) that memory. With
`chunk_size=c` both functions walk the time axis in chunks of c tokens under `lax.scan`, converting
and normalising one [B, c, V] block at a time; the backward pass recomputes each block
(`jax.checkpoint`), so neither direction holds a float32 copy of all B * T * V logits (the
gradient with respect to the logits has the logits' own dtype). Chunked and unchunked results agree
to float32 rounding, and gradients flow through both.

Shape legend: B rows, T tokens, V vocabulary.
"""

from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp

__all__ = ["token_logprobs", "token_entropy"]


def _log_softmax(logits: jax.Array) -> jax.Array:
  x = logits.astype(jnp.float32)
  return x - jax.nn.logsumexp(x, axis=-1, keepdims=True)


def _logprobs_block(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  logp = _log_softmax(logits)
  return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _entropy_block(logits: jax.Array) -> jax.Array:
  logp = _log_softmax(logits)
  # Logits of -inf (masked vocabulary entries) have p = 0 and contribute 0, not 0 * -inf.
  safe_logp = jnp.where(jnp.isfinite(logp), logp, 0.0)
  return -jnp.sum(jnp.exp(logp) * safe_logp, axis=-1)


def _chunked(
    block_fn: Callable[..., jax.Array],
    logits: jax.Array,
    extra: tuple[jax.Array, ...],
    chunk_size: Optional[int],
) -> jax.Array:
  """Applies `block_fn(logits[:, t0:t1], *[e[:, t0:t1] for e in extra]) -> [B, t1 - t0]` over T.

  Full chunks run under `lax.scan` with a rematerialised body; a remainder shorter than
  `chunk_size` is handled by one static slice after the scan.
  """
  b, t = logits.shape[:2]
  if chunk_size is None or chunk_size >= t:
    return block_fn(logits, *extra)
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size}")
  num_full = t // chunk_size
  main = num_full * chunk_size

  @jax.checkpoint
  def one_chunk(start):
    blk = jax.lax.dynamic_slice_in_dim(logits, start, chunk_size, axis=1)
    ex = [jax.lax.dynamic_slice_in_dim(e, start, chunk_size, axis=1) for e in extra]
    return block_fn(blk, *ex)

  def body(carry, start):
    return carry, one_chunk(start)

  starts = jnp.arange(num_full, dtype=jnp.int32) * chunk_size
  _, out = jax.lax.scan(body, None, starts)  # [num_full, B, chunk_size]
  out = jnp.moveaxis(out, 0, 1).reshape(b, main)
  if main == t:
    return out
  rest = block_fn(logits[:, main:], *[e[:, main:] for e in extra])
  return jnp.concatenate([out, rest], axis=1)


def token_logprobs(
    logits: jax.Array, tokens: jax.Array, *, chunk_size: Optional[int] = None
) -> jax.Array:
  """Log-probability of each token under the categorical distribution of its logits.

  logp[b, t] = logits[b, t, y] - logsumexp_v logits[b, t, v],   y = tokens[b, t],

  computed in float32. `logits[b, t]` must be the prediction for `tokens[b, t]` (the caller shifts
  the model output by one position).

  Args:
    logits: float[B, T, V] unnormalised log-probabilities (any floating dtype; -inf allowed for
      masked vocabulary entries).
    tokens: int[B, T] token ids in [0, V).
    chunk_size: process T in chunks of this many tokens (static); None processes all at once.

  Returns:
    f32[B, T] log-probabilities in nats (<= 0).

  Raises:
    ValueError: chunk_size < 1.
  """
  chex.assert_rank(logits, 3)
  chex.assert_rank(tokens, 2)
  chex.assert_type(logits, float)
  chex.assert_type(tokens, int)
  chex.assert_equal(logits.shape[:2], tokens.shape)
  return _chunked(_logprobs_block, logits, (tokens,), chunk_size)


def token_entropy(logits: jax.Array, *, chunk_size: Optional[int] = None) -> jax.Array:
  """Entropy of the full-vocabulary distribution at each position.

  H[b, t] = -sum_v p[b, t, v] log p[b, t, v],   p = softmax(logits[b, t]),

  computed in float32.

  Args:
    logits: float[B, T, V] unnormalised log-probabilities (any floating dtype; -inf allowed).
    chunk_size: process T in chunks of this many tokens (static); None processes all at once.

  Returns:
    f32[B, T] entropies in nats, in [0, log V].

  Raises:
    ValueError: chunk_size < 1.
  """
  chex.assert_rank(logits, 3)
  chex.assert_type(logits, float)
  return _chunked(_entropy_block, logits, (), chunk_size)
