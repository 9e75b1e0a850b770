"""Cache-based inference: a prompt batch into a KV cache (`prefill`), then one token at a time.

Pure functions of (graphdef, params, arrays), like the functional API of `transformer`, and
jit-friendly (`cache_length` static):

  logits, cache = prefill(graphdef, params, tokens, mask, cache_length)     # f32[B, V], KVCache
  logits, cache = decode_step(graphdef, params, tokens, positions, key_mask, cache, cache_index)
  logits, cache = decode_slots(graphdef, params, tokens, positions, prompt_mask, cache, index)

`prefill` writes the left-padded prompts into slots 0 .. Tp-1 of a fresh `kv_cache.KVCache`;
`decode_step` writes one token per row into slot `cache_index` (the same for every row);
`decode_slots` runs one token per decode slot through a `prefix_cache.PrefixCache`, which stores
each prompt's keys and values once for the slots that continue it (the continuous engine's
cache). Each returns the logits of the next token and the updated cache; the sampling loops
around them are in `sampling/`.
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl_curriculum.model import kv_cache
from rl_curriculum.model import paged_cache
from rl_curriculum.model import prefix_cache
from rl_curriculum.model import rope
from rl_curriculum.model.transformer import Params
from rl_curriculum.model.transformer import merge_params


def prefill(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, mask: jax.Array,
            cache_length: int, *, constrain: Optional[Callable[[Any, int], Any]] = None
            ) -> Tuple[jax.Array, kv_cache.KVCache]:
  """Runs a left-padded prompt batch into a fresh cache.

  Args:
    tokens: i32[B, Tp] prompts, left-padded; mask: bool[B, Tp] True on real tokens (every row
      needs at least one).
    cache_length: S >= Tp, total slots (prompt plus tokens to generate); static.
    constrain: see `Transformer.hidden`.

  Returns:
    (f32[B, V] logits of the token after each prompt, KVCache with slots 0..Tp-1 written).
  """
  model = merge_params(graphdef, params)
  b, tp = tokens.shape
  if cache_length < tp:
    raise ValueError(f"cache_length {cache_length} is shorter than the prompt ({tp}).")
  mask = mask.astype(bool)
  cache = kv_cache.init_cache(model.config, b, cache_length)
  key_mask = kv_cache.cache_key_mask(mask, cache_length)
  hidden, cache = model.hidden(tokens, rope.positions_from_mask(mask), key_mask, cache, 0,
                               constrain=constrain)
  return model.logits(hidden[:, -1, :]), cache


def decode_step(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array,
                positions: jax.Array, key_mask: jax.Array, cache: kv_cache.KVCache,
                cache_index: jax.Array, *, constrain: Optional[Callable[[Any, int], Any]] = None
                ) -> Tuple[jax.Array, kv_cache.KVCache]:
  """One token per row through the cache.

  Args:
    tokens: i32[B] the newest token of each row; positions: i32[B] its rotary position.
    key_mask: bool[B, S] from `kv_cache.cache_key_mask`; cache: KVCache of S slots.
    cache_index: i32[] the slot this token is written to (same for every row).
    constrain: see `Transformer.hidden`.

  Returns:
    (f32[B, V] logits of the following token, updated KVCache).
  """
  model = merge_params(graphdef, params)
  hidden, cache = model.hidden(tokens[:, None], positions[:, None], key_mask, cache, cache_index,
                               constrain=constrain)
  return model.logits(hidden[:, 0, :]), cache


def decode_slots(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array,
                 positions: jax.Array, prompt_mask: jax.Array, cache: prefix_cache.PrefixCache,
                 index: prefix_cache.SlotIndex, *,
                 constrain: Optional[Callable[[Any, int], Any]] = None
                 ) -> Tuple[jax.Array, prefix_cache.PrefixCache]:
  """One token per decode slot through a `prefix_cache.PrefixCache`: each slot reads its row's
  prompt's keys and values (shared by the prompt's rows) and its own completion slots.

  Args:
    tokens: i32[B] the newest token of each slot; positions: i32[B] its rotary position.
    prompt_mask: bool[P, Tp] real tokens of the cache's prompts.
    cache: the PrefixCache (P prompts, B slots of N completion slots).
    index: the prompt each slot continues and the completion slot its token is written to.
    constrain: see `Transformer.hidden`.

  Returns:
    (f32[B, V] logits of each slot's next token, the cache with the new slots written). Equal,
    for each slot and to float rounding, to `decode_step` on a `KVCache` row holding the prompt
    and the same completion slots.
  """
  model = merge_params(graphdef, params)
  key_mask = prefix_cache.key_mask(prompt_mask, index, prefix_cache.completion_length(cache))
  hidden, cache = model.hidden(tokens[:, None], positions[:, None], key_mask, cache, index,
                               constrain=constrain)
  return model.logits(hidden[:, 0, :]), cache


def decode_pages(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array,
                 positions: jax.Array, pool: jax.Array, index: paged_cache.PageIndex, *,
                 constrain: Optional[Callable[[Any, int], Any]] = None
                 ) -> Tuple[jax.Array, jax.Array]:
  """One token per decode slot through a paged cache: each slot's token written at its
  `index.length - 1`-th token and attending over its pages (`paged_cache.attend`).

  Args:
    tokens: i32[B] the newest token of each slot; positions: i32[B] its rotary position.
    pool: every layer's pages (`paged_cache.init_pool`).
    index: each slot's page table and length (`paged_cache.PageIndex`).
    constrain: see `Transformer.hidden`.

  Returns:
    (f32[B, V] logits of each slot's next token, the pool with the new tokens written). Equal,
    for each slot and to float rounding, to `decode_slots` over the same prompt and completion.
  """
  model = merge_params(graphdef, params)
  hidden, pool = model.hidden(tokens[:, None], positions[:, None], None, pool, index,
                              constrain=constrain)
  return model.logits(hidden[:, 0, :]), pool
