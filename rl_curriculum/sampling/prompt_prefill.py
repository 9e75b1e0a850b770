"""The prompts' keys and values, computed once per prompt and in chunks: what both engines decode
from.

  logits, cache, mask = prefill_prompts(graphdef, params, prompts, mask, chunk=C)

With `chunk` C < Tp the prompts run C positions at a time (`lax.fori_loop`, the cache carried and
written in place), so the activations of a prefill are those of C positions (the attention's
scores [P, H, C, Tp] instead of [P, H, Tp, Tp]); the prompt buffer is first left-padded to a
multiple of C (padding is masked, so the numbers are those of the unpadded prompt). Chunked and
whole prefills give the same keys, values and logits up to float rounding (the queries of a
matmul differ in number).
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl_curriculum.model import decoding
from rl_curriculum.model import kv_cache
from rl_curriculum.model import rope
from rl_curriculum.model import transformer


def padded_length(prompt_len: int, chunk: int) -> int:
  """The prompt buffer after left-padding Tp to a multiple of a chunk (0 = whole: Tp)."""
  if chunk <= 0 or chunk >= prompt_len:
    return prompt_len
  return -(-prompt_len // chunk) * chunk


def prefill_prompts(graphdef: nnx.GraphDef, params: transformer.Params, tokens: jax.Array,
                    mask: jax.Array, *, chunk: int = 0,
                    constrain: Optional[Callable[[Any, int], Any]] = None
                    ) -> Tuple[jax.Array, kv_cache.KVCache, jax.Array]:
  """The P prompts (i32[P, Tp], left-padded, mask bool[P, Tp]) into a cache of their own slots.

  Args:
    chunk: static; positions per prefill pass, 0 (or >= Tp) for one pass.
    constrain: see `transformer.Transformer.hidden`.

  Returns:
    (f32[P, V] logits of each prompt's next token, the KVCache of Tp' = `padded_length(Tp,
    chunk)` slots, bool[P, Tp'] the mask of those slots).
  """
  p, tp = tokens.shape
  mask = mask.astype(bool)
  length = padded_length(tp, chunk)
  if length == tp and (chunk <= 0 or chunk >= tp):
    logits, cache = decoding.prefill(graphdef, params, tokens, mask, tp, constrain=constrain)
    return logits, cache, mask
  pad = length - tp
  tokens = jnp.pad(tokens, ((0, 0), (pad, 0)))
  mask = jnp.pad(mask, ((0, 0), (pad, 0)))
  positions = rope.positions_from_mask(mask)
  model = transformer.merge_params(graphdef, params)
  config = model.config

  def one_chunk(i, carry):
    cache, _ = carry
    start = i * chunk
    cut = lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=1)
    hidden, cache = transformer.merge_params(graphdef, params).hidden(
        cut(tokens), cut(positions), mask, cache, start, constrain=constrain)
    return cache, hidden[:, -1, :]

  carry = (kv_cache.init_cache(config, p, length), jnp.zeros((p, config.d_model), config.dtype))
  cache, last = jax.lax.fori_loop(0, length // chunk, one_chunk, carry)
  return model.logits(last), cache, mask
