"""Token-selection strategies: small pure functions of next-token logits f32[B, V].

Filters return logits with the excluded tokens set to -inf, so they compose (temperature, then
top-k, then top-p, the order HF transformers uses) and feed `jax.random.categorical` directly.
"""

import jax
import jax.numpy as jnp


def argmax(logits: jax.Array) -> jax.Array:
  """i32[B] greedy tokens: argmax_v logits[b, v] (the lowest index among ties)."""
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def apply_temperature(logits: jax.Array, temperature) -> jax.Array:
  """logits / temperature; temperature is a positive scalar (Python or traced f32[])."""
  return logits / jnp.asarray(temperature, logits.dtype)


def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
  """Keeps the k largest logits of each row (and any tied with the k-th), others -> -inf.

  Args:
    logits: f32[B, V].
    k: static int; k <= 0 or k >= V leaves the logits unchanged.
  """
  if k <= 0 or k >= logits.shape[-1]:
    return logits
  kth = jax.lax.top_k(logits, k)[0][:, -1:]
  return jnp.where(logits >= kth, logits, -jnp.inf)


def top_p_filter(logits: jax.Array, p) -> jax.Array:
  """Nucleus filter (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration").

  Keeps the smallest set of most probable tokens whose total probability reaches p: sorting
  pi = softmax(logits) in decreasing order, token j of the sorted row stays iff
  sum_{i < j} pi_(i) < p (so the most probable token always stays); ties with the last kept logit
  stay too. p >= 1 returns the logits unchanged, exactly.

  Args:
    logits: f32[B, V]; p: scalar in (0, 1] (Python or traced f32[]).
  """
  sorted_logits = -jnp.sort(-logits, axis=-1)
  sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
  keep = mass_before < p
  num_kept = jnp.maximum(jnp.sum(keep, axis=-1, keepdims=True), 1)
  threshold = jnp.take_along_axis(sorted_logits, num_kept - 1, axis=-1)
  filtered = jnp.where(logits >= threshold, logits, -jnp.inf)
  return jnp.where(jnp.asarray(p) >= 1.0, logits, filtered)


def sample_token(logits: jax.Array, key: jax.Array, *, temperature=1.0, top_k: int = 0,
                 top_p: float = 1.0, greedy: bool = False) -> jax.Array:
  """i32[B] next tokens drawn from logits f32[B, V].

  `greedy` (static) takes the argmax and ignores the other settings and `key`. Otherwise:
  temperature, then top-k (static k, 0 = off), then top-p (static p; p >= 1 skips the sort
  entirely), then a categorical draw with `key`.
  """
  if greedy:
    return argmax(logits)
  logits = apply_temperature(logits, temperature)
  logits = top_k_filter(logits, top_k)
  if top_p < 1.0:
    logits = top_p_filter(logits, top_p)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def row_keys(key: jax.Array, rows: jax.Array, steps: jax.Array) -> jax.Array:
  """One PRNG key per row and token: fold_in(fold_in(key, row), step) for rows i32[B] and steps
  i32[B] (or a scalar step). The draw of a row's t-th token depends on nothing but the call's
  key, the row's index and t, so it is the same whichever decode slot or batch the row runs in."""
  steps = jnp.broadcast_to(steps, rows.shape)
  return jax.vmap(lambda r, t: jax.random.fold_in(jax.random.fold_in(key, r), t))(rows, steps)


def inverse_cdf_draw(logits: jax.Array, keys: jax.Array) -> jax.Array:
  """i32[B] tokens drawn from softmax(logits) f32[B, V], row b with one uniform u_b of keys[b]:
  the first token whose cumulative probability exceeds u_b times the row's total. Exact
  categorical sampling (up to the float32 rounding of the cumulative sum) with one random number
  per row instead of V Gumbel draws: at V = 49152 and 64 rows, 18 ms instead of 80 ms on 2 CPU
  cores. Tokens of probability 0 (a filter's -inf) are never drawn."""
  cdf = jnp.cumsum(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), axis=-1)
  u = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys) * cdf[:, -1]
  token = jnp.sum(cdf <= u[:, None], axis=-1, dtype=jnp.int32)
  return jnp.minimum(token, logits.shape[-1] - 1)


def draw_tokens(logits: jax.Array, keys: jax.Array, *, temperature=1.0, top_k: int = 0,
                top_p: float = 1.0, greedy: bool = False):
  """(i32[B] tokens, f32[B] their log-probs) from logits f32[B, V], row b drawn with keys[b]:
  the argmax when greedy, else temperature, top-k and top-p (as `sample_token`) then
  `inverse_cdf_draw`. The log-prob is log_softmax(logits / temperature)[token], before top-k
  and top-p (of the raw logits when greedy)."""
  if greedy:
    token = argmax(logits)
    scaled = logits
  else:
    scaled = apply_temperature(logits, temperature)
    filtered = top_k_filter(scaled, top_k)
    if top_p < 1.0:
      filtered = top_p_filter(filtered, top_p)
    token = inverse_cdf_draw(filtered, keys)
  scaled = scaled.astype(jnp.float32)
  chosen = jnp.take_along_axis(scaled, token[:, None], axis=-1)[:, 0]
  return token, chosen - jax.nn.logsumexp(scaled, axis=-1)
