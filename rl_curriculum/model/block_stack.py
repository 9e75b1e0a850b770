"""The decoder's L blocks run over the residual stream, in either layout of the stack.

Two layouts of the block stack (`config.scan_layers`), the same function:

  unrolled  `blocks` is an `nnx.List` of L blocks; the program holds L copies of the block.
  scanned   `blocks` is ONE block whose parameters carry a leading layer axis [L, ...]; the
            layers run under `jax.lax.scan`, so the program holds one block whatever L is
            (compile time independent of depth).

`layer_stacking` names the parameters of both layouts and converts a state between them; the KV
cache follows the model's layout (`kv_cache`).

Rematerialisation (`config.remat`): each block call is wrapped in `jax.checkpoint`, so the
backward pass recomputes it instead of reading stored activations; "block" keeps only the block
inputs (`nothing_saveable`), "dots" also its matmul outputs (`dots_with_no_batch_dims_saveable`).
Values are unchanged; only what the backward pass stores and recomputes differs.

A block is called as block(x, positions, key_mask, inv_freq, layer_cache, cache_index) ->
(x, new (keys, values) or None), as `transformer.Block`. Shapes: B rows, T tokens, D = d_model,
S cache slots, L layers, Hkv key/value heads.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from rl_curriculum.model import kv_cache
from rl_curriculum.model import paged_cache
from rl_curriculum.model import prefix_cache
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.model.rope import rope_frequencies

_CHECKPOINT_POLICIES = {
    "block": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _block_runner(graphdef: nnx.GraphDef, config: ModelConfig,
                  shard: Optional[Callable] = None) -> Callable:
  """The block as a pure function (state, x, positions, key_mask, layer_cache, cache_index) ->
  (x, new slots), wrapped in `jax.checkpoint` with the policy of `config.remat`."""
  inv_freq = rope_frequencies(config)

  def run(state, x, positions, key_mask, layer_cache, cache_index):
    block = nnx.merge(graphdef, state)
    return block(x, positions, key_mask, inv_freq, layer_cache, cache_index, shard=shard)

  if config.remat == "none":
    return run
  # Under scan the loop already keeps XLA from merging the recomputation back into the forward
  # pass, so the extra barrier of prevent_cse is dropped there (as JAX advises).
  remat = lambda static: jax.checkpoint(run, policy=_CHECKPOINT_POLICIES[config.remat],
                                        prevent_cse=not config.scan_layers, static_argnums=static)
  dynamic, static = remat(()), remat((5,))

  def pick(*args):
    if isinstance(args[5], (prefix_cache.SlotIndex, paged_cache.PageIndex)):
      return run(*args)  # a decode step: no backward pass to recompute for
    # A Python int cache index stays one (static) inside the recomputed block: the splash
    # kernel needs its queries' first slot before tracing (`attention.many_query_backend`).
    return (static if isinstance(args[5], int) else dynamic)(*args)
  return pick


def run_layers(blocks: nnx.Module, config: ModelConfig, x: jax.Array, positions: jax.Array,
               key_mask: jax.Array, cache: Optional[kv_cache.KVCache],
               cache_index: Optional[jax.Array], rows: Callable[[jax.Array], jax.Array],
               shard: Optional[Callable] = None):
  """x[B, T, D] through the L blocks of the layout `config.scan_layers` gives.

  Args:
    blocks: an `nnx.List` of L blocks (unrolled), or one block of [L, ...] parameters (scanned).
    x: [B, T, D] the residual stream after the embedding.
    positions, key_mask, cache_index: as in `transformer.Transformer.hidden`.
    cache: None, or the KVCache (in the same layout) to write T new slots into, or a
      `prefix_cache.PrefixCache` with a `prefix_cache.SlotIndex` as cache_index (one token per
      decode slot, each written at its own completion slot), or a pool of pages
      (`paged_cache.init_pool`, either layout) with a `paged_cache.PageIndex`.
    rows: applied to the residual stream before every block (the identity, or a constraint).
    shard: None, or how a kernel XLA cannot partition runs on each device's rows
      (`mesh.per_shard`): the splash attention of a many-query pass under a mesh.

  Returns:
    (x[B, T, D] after the last block, updated KVCache or None).

  Raises:
    ValueError: the cache is in the other layout (the message says how to build it).
  """
  if isinstance(cache_index, paged_cache.PageIndex):
    return _run_paged(blocks, config, x, positions, cache, cache_index, rows)
  if isinstance(cache, prefix_cache.PrefixCache):
    run = _run_scanned_prefix if config.scan_layers else _run_unrolled_prefix
    return run(blocks, config, x, positions, key_mask, cache, cache_index, rows)
  if cache is not None and isinstance(cache.k, (tuple, list)) == config.scan_layers:
    raise ValueError(
        f"the KVCache is in the {'unrolled' if config.scan_layers else 'scanned'} layout but the "
        f"model has scan_layers={config.scan_layers}; build it with "
        f"kv_cache.init_cache(model config).")
  run = _run_scanned if config.scan_layers else _run_unrolled
  return run(blocks, config, x, positions, key_mask, cache, cache_index, rows, shard)


def _run_unrolled(blocks, config, x, positions, key_mask, cache, cache_index, rows, shard):
  """The L blocks of an `nnx.List` one after the other; the cache is a tuple per layer."""
  new_k, new_v = [], []
  for i, block in enumerate(blocks):
    graphdef, state = nnx.split(block)
    layer_cache = None if cache is None else (cache.k[i], cache.v[i])
    x, slots = _block_runner(graphdef, config, shard)(state, rows(x), positions, key_mask,
                                                      layer_cache, cache_index)
    if cache is not None:
      new_k.append(kv_cache.write_slots(cache.k[i], slots[0], cache_index))
      new_v.append(kv_cache.write_slots(cache.v[i], slots[1], cache_index))
  return x, (None if cache is None else kv_cache.KVCache(tuple(new_k), tuple(new_v)))


def _run_scanned(block, config, x, positions, key_mask, cache, cache_index, rows, shard):
  """The stacked block under `lax.scan` over its leading layer axis: one block in the program.

  With a cache [L, B, S, Hkv, head_dim], the scan reads layer l's slots as its l-th slice and
  emits only the T new slots of each layer, [L, B, T, Hkv, head_dim]; one
  `dynamic_update_slice` at (0, 0, cache_index, 0, 0) then writes them in place. The cache is
  never a loop carry: nothing in the loop writes a buffer it also reads, so no copy of the cache
  is made per layer or per step, and in the backward pass each layer's cache gradient is that
  iteration's output, not a cache-sized accumulator.
  """
  graphdef, state = nnx.split(block)
  run = _block_runner(graphdef, config, shard)
  if cache is None:
    def body(x, layer_state):
      return run(layer_state, rows(x), positions, key_mask, None, None)[0], None
    x, _ = jax.lax.scan(body, x, state)
    return x, None

  # The layers' caches enter the scan as their bit patterns (`kv_cache.as_bits`): XLA's CPU
  # compiler otherwise converts the whole 16-bit cache to float32 once before the loop.
  def body_with_cache(x, layer):
    layer_state, layer_k, layer_v = layer
    layer_cache = (kv_cache.from_bits(layer_k, cache.k.dtype),
                   kv_cache.from_bits(layer_v, cache.v.dtype))
    return run(layer_state, rows(x), positions, key_mask, layer_cache, cache_index)

  x, (new_k, new_v) = jax.lax.scan(body_with_cache, x,
                                   (state, kv_cache.as_bits(cache.k), kv_cache.as_bits(cache.v)))
  start = (0, 0, cache_index, 0, 0)
  return x, kv_cache.KVCache(kv_cache.update_slice(cache.k, new_k, start),
                             kv_cache.update_slice(cache.v, new_v, start))


def _run_unrolled_prefix(blocks, config, x, positions, key_mask, cache, index, rows):
  """One token per decode slot through the L blocks, each reading its layer of a PrefixCache and
  returning that layer's completion keys and values with each slot's new token written."""
  new_k, new_v = [], []
  for i, block in enumerate(blocks):
    graphdef, state = nnx.split(block)
    layer = (cache.prompt_k[i], cache.prompt_v[i], cache.k[i], cache.v[i])
    x, (k, v) = _block_runner(graphdef, config)(state, rows(x), positions, key_mask, layer, index)
    new_k.append(k)
    new_v.append(v)
  return x, cache._replace(k=tuple(new_k), v=tuple(new_v))


def _run_scanned_prefix(block, config, x, positions, key_mask, cache, index, rows):
  """The stacked block under `lax.scan` over a PrefixCache's layers; as `_run_scanned`, the scan
  emits only the new slots [L, B, 1, Hkv, head_dim], written after it at each decode slot's own
  completion slot (`prefix_cache.write`, in place)."""
  graphdef, state = nnx.split(block)
  run = _block_runner(graphdef, config)
  dtype = cache.k.dtype

  def body(x, layer):
    layer_state, *arrays = layer
    layer_cache = tuple(kv_cache.from_bits(a, dtype) for a in arrays)
    return run(layer_state, rows(x), positions, key_mask, layer_cache, index)

  arrays = tuple(kv_cache.as_bits(a) for a in cache)
  x, (new_k, new_v) = jax.lax.scan(body, x, (state,) + arrays)
  return x, cache._replace(k=prefix_cache.write(cache.k, new_k, index.step, 1),
                           v=prefix_cache.write(cache.v, new_v, index.step, 1))


def _run_paged(blocks, config, x, positions, pool, index, rows):
  """One token per decode slot through the L blocks over a pool of pages [L, Pg, ...]: block l
  writes its new keys and values into the pool's layer l and reads them back
  (`paged_cache.attend`). Scanned, the pool is the scan's carry, updated in place."""
  if not config.scan_layers:
    for i, block in enumerate(blocks):
      graphdef, state = nnx.split(block)
      x, pool = _block_runner(graphdef, config)(state, rows(x), positions, None, pool,
                                                index._replace(layer=i))
    return x, pool
  graphdef, state = nnx.split(blocks)
  run = _block_runner(graphdef, config)

  def body(carry, layer):
    x, pool = carry
    layer_state, i = layer
    return run(layer_state, rows(x), positions, None, pool, index._replace(layer=i)), None

  layers = jnp.arange(config.num_layers, dtype=jnp.int32)
  (x, pool), _ = jax.lax.scan(body, (x, pool), (state, layers))
  return x, pool
