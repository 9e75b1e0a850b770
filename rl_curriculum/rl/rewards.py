"""Reward shaping of sampled completions: where a scalar reward sits in the tokens, DAPO's length
penalty, the KL penalty in the reward, and which completions a limit cut off.

Pure functions of arrays, safe under `jax.jit`. A row is a completion or an episode's turns with
observations between them (mask 0 there; `credit` reads the turns). Shape legend (see
`rl_curriculum.types`): B rows, T positions.
"""

from typing import Sequence

import jax
import jax.numpy as jnp

from rl_curriculum.rl import credit

__all__ = ["outcome_token_rewards", "overlong_penalty", "kl_penalty", "truncated_completions"]


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """f32[B, T]: each row's scalar reward f32[B] on its last drawn token (the last position with
  mask f32[B, T] > 0: an episode's last turn's, wherever observations lie before it), 0
  elsewhere; a row without a drawn token gets nothing."""
  on_last = jnp.arange(mask.shape[1])[None, :] == credit.last_drawn(mask)[:, None]
  return jnp.where(on_last & (mask > 0), rewards[:, None], 0.0)


def overlong_penalty(lengths: jax.Array, max_tokens: int, cache: int) -> jax.Array:
  """DAPO's soft overlong punishment R_len of completions of `lengths` tokens (any shape, f32 of
  the same shape) under a length cap L_max = `max_tokens` and a cache of L_cache = `cache` tokens:

    R_len(y) = 0                                     if |y| <= L_max - L_cache
               ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
               -1                                    if L_max < |y|

  so a completion that reaches the cap loses 1. The penalty depends on the length alone: a
  completion that ends with a stop token inside the cache is punished too.

  Reference: Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv:2503.14476.
  """
  start = max_tokens - cache
  lengths = jnp.asarray(lengths, jnp.float32)
  return jnp.where(lengths <= start, 0.0, jnp.maximum((start - lengths) / cache, -1.0))


def kl_penalty(logp_old: jax.Array, logp_ref: jax.Array, mask: jax.Array, *,
               per_token: bool = False) -> jax.Array:
  """The k1 estimate of KL(pi_old || ref) on the sampled tokens, k1 = logp_old - logp_ref (nats;
  unbiased, the tokens come from pi_old): f32[B, T] per counted token (0 elsewhere) with
  `per_token`, else its sum over each completion f32[B]. As a reward rather than a loss term, k1
  is the usual choice: its gradient is not taken.

  Reference: Ouyang et al. (2022), "Training language models to follow instructions with human
  feedback", arXiv:2203.02155 (the KL penalty in PPO's reward).
  """
  k1 = jnp.where(mask > 0, logp_old - logp_ref, 0.0)
  return k1 if per_token else jnp.sum(k1, axis=1)


def truncated_completions(tokens: jax.Array, mask: jax.Array, stop_ids: Sequence[int]) -> jax.Array:
  """bool[B]: which rows i32[B, T] (drawn tokens: mask f32[B, T] > 0) a token limit cut off:
  those whose last drawn token is none of `stop_ids` (the sampler keeps and counts a stop token,
  so a row that ends with one finished; one that ends without was stopped by the length cap T or
  by its own turn's token limit). A row with no drawn token is not truncated. An episode cut by
  its turn limit is truncated too; only the host knows that (`Batch.truncated`)."""
  stop = jnp.asarray(tuple(stop_ids), jnp.int32)
  last = jnp.take_along_axis(tokens, credit.last_drawn(mask)[:, None], axis=1)
  ended = jnp.any(last == stop[None, :], axis=1)
  return jnp.any(mask > 0, axis=1) & ~ended
