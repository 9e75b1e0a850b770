"""Forward passes over scored completions: hidden states, log-probs, values, prompt features.

The learn step, SFT and the PCL curriculum all run the policy over prompt ++ completion rows; the
helpers here are that one forward pass and what is read off it. Rows are prompt-major: with
`group` = G > 1, row b = p * G + g holds completion g of prompt p, and the G rows of a prompt share
its prompt (run once per group).

Sampling temperature. The rollouts draw tokens from softmax(logits / tau); the log-probs that the
losses compare (old policy, policy being trained, reference) are those of that same distribution,
so every log-prob helper takes the temperature and divides the logits by it before normalising
(as TRL and verl do). tau = 1 leaves the logits unchanged.

Shape legend: B rows, Tp prompt tokens, T completion tokens, V vocabulary, D model width, N pool.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.model import transformer
from rl_curriculum.parallel import distributed
from rl_curriculum.rl import logprobs as logprobs_lib

__all__ = [
    "model_params",
    "completion_hidden",
    "completion_logits",
    "completion_logprobs",
    "scaled_logits",
    "values_from_hidden",
    "prompt_features",
]


def model_params(trainable: Any, frozen: Any) -> Any:
  """The argument `transformer.forward` takes: the trainable state alone, or (trainable, frozen)."""
  return trainable if frozen is None else (trainable, frozen)


def completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens,
                      group: int = 1) -> jax.Array:
  """Final hidden states [B, T, D] at the positions that predict each completion token.

  The sequence is prompt ++ completion; position Tp - 1 + t predicts completion token t. Tokens
  after a row's stop are padding but only ever attend backwards, so they change nothing that
  counts. With `group` > 1 the rows come in runs of `group` completions of one prompt (a rollout
  group; each run's prompt rows are equal and the first is used): the prompt runs once per group
  (`transformer.shared_prefix_hidden`), with the same result up to float rounding.

  Args:
    graphdef, params: the policy (`params` as `model_params` builds it).
    prompt_tokens: i32[B, Tp] left-padded prompts; prompt_mask: bool[B, Tp].
    tokens: i32[B, T] completion tokens.
    group: static; rows per prompt run (1: every row runs its own prompt).

  Returns:
    [B, T, D] hidden states in the model's activation dtype.
  """
  tp, t = prompt_tokens.shape[1], tokens.shape[1]
  if group > 1:
    first = lambda x: x.reshape((-1, group) + x.shape[1:])[:, 0]
    prompt_hidden, hidden = transformer.shared_prefix_hidden(
        graphdef, params, first(prompt_tokens), first(prompt_mask), tokens)
    last = jnp.repeat(prompt_hidden[:, -1:], group, axis=0)
    return jnp.concatenate([last, hidden[:, :t - 1]], axis=1)
  seq = jnp.concatenate([prompt_tokens, tokens], axis=1)
  seq_mask = jnp.concatenate([prompt_mask.astype(bool), jnp.ones(tokens.shape, bool)], axis=1)
  hidden = transformer.forward_hidden(graphdef, params, seq, seq_mask)
  return hidden[:, tp - 1:tp - 1 + t]


def scaled_logits(graphdef, params, hidden: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Logits [B, T, V] of hidden states [B, T, D], divided by the sampling temperature (static
  Python float > 0; 1 leaves them unchanged)."""
  logits = transformer.logits_from_hidden(graphdef, params, hidden)
  if temperature != 1.0:
    logits = logits / jnp.asarray(temperature, logits.dtype)
  return logits


def completion_logits(graphdef, params, prompt_tokens, prompt_mask, tokens, group: int = 1,
                      temperature: float = 1.0) -> jax.Array:
  """Logits [B, T, V] predicting each completion token, divided by `temperature` (see
  `completion_hidden` for `group`)."""
  hidden = completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens, group)
  return scaled_logits(graphdef, params, hidden, temperature)


def completion_logprobs(graphdef, params, prompt_tokens, prompt_mask, tokens, group: int = 1,
                        temperature: float = 1.0) -> jax.Array:
  """f32[B, T] log-probs of the completion tokens under softmax(logits / temperature)."""
  logits = completion_logits(graphdef, params, prompt_tokens, prompt_mask, tokens, group,
                             temperature)
  return logprobs_lib.token_logprobs(logits, tokens)


def values_from_hidden(value: dict, hidden: jax.Array) -> jax.Array:
  """f32[B, T] estimates of the value head {"w": f32[D], "b": f32[]} on hidden states [B, T, D]."""
  return jnp.einsum("btd,d->bt", hidden.astype(jnp.float32), value["w"]) + value["b"]


def _mean_pooled(graphdef, params, tokens, mask):
  hidden = transformer.forward_hidden(graphdef, params, tokens, mask)
  m = mask.astype(jnp.float32)[..., None]
  return (hidden.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1.0)


_mean_pooled_jit = jax.jit(_mean_pooled, static_argnums=(0,))


def prompt_features(graphdef, params, tokens: np.ndarray, mask: np.ndarray, *,
                    batch_size: int) -> np.ndarray:
  """f32[N, D] mean-pooled final hidden states of N prompts, `batch_size` prompts at a time.

  The features a prompt-level value model (PCL) reads. Memory is that of one batch: the last
  batch is padded to full size (one compiled program) and the padding rows dropped.

  Args:
    graphdef, params: the policy.
    tokens: i32[N, Tp] left-padded prompts; mask: bool[N, Tp], at least one True per row.
    batch_size: prompts per forward pass (>= 1).

  Returns:
    f32[N, D] host array.

  Raises:
    ValueError: batch_size < 1.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
  n = tokens.shape[0]
  size = min(batch_size, n)
  out = []
  for start in range(0, n, size):
    tok, msk = tokens[start:start + size], mask[start:start + size]
    short = size - tok.shape[0]
    if short:
      tok = np.concatenate([tok, np.repeat(tok[-1:], short, axis=0)])
      msk = np.concatenate([msk, np.repeat(msk[-1:], short, axis=0)])
    feats = distributed.to_host(_mean_pooled_jit(graphdef, params, jnp.asarray(tok),
                                                 jnp.asarray(msk)))
    out.append(feats[:size - short])
  return np.concatenate(out).astype(np.float32)
