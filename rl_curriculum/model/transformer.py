"""Decoder-only transformer of the Llama / Qwen2 / Qwen3 family in Flax NNX.

Block (pre-norm, as in Llama):  x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))
                                x += down(silu(gate(n2(x))) * up(n2(x)))
with RMSNorm n(x) = x / sqrt(mean(x^2) + eps) * w, rotary embeddings (`rope`; Su et al. 2021,
"RoFormer", rotate-half layout as in HF Llama), grouped-query attention (`attention`; Ainslie et
al. 2023), optional q/k/v bias (Qwen2) and optional RMSNorm of q and k over head_dim (Qwen3).

Every parameter carries logical axis names in its `out_sharding` metadata (`vocab`, `embed`,
`heads`, `kv_heads`, `head_dim`, `mlp`; `None` for LoRA ranks and norm scales when unsharded);
`nnx.get_partition_spec(state)` reads them and `parallel/mesh.py` maps them to mesh axes. The
model knows no mesh.

Padding is LEFT padding: the real tokens of every row end at the last column. A row's rotary
positions come from its padding mask (`rope.positions_from_mask`), and padded keys are masked
out, so a left-padded row gives the same logits as the same row unpadded.

Functional use: split the model once into a static graphdef and a pytree of parameters, then
call the module-level functions with both (jit-friendly, and the parameters stay a plain
pytree for optax and checkpointing):

  graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
  logits = forward(graphdef, params, tokens, mask)              # f32[B, T, V]
  hidden = forward_hidden(graphdef, params, tokens, mask)       # [B, T, D], post final norm
  logits = logits_from_hidden(graphdef, params, hidden)         # the output head alone

`params` may be one `nnx.State` or a tuple of states from a filtered split, e.g.
`(lora_state, base_state)` from `nnx.split(model, lora.LoRAWeight, ...)`. Cache-based inference
is in `decoding.py`: `prefill` into a KV cache, then `decode_step` (`decode_slots` over a
prefix-shared cache, `decode_pages` over a paged one) one token at a time. Many-query attention
runs on the backend `config.attention` names (`attention.many_query_backend`).

Two layouts of the block stack (`config.scan_layers`), the same function: `blocks` is an
`nnx.List` of L blocks (unrolled), or ONE `Block` whose parameters carry a leading layer axis
[L, ...], run under `jax.lax.scan` (scanned); `block_stack` runs either (`config.remat`),
`layer_stacking` converts a state between them, the KV cache follows the layout (`kv_cache`).
"""

import functools
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
from flax import nnx

from rl_curriculum.model import attention
from rl_curriculum.model import blockwise_attention
from rl_curriculum.model import block_stack
from rl_curriculum.model import kv_cache
from rl_curriculum.model import layer_stacking
from rl_curriculum.model import paged_cache
from rl_curriculum.model import prefix_cache
from rl_curriculum.model import rope
from rl_curriculum.model.config import ModelConfig

Params = Union[nnx.State, Tuple[nnx.State, ...]]


def _param(value: jax.Array, axes: Sequence[Optional[str]]) -> nnx.Param:
  # eager_sharding=False: the names are logical; parallel/mesh.py turns them into shardings.
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2, last axis) + eps) * scale, computed in float32."""

  def __init__(self, dim: int, axis_name: str, *, eps: float, dtype: str, param_dtype: str):
    self.scale = _param(jnp.ones((dim,), param_dtype), (axis_name,))
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    scale = self.scale[...].astype(jnp.float32).reshape((1,) * (x.ndim - 1) + (-1,))
    return (y * scale).astype(self.dtype)


class Projection(nnx.Module):
  """A linear map contracting the trailing input axes: y[..., out] = x[..., in] . W[in, out] + b.

  `lora_a` (f32[*in, r]) and `lora_b` (f32[r, *out]) are None until `lora.attach` sets them; then
  y += s * (x . A) . B with s = alpha / r read from the `lora_scale` metadata of `lora_b`.
  """

  def __init__(self, in_shape: Tuple[int, ...], out_shape: Tuple[int, ...],
               in_axes: Tuple[str, ...], out_axes: Tuple[str, ...], *, use_bias: bool,
               config: ModelConfig, rngs: nnx.Rngs):
    self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
    self.in_axes, self.out_axes = tuple(in_axes), tuple(out_axes)
    self.dtype = config.dtype
    init = nnx.initializers.normal(config.init_std)
    self.kernel = _param(init(rngs.params(), self.in_shape + self.out_shape, config.param_dtype),
                         self.in_axes + self.out_axes)
    self.bias = (_param(jnp.zeros(self.out_shape, config.param_dtype), self.out_axes)
                 if use_bias else nnx.data(None))
    self.lora_a, self.lora_b = nnx.data(None), nnx.data(None)

  def __call__(self, x: jax.Array) -> jax.Array:
    return project_shared_input(x, (self,))[0]

  def base(self, x: jax.Array) -> jax.Array:
    """x . W + b, without the adapter."""
    y = jnp.tensordot(x.astype(self.dtype), self.kernel[...].astype(self.dtype),
                      axes=len(self.in_shape))
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype).reshape((1,) * (y.ndim - len(self.out_shape))
                                                        + self.out_shape)
    return y

  def adapter_up(self, low: jax.Array) -> jax.Array:
    """s * low . B for low = x . A [..., r]."""
    scale = self.lora_b.get_metadata("lora_scale")
    return scale * jnp.tensordot(low, self.lora_b[...].astype(self.dtype), axes=1)


def project_shared_input(x: jax.Array, projections: Sequence[Projection]) -> list:
  """[p(x) for p in projections] for projections reading the same x (q|k|v, gate|up); they must
  share in_shape and dtype.

  The adapters' A matrices are concatenated along the rank axis, so x . A runs as one matmul for
  all of them (and its backward as one pass over x), instead of one thin rank-r product each.
  """
  x = x.astype(projections[0].dtype)
  outs = [p.base(x) for p in projections]
  adapted = [i for i, p in enumerate(projections) if p.lora_a is not None]
  if adapted:
    a = [projections[i].lora_a[...].astype(x.dtype) for i in adapted]
    low = jnp.tensordot(x, a[0] if len(a) == 1 else jnp.concatenate(a, axis=-1),
                        axes=len(projections[0].in_shape))
    end = 0
    for i, a_i in zip(adapted, a):
      start, end = end, end + a_i.shape[-1]
      outs[i] = outs[i] + projections[i].adapter_up(low[..., start:end])
  return outs


class Attention(nnx.Module):
  """Grouped-query causal self-attention with rotary embeddings and an optional KV cache."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    embed = ("embed",)
    self.q = Projection((c.d_model,), (c.num_heads, c.head_dim), embed, ("heads", "head_dim"),
                        use_bias=c.qkv_bias, config=c, rngs=rngs)
    self.k = Projection((c.d_model,), (c.num_kv_heads, c.head_dim), embed,
                        ("kv_heads", "head_dim"), use_bias=c.qkv_bias, config=c, rngs=rngs)
    self.v = Projection((c.d_model,), (c.num_kv_heads, c.head_dim), embed,
                        ("kv_heads", "head_dim"), use_bias=c.qkv_bias, config=c, rngs=rngs)
    self.o = Projection((c.num_heads, c.head_dim), (c.d_model,), ("heads", "head_dim"), embed,
                        use_bias=False, config=c, rngs=rngs)
    if c.qk_norm:
      kw = dict(eps=c.rms_eps, dtype=c.dtype, param_dtype=c.param_dtype)
      self.q_norm = RMSNorm(c.head_dim, "head_dim", **kw)
      self.k_norm = RMSNorm(c.head_dim, "head_dim", **kw)
    else:
      self.q_norm = nnx.data(None)
      self.k_norm = nnx.data(None)

  def __call__(self, x, positions, key_mask, inv_freq, cache=None, cache_index=None,
               shard=None):
    """x[B, T, D] -> (y[B, T, D], the new (keys, values) [B, T, Hkv, head_dim] or None).

    With a `prefix_cache.SlotIndex` as cache_index (T = 1), `cache` is this layer's (prompt keys,
    prompt values, completion keys, completion values) of a `prefix_cache.PrefixCache` and
    key_mask its bool[B, Tp + N] (`prefix_cache.key_mask`, causality included); the second
    result is then the layer's whole completion keys and values with the new token written
    (unrolled), or the new keys and values [B, 1, ...] for the caller to write (scanned).

    With a `paged_cache.PageIndex` as cache_index (T = 1), `cache` is every layer's pages and
    the second result the pool with each slot's new key and value written (`paged_cache.attend`).

    With `cache`, this layer's (k, v) [B, S, Hkv, head_dim], the queries attend over its S slots
    with slots cache_index .. cache_index + T - 1 holding the new keys and values (in the cache
    dtype, also returned; writing them is the caller's, so `cache` may be a slice of a stacked
    cache). Without a cache the T tokens attend causally among themselves, None returned.
    `shard` (`mesh.per_shard`) runs the splash kernel on each device's rows under a mesh.
    """
    c = self.config
    b, t, _ = x.shape
    q, k, v = project_shared_input(x, (self.q, self.k, self.v))
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q = rope.apply_rope(q, positions, inv_freq)
    k = rope.apply_rope(k, positions, inv_freq)
    if isinstance(cache_index, paged_cache.PageIndex):  # one token per slot, paged cache
      q = q.reshape(b, c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
      out, pool = paged_cache.attend(cache, cache_index, q, k[:, 0], v[:, 0], config=c)
      return self.o(out.reshape(b, 1, c.num_heads, c.head_dim)), pool
    if isinstance(cache_index, prefix_cache.SlotIndex):  # one token per decode slot
      prompt_k, prompt_v, cache_k, cache_v = cache
      read = (prefix_cache.with_new(cache_k, k, cache_index, c.scan_layers),
              prefix_cache.with_new(cache_v, v, cache_index, c.scan_layers))
      q = q.reshape(b, c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
      out = prefix_cache.attend(q, (prompt_k, prompt_v), read, cache_index, key_mask, c.dtype)
      # Scanned: the new slots, written after the scan; unrolled: the written layer cache.
      new = (k.astype(cache_k.dtype), v.astype(cache_v.dtype)) if c.scan_layers else read
      return self.o(out.reshape(b, 1, c.num_heads, c.head_dim)), new
    if cache is None:
      keys, values, new_cache = k, v, None
      q_slots = jnp.arange(t, dtype=jnp.int32)
    else:
      cache_k, cache_v = cache
      new_cache = (k.astype(cache_k.dtype), v.astype(cache_v.dtype))
      keys = kv_cache.with_slots(cache_k, new_cache[0], cache_index, c.scan_layers)
      values = kv_cache.with_slots(cache_v, new_cache[1], cache_index, c.scan_layers)
      q_slots = cache_index + jnp.arange(t, dtype=jnp.int32)
    group = c.num_heads // c.num_kv_heads
    q = q.reshape(b, t, c.num_kv_heads, group, c.head_dim)
    kind = attention.many_query_backend(c.attention, c.attention_block,
                                        0 if cache is None else cache_index,
                                        b % shard.shards if shard else 0)
    if t > 1 and kind != "dense":
      if key_mask.ndim != 2:
        raise ValueError(f"the {kind} attention takes a key mask bool[B, S], not a per-query "
                         "mask; use ModelConfig(attention='reference', attention_block=0).")
      attend = functools.partial(blockwise_attention.attend, q_offset=0 if cache is None
                                 else cache_index, dtype=c.dtype, backend=kind,
                                 block=c.attention_block or 512)
      # A Pallas kernel under a mesh runs on each device's rows (`shard`: `mesh.per_shard`).
      out = (shard(attend, (q, keys, values, key_mask), (0,) * 4, 0) if kind == "splash" and shard
             else attend(q, keys, values, key_mask))
      return self.o(out.reshape(b, t, c.num_heads, c.head_dim)), new_cache
    mask = attention.causal_slot_mask(key_mask, q_slots, keys.shape[1])
    if t == 1:
      out = kv_cache.one_query_attention(q[:, 0], keys, values, mask[:, 0, :], c.dtype)
    else:
      out = attention.grouped_query_attention(q, keys, values, mask, c.dtype)
    return self.o(out.reshape(b, t, c.num_heads, c.head_dim)), new_cache



class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)) (Shazeer 2020)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    kw = dict(use_bias=False, config=c, rngs=rngs)
    self.gate = Projection((c.d_model,), (c.mlp_dim,), ("embed",), ("mlp",), **kw)
    self.up = Projection((c.d_model,), (c.mlp_dim,), ("embed",), ("mlp",), **kw)
    self.down = Projection((c.mlp_dim,), (c.d_model,), ("mlp",), ("embed",), **kw)

  def __call__(self, x: jax.Array) -> jax.Array:
    gate, up = project_shared_input(x, (self.gate, self.up))
    return self.down(jax.nn.silu(gate) * up)


class Block(nnx.Module):
  """Pre-norm decoder block: attention then SwiGLU, each with a residual connection."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    kw = dict(eps=config.rms_eps, dtype=config.dtype, param_dtype=config.param_dtype)
    self.attn_norm = RMSNorm(config.d_model, "embed", **kw)
    self.attn = Attention(config, rngs=rngs)
    self.mlp_norm = RMSNorm(config.d_model, "embed", **kw)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, x, positions, key_mask, inv_freq, cache=None, cache_index=None,
               shard=None):
    """x[B, T, D] -> (x[B, T, D], new (keys, values) [B, T, Hkv, head_dim] or None); the
    arguments as in `Attention`."""
    h, new_slots = self.attn(self.attn_norm(x), positions, key_mask, inv_freq, cache,
                             cache_index, shard)
    x = x + h
    return x + self.mlp(self.mlp_norm(x)), new_slots


class Transformer(nnx.Module):
  """Decoder-only language model; see the module docstring for the block and the conventions."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = config
    init = nnx.initializers.normal(c.init_std)
    self.embed = _param(init(rngs.params(), (c.vocab_size, c.d_model), c.param_dtype),
                        ("vocab", "embed"))
    if c.scan_layers:
      # Drawn in the unrolled model's order, so layer l equals its block l for the same rngs.
      self.blocks = layer_stacking.stack_modules([Block(c, rngs=rngs)
                                                  for _ in range(c.num_layers)])
    else:
      self.blocks = nnx.List([Block(c, rngs=rngs) for _ in range(c.num_layers)])
    self.final_norm = RMSNorm(c.d_model, "embed", eps=c.rms_eps, dtype=c.dtype,
                              param_dtype=c.param_dtype)
    if c.tie_embeddings:
      self.head = nnx.data(None)
    else:
      self.head = _param(init(rngs.params(), (c.d_model, c.vocab_size), c.param_dtype),
                         ("embed", "vocab"))

  def hidden(self, tokens: jax.Array, positions: jax.Array, key_mask: jax.Array,
             cache: Optional[kv_cache.KVCache] = None,
             cache_index: Optional[jax.Array] = None, *,
             constrain: Optional[Callable[[Any, int], Any]] = None
             ) -> Tuple[jax.Array, Optional[kv_cache.KVCache]]:
    """Final hidden states (after the final norm, before the head) and the updated cache.

    Args:
      tokens: i32[B, T] token ids.
      positions: i32[B, T] rotary positions (see `rope.positions_from_mask`).
      key_mask: bool[B, S] validity of each key slot (S = T without a cache, S = cache length
        with one), or bool[B, T, S] for an arbitrary mask; causality is always added.
      cache: None for a full forward pass, else the KVCache to write T new slots into.
      cache_index: i32[] (or int: static) first cache slot written (slots index .. index+T-1).
      constrain: None, or `constrain(x, axis)` applied to the residual stream [B, T, D] (rows on
      axis 0) before every block, e.g. rows kept over a mesh's batch axes (otherwise GSPMD may
      compute every row on every device); a `mesh.RowLayout` also runs kernels per device.

    Returns:
      ([B, T, D] in config.dtype, new KVCache or None).
    """
    if (cache is None) != (cache_index is None):
      raise ValueError("cache and cache_index must be given together.")
    c = self.config
    x = jnp.take(self.embed[...], tokens, axis=0).astype(c.dtype)
    if cache is not None and not isinstance(cache_index, (int, prefix_cache.SlotIndex,
                                                          paged_cache.PageIndex)):
      cache_index = jnp.asarray(cache_index, jnp.int32)
    rows = (lambda x: x) if constrain is None else (lambda x: constrain(x, 0))
    x, cache = block_stack.run_layers(self.blocks, c, x, positions, key_mask, cache, cache_index,
                                      rows, getattr(constrain, "per_shard", None))
    return self.final_norm(x), cache

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Output head: f32[..., V] = hidden[..., D] . W_head (the embedding transposed if tied)."""
    dtype = self.config.dtype
    weights, spec = ((self.embed, "...d,vd->...v") if self.head is None
                     else (self.head, "...d,dv->...v"))
    return jnp.einsum(spec, hidden.astype(dtype), weights[...].astype(dtype),
                      preferred_element_type=jnp.float32)

  def __call__(self, tokens, positions, key_mask, cache=None, cache_index=None):
    """f32[B, T, V] logits and the updated cache; arguments as in `hidden`."""
    hidden, cache = self.hidden(tokens, positions, key_mask, cache, cache_index)
    return self.logits(hidden), cache


# ---------------------------------------------------------------------------------------------
# Functional API: pure functions of (graphdef, params, arrays).


def init_model(config: ModelConfig, seed: int = 0) -> Tuple[nnx.GraphDef, nnx.State]:
  """Random-initialised model, split: (graphdef, params)."""
  return nnx.split(Transformer(config, rngs=nnx.Rngs(seed)))


def abstract_model(config: ModelConfig) -> Tuple[nnx.GraphDef, nnx.State]:
  """`init_model`'s (graphdef, params) with `jax.ShapeDtypeStruct`s for the values: nothing is
  computed (a fresh process would otherwise compile each random initialiser), for a model whose
  values are then read from a checkpoint."""
  return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))


def merge_params(graphdef: nnx.GraphDef, params: Params) -> Transformer:
  """The module back from its graphdef and one state or a tuple of states."""
  return nnx.merge(graphdef, *(params if isinstance(params, (tuple, list)) else (params,)))


def forward_hidden(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array,
                   mask: jax.Array, *, constrain: Optional[Callable[[Any, int], Any]] = None
                   ) -> jax.Array:
  """Final hidden states [B, T, D] (post final norm) of a left-padded batch, no cache.

  Args:
    tokens: i32[B, T]; mask: bool[B, T], True on real tokens (left padding).
    constrain: see `Transformer.hidden`.
  """
  model = merge_params(graphdef, params)
  mask = mask.astype(bool)
  hidden, _ = model.hidden(tokens, rope.positions_from_mask(mask), mask, constrain=constrain)
  return hidden


def shared_prefix_hidden(graphdef: nnx.GraphDef, params: Params, prefix: jax.Array,
                         prefix_mask: jax.Array, tokens: jax.Array, *,
                         constrain: Optional[Callable[[Any, int], Any]] = None
                         ) -> Tuple[jax.Array, jax.Array]:
  """Final hidden states of prefix ++ continuation when each prefix has a group of continuations.

  The prefix runs once; its keys and values are shared by the continuations that follow it, so a
  group of G completions of one prompt costs Tp + G T token-passes instead of G (Tp + T). The
  result equals `forward_hidden` on the concatenated rows (float rounding aside), gradients
  included: a shared key or value gets the sum of its continuations' gradients.

  Args:
    prefix: i32[N, Tp] left-padded prefixes; prefix_mask: bool[N, Tp] (each row needs a token).
    tokens: i32[N * G, T] continuations, G consecutive rows per prefix; every slot is a key
      (masking of tokens after a stop is the caller's, as with `forward_hidden`).
    constrain: None, or `constrain(tree, axis)` returning the tree with every array's rows (its
      dimension `axis`) laid out as the caller wants, e.g. a sharding constraint over a mesh's
      batch axes. Applied to the repeated prefix cache and the continuation rows: N prefixes may
      be too few to spread over the devices, and their replicated layout would otherwise spread
      to the N * G continuation rows.

  Returns:
    ([N, Tp, D] hidden states of the prefixes, [N * G, T] of the continuations).
  """
  model = merge_params(graphdef, params)
  n, tp = prefix.shape
  b, t = tokens.shape
  if b % n:
    raise ValueError(f"{b} continuation rows do not split into groups over {n} prefixes.")
  group = b // n
  prefix_mask = prefix_mask.astype(bool)
  # Python ints, not arrays, for the cache indices: static query offsets, which the splash
  # kernel needs (`attention.many_query_backend`).
  prefix_hidden, cache = model.hidden(prefix, rope.positions_from_mask(prefix_mask), prefix_mask,
                                      kv_cache.init_cache(model.config, n, tp), 0,
                                      constrain=constrain)
  # Each prefix's keys and values, repeated for its group, with T free slots after them.
  rows = kv_cache.cache_batch_axis(cache)

  def extend(x):
    x = jnp.repeat(x, group, axis=rows)
    free = x.shape[:rows + 1] + (t,) + x.shape[rows + 2:]
    return jnp.concatenate([x, jnp.zeros(free, x.dtype)], axis=rows + 1)

  cache = jax.tree.map(extend, cache)
  mask = jnp.repeat(prefix_mask, group, axis=0)
  if constrain is not None:
    cache = constrain(cache, rows)
    tokens, mask = constrain((tokens, mask), 0)
  positions = (jnp.sum(mask, axis=1, dtype=jnp.int32)[:, None]
               + jnp.arange(t, dtype=jnp.int32)[None, :])
  hidden, _ = model.hidden(tokens, positions, kv_cache.cache_key_mask(mask, tp + t), cache, tp,
                           constrain=constrain)
  if constrain is not None:
    hidden = constrain(hidden, 0)
  return prefix_hidden, hidden


def logits_from_hidden(graphdef: nnx.GraphDef, params: Params, hidden: jax.Array) -> jax.Array:
  """The output head alone: f32[..., V] from hidden[..., D]."""
  return merge_params(graphdef, params).logits(hidden)


def forward(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array,
            mask: jax.Array) -> jax.Array:
  """Logits f32[B, T, V] of a left-padded batch (tokens i32[B, T], mask bool[B, T]).

  logits[b, t] is the next-token distribution after tokens[b, :t+1]; rows at padding slots are
  finite but meaningless. Equal to the unpadded row's logits at the real slots.
  """
  model = merge_params(graphdef, params)
  mask = mask.astype(bool)
  logits, _ = model(tokens, rope.positions_from_mask(mask), mask)
  return logits
