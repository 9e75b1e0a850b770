"""A decode cache that stores each prompt's keys and values once and each row's completion apart.

The rows of an RL rollout come in groups of G completions of one prompt. `kv_cache.KVCache`
holds every row's prompt slots, G copies per prompt; a `PrefixCache` holds

  prompt_k, prompt_v   the P prompts' keys and values, Tp slots each (written by a prefill)
  k, v                 the completions' keys and values, N slots for each of the B decode slots

and a decode step of slot b, continuing a row of prompt `index.prompt[b]` at completion slot
`index.step[b]`, attends over that prompt's Tp slots followed by its own N completion slots
(`attend`), the attention a `KVCache` row of Tp + N slots gives (to float rounding), at 1/G of
its prompt memory. Each slot has its own completion slot, so rows of different lengths
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


def with_new(completion: jax.Array, new: jax.Array, index: SlotIndex, select: bool) -> jax.Array:
  """One layer's completion keys (or values) [B, N, ...] with each decode slot's new token
  `new` [B, 1, ...] at its own slot `index.step`.

  By a scatter of B slices (`write`), in place of the donated cache since the attention then
  reads only the written buffer (unrolled layout); or, with `select` (a scanned layer, whose
  cache is a slice of the stacked one, written after the scan), by a select that fuses into the
  attention reading it, so the layer's slots are not copied.
  """
  if select:
    slot = jnp.arange(completion.shape[1], dtype=jnp.int32)[None, :] == index.step[:, None]
    return jnp.where(slot[:, :, None, None], new.astype(completion.dtype), completion)
  return write(completion, new, index.step, 0)


def write(completion: jax.Array, new: jax.Array, step: jax.Array, rows_axis: int) -> jax.Array:
  """Completion keys (or values) [..., B, N, ...] (rows on `rows_axis`) with new [..., B, 1,
  ...] written at each row's slot step i32[B]: a scatter, in place under donation."""
  rows = jnp.arange(completion.shape[rows_axis], dtype=jnp.int32)
  where = (slice(None),) * rows_axis + (rows, step)
  update = new[(slice(None),) * (rows_axis + 1) + (0,)].astype(completion.dtype)
  out = kv_cache.as_bits(completion).at[where].set(kv_cache.as_bits(update),
                                                   mode="promise_in_bounds")
  return kv_cache.from_bits(out, completion.dtype)


def attend(q: jax.Array, prompt: Tuple[jax.Array, jax.Array], completion: Tuple[jax.Array, jax.Array],
           index: SlotIndex, mask: jax.Array, dtype) -> jax.Array:
  """One query per decode slot over its prompt's slots then its own completion slots.

  q [B, Hkv, G, d]; prompt (keys, values) [P, Tp, Hkv, d]; completion (keys, values) [B, N,
  Hkv, d] with the new token written (`with_new`); mask bool[B, Tp + N] (`key_mask`) -> [B, Hkv,
  G, d]. The numbers of `kv_cache.one_query_attention` over the concatenated Tp + N slots (in
  float32 the same products summed in the same order), without building the concatenated keys
  and values: the prompt part is read through the gather, so a step reads each prompt slot once
  and copies no cache.
  """
  pk, pv = gather(prompt[0], index.prompt), gather(prompt[1], index.prompt)
  ck, cv = completion
  scale = q.shape[-1] ** -0.5
  if ck.dtype == jnp.float32:
    score = lambda keys: jnp.sum(q[:, None].astype(jnp.float32) * keys[:, :, :, None, :], axis=-1)
  else:
    score = lambda keys: jnp.einsum("bkgd,bskd->bskg", q.astype(keys.dtype), keys,
                                    preferred_element_type=jnp.float32)
  scores = jnp.concatenate([score(pk), score(ck)], axis=1) * scale          # [B, S, Hkv, G]
  scores = jnp.where(mask[:, :, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=1).astype(dtype)
  tp = pk.shape[1]
  if cv.dtype == jnp.float32:
    part = lambda p, values: p[..., None] * values[:, :, :, None, :].astype(dtype)
    return jnp.sum(jnp.concatenate([part(probs[:, :tp], pv), part(probs[:, tp:], cv)], axis=1),
                   axis=1)
  part = lambda p, values: jnp.einsum("bskg,bskd->bkgd", p.astype(values.dtype), values,
                                      preferred_element_type=jnp.float32)
  return (part(probs[:, :tp], pv) + part(probs[:, tp:], cv)).astype(dtype)


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
