"""A decode cache that stores each prompt's keys and values once and each row's completion apart.

The rows of an RL rollout come in groups of G completions of one prompt. `kv_cache.KVCache`
holds every row's prompt slots, G copies per prompt; a `PrefixCache` holds

  prompt_k, prompt_v   the P prompts' keys and values, Tp slots each (written by a prefill)
  k, v                 the completions' keys and values, N slots for each of the B decode slots

and a decode step of slot b, continuing a row of prompt `index.prompt[b]` at completion slot
`index.step[b]`, attends over that prompt's Tp slots followed by its own N completion slots, in
the order of a `KVCache` of Tp + N slots (`keys_of`): the same numbers as the repeated cache, at
1/G of its prompt memory. Each slot has its own completion slot, so rows of different lengths
share one decode batch (continuous batching, `sampling.continuous`).

Layouts follow the model's, as in `kv_cache`: tuples of L arrays (unrolled), or one array with a
leading layer axis [L, ...] each (scanned). Shapes: P prompts, Tp prompt slots, B decode slots, N
completion slots, Hkv key/value heads, d = head_dim.
"""

from typing import NamedTuple, Tuple, Union

import jax
import jax.numpy as jnp

from rl_curriculum.model import kv_cache
from rl_curriculum.model.config import ModelConfig

Arrays = Union[Tuple[jax.Array, ...], jax.Array]


class PrefixCache(NamedTuple):
  """Prompt keys/values once per prompt ([P, Tp, Hkv, d] per layer) and completion keys/values
  once per decode slot ([B, N, Hkv, d] per layer); see the module docstring."""
  prompt_k: Arrays
  prompt_v: Arrays
  k: Arrays
  v: Arrays


class SlotIndex(NamedTuple):
  """Where each decode slot's token goes: the prompt its row continues and the completion slot
  it is written to (i32[B]). `prompt` is i32[D, B/D]: the B slots and P prompts split into D
  equal shards (D = 1 without a mesh), slot b of shard d reading prompt `prompt[d, b]` of its
  own shard's P/D, so that under a mesh a gather never crosses devices."""
  prompt: jax.Array
  step: jax.Array


def init_completions(config: ModelConfig, slots: int, length: int) -> Tuple[Arrays, Arrays]:
  """All-zero completion keys and values for `slots` decode slots of `length` tokens each, in the
  model's layout (`kv_cache.init_cache`)."""
  cache = kv_cache.init_cache(config, slots, length)
  return cache.k, cache.v


def completion_length(cache: PrefixCache) -> int:
  """N, the completion slots of each decode slot."""
  return cache.k[0].shape[1] if isinstance(cache.k, (tuple, list)) else cache.k.shape[2]


def from_prompts(prompts: kv_cache.KVCache, completions: Tuple[Arrays, Arrays]) -> PrefixCache:
  """A PrefixCache of a prefilled prompt cache (its slots are the prompts' Tp) and completion
  keys and values from `init_completions`."""
  return PrefixCache(prompt_k=prompts.k, prompt_v=prompts.v, k=completions[0], v=completions[1])


def keys_of(prompt: jax.Array, completion: jax.Array, new: jax.Array,
            index: SlotIndex) -> jax.Array:
  """One layer's keys (or values) as each decode slot reads them: [B, Tp + N, Hkv, d], the
  slot's prompt's Tp slots (`prompt` [P, Tp, ...]) then its N completion slots (`completion`
  [B, N, ...]) with the new token `new` [B, 1, ...] at `index.step`. A gather, a select and a
  concatenation, which XLA fuses into the attention that reads them."""
  slot = jnp.arange(completion.shape[1], dtype=jnp.int32)[None, :] == index.step[:, None]
  completion = jnp.where(slot[:, :, None, None], new.astype(completion.dtype), completion)
  return jnp.concatenate([gather(prompt, index.prompt), completion], axis=1)


def key_mask(prompt_mask: jax.Array, index: SlotIndex, length: int) -> jax.Array:
  """bool[B, Tp + N]: the slot's prompt's real tokens, and its completion slots up to and
  including `index.step` (the causal limit of its query), as `attention.causal_slot_mask` gives
  a `KVCache` row of the same slots."""
  done = jnp.arange(length, dtype=jnp.int32)[None, :] <= index.step[:, None]
  return jnp.concatenate([gather(prompt_mask.astype(bool), index.prompt), done], axis=1)


def gather(table: jax.Array, local: jax.Array) -> jax.Array:
  """table [P, ...] read at i32[D, B/D] shard-local indices -> [B, ...] (`SlotIndex.prompt`)."""
  d = local.shape[0]
  out = jax.vmap(lambda t, i: jnp.take(t, i, axis=0))(table.reshape((d, -1) + table.shape[1:]),
                                                      local)
  return out.reshape((-1,) + out.shape[2:])


def write(completion: jax.Array, new: jax.Array, step: jax.Array, rows_axis: int) -> jax.Array:
  """Completion keys (or values) with each decode slot's new token written at its own slot:
  `completion` [..., B, N, ...] (rows on `rows_axis`), new [..., B, 1, ...], step i32[B]. A
  scatter of B slices, in place when the caller donates the cache."""
  bits = kv_cache.as_bits(completion)
  update = kv_cache.as_bits(new.astype(completion.dtype))

  def one(c, u, s):
    return jax.lax.dynamic_update_slice_in_dim(c, u, s, axis=rows_axis)  # rows axis removed

  out = jax.vmap(one, in_axes=(rows_axis, rows_axis, 0), out_axes=rows_axis)(bits, update, step)
  return kv_cache.from_bits(out, completion.dtype)
