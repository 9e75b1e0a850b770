"""Attention over keys and values kept in fixed-size pages of one pool, as functions of arrays.

The layout of JAX's TPU kernel `jax.experimental.pallas.ops.tpu.ragged_paged_attention`: one
layer's pool `kv_pages` [N, ps, 2 Hkv, d] holds keys at the even combined heads (0::2) and values
at the odd ones (1::2); sequence s's token j lives in page `page_indices[s, j // ps]` at offset
`j % ps`. Sequences may share pages (a prompt's prefix), and a sequence needs only
`pages_needed(kv_len, ps)` pages, not the longest sequence's slots.

A batch of Tq query tokens is ragged: sequence s's q_len = cu_q_lens[s + 1] - cu_q_lens[s]
queries are its last q_len tokens (query i at position kv_len - q_len + i, causal), for the first
`num_seqs[0]` sequences; query rows from cu_q_lens[num_seqs[0]] on are padding. Query head h reads
key/value head h // G:

  out[t, h] = sum_j softmax_j(sm_scale q[t, h] . k[s, j, h // G] | j <= pos[t], j < kv_len[s])
              * v[s, j, h // G]

Backends: "reference", a vectorised pure-JAX form (any device), and "tpu", JAX's Pallas kernel
(TPU only; compiled ahead of time on any host with libtpu installed). A decode step
(`decode_attention`) is the case of one query per sequence.

Shapes: N pages of ps tokens, S sequences, Pp pages per sequence (page table width), Tq query
tokens, H query heads, Hkv key/value heads, G = H / Hkv, d = head_dim, P prompts of Tp tokens.
"""

import contextlib

import jax
import jax.numpy as jnp

BACKENDS = ("reference", "tpu")
# The JAX kernel's causal mask value: finite, so a fully masked row cannot make a NaN.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def pages_needed(tokens, page_size: int):
  """Pages of `page_size` tokens that hold `tokens` tokens: ceil(tokens / page_size), for ints
  or integer arrays (elementwise)."""
  return (tokens + page_size - 1) // page_size


def _reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale):
  """The vectorised reference of `ragged_paged_attention`: each query token finds its sequence,
  gathers that sequence's pages and attends over them (no loop over sequences)."""
  tq, num_heads, head_dim = q.shape
  _, page_size, combined, _ = kv_pages.shape
  num_kv = combined // 2
  seqs, pages_per_seq = page_indices.shape
  tokens = jnp.arange(tq, dtype=jnp.int32)
  live_seq = jnp.arange(seqs, dtype=jnp.int32) < num_seqs[0]                        # [S]
  # Token t belongs to the number of (live) sequences that end at or before it.
  ended = (cu_q_lens[1:][None, :] <= tokens[:, None]) & live_seq[None, :]         # [Tq, S]
  seq = jnp.sum(ended.astype(jnp.int32), axis=1)                                  # [Tq]
  valid = tokens < cu_q_lens[num_seqs[0]]                                         # [Tq]
  seq = jnp.minimum(seq, seqs - 1)
  q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
  pos = kv_lens[seq] - q_len + (tokens - cu_q_lens[seq])                          # [Tq]
  kv = kv_pages[page_indices[seq]]                                    # [Tq, Pp, ps, 2Hkv, d]
  kv = kv.reshape(tq, pages_per_seq * page_size, combined, head_dim)
  keys, values = kv[:, :, 0::2], kv[:, :, 1::2]                            # [Tq, K, Hkv, d]
  qg = q.reshape(tq, num_kv, num_heads // num_kv, head_dim)                 # [Tq, Hkv, G, d]
  scores = jnp.einsum("tkgd,tjkd->tkgj", qg, keys,
                      preferred_element_type=jnp.float32) * sm_scale      # [Tq, Hkv, G, K]
  slots = jnp.arange(pages_per_seq * page_size, dtype=jnp.int32)
  seen = (slots[None, :] <= pos[:, None]) & (slots[None, :] < kv_lens[seq][:, None])  # [Tq, K]
  scores = jnp.where(seen[:, None, None, :], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
  out = jnp.einsum("tkgj,tjkd->tkgd", probs, values, preferred_element_type=jnp.float32)
  # A query that sees no key (kv_len 0) gets zeros, as the JAX reference's empty softmax does.
  keep = valid & jnp.any(seen, axis=1)
  out = jnp.where(keep[:, None, None, None], out, 0.0)
  return out.reshape(tq, num_heads, head_dim).astype(q.dtype)


def ragged_paged_attention(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array,
                           page_indices: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array, *,
                           sm_scale: float, backend: str, num_kv_pages_per_block=None,
                           num_queries_per_block=None) -> jax.Array:
  """Ragged attention of each sequence's queries over its paged keys and values (module
  docstring).

  Args:
    q: [Tq, H, d] the sequences' queries, concatenated; rows from cu_q_lens[num_seqs[0]] on are
      padding.
    kv_pages: [N, ps, 2 Hkv, d] the pool: keys at combined heads 0::2, values at 1::2.
    kv_lens: i32[S] each sequence's tokens (its queries' last position + 1).
    page_indices: i32[S, Pp] each sequence's pages, in token order.
    cu_q_lens: i32[S + 1] the cumulative query counts (cu_q_lens[0] = 0).
    num_seqs: i32[1] how many of the S sequences are live.
    sm_scale: the factor of the scores (1 / sqrt(d) for standard attention).
    backend: "reference" (pure JAX; scores and softmax in float32, probabilities cast to the
      values' dtype) or "tpu" (JAX's Pallas TPU kernel).
    num_kv_pages_per_block, num_queries_per_block: the TPU kernel's block sizes; None asks its
      tuned table, which reads the default device's TPU version, so give both when compiling for
      a TPU on another host. Unused by the reference.

  Returns:
    [Tq, H, d] in q's dtype; padding rows and queries that see no key are zeros.

  Raises:
    ValueError: an unknown backend.
  """
  if backend == "reference":
    return _reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale)
  if backend == "tpu":
    # pylint: disable-next=import-outside-toplevel
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel
    # Mosaic rejects a float32-precision contraction of bfloat16 operands ("Bad lhs type"),
    # which a global "highest" matmul precision asks for; bf16 products are exact in float32.
    low = q.dtype != jnp.float32 and kv_pages.dtype != jnp.float32
    precision = jax.default_matmul_precision("default") if low else contextlib.nullcontext()
    with precision:
      out = kernel.ragged_paged_attention(
          q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=sm_scale,
          num_kv_pages_per_block=num_kv_pages_per_block,
          num_queries_per_block=num_queries_per_block)
    valid = jnp.arange(q.shape[0], dtype=jnp.int32) < cu_q_lens[num_seqs[0]]
    return jnp.where(valid[:, None, None], out, jnp.zeros((), out.dtype))
  raise ValueError(f"backend {backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")


def _decode_reference(q, kv_pages, kv_lens, page_table, block_pages: int, bucket: int):
  """The reference decode step reading only the pages the sequences hold. Sequences are sorted
  by length and taken `bucket` at a time; each bucket runs an online softmax (Rabe & Staats
  (2021), "Self-attention Does Not Need O(n^2) Memory", arXiv:2112.05682) over blocks of
  `block_pages` pages of its sequences' tables, for as many blocks as its longest sequence fills
  (a loop of that many trips), so a step reads about each sequence's own keys rounded up to its
  bucket's longest, none for empty ones, not the table's width. q [S, Hkv, G, d] (float32
  scores), kv_lens i32[S], page_table i32[S, Pp] -> [S, Hkv, G, d] float32, zeros for an empty
  sequence."""
  seqs = q.shape[0]
  bucket = max(1, min(bucket, seqs))
  pad = -seqs % bucket
  order = jnp.argsort(jnp.pad(kv_lens, (0, pad)))                    # shortest first
  sorted_ = lambda x: jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1))[order]
  q_s, lens_s, table_s = sorted_(q), sorted_(kv_lens), sorted_(page_table)
  outs = [_online_blocks(q_s[i:i + bucket], kv_pages, lens_s[i:i + bucket],
                         table_s[i:i + bucket], block_pages)
          for i in range(0, seqs + pad, bucket)]
  out = jnp.zeros_like(outs[0], shape=(seqs + pad,) + q.shape[1:]).at[order].set(
      jnp.concatenate(outs))
  return out[:seqs]


def _online_blocks(q, kv_pages, kv_lens, page_table, block_pages: int):
  """`_decode_reference` for one bucket of sequences: the online softmax over the page blocks
  its longest sequence fills."""
  seqs, num_kv, group, head_dim = q.shape
  page_size = kv_pages.shape[1]
  width = page_table.shape[1]
  blocks = -(-width // block_pages)
  table = jnp.pad(page_table, ((0, 0), (0, blocks * block_pages - width)))
  span = block_pages * page_size
  trips = pages_needed(jnp.max(kv_lens), span)
  scale = head_dim ** -0.5

  def block(j, carry):
    run_max, run_sum, acc = carry
    ids = jax.lax.dynamic_slice_in_dim(table, j * block_pages, block_pages, axis=1)
    kv = kv_pages[ids].reshape(seqs, span, num_kv, 2, head_dim)      # [S, span, Hkv, 2, d]
    scores = jnp.einsum("skgd,sjkd->skgj", q, kv[:, :, :, 0],
                        preferred_element_type=jnp.float32) * scale  # [S, Hkv, G, span]
    seen = (j * span + jnp.arange(span, dtype=jnp.int32))[None, :] < kv_lens[:, None]
    scores = jnp.where(seen[:, None, None, :], scores, _MASK_VALUE)
    new_max = jnp.maximum(run_max, scores.max(axis=-1))
    probs = jnp.where(seen[:, None, None, :], jnp.exp(scores - new_max[..., None]), 0.0)
    rescale = jnp.exp(run_max - new_max)
    acc = rescale[..., None] * acc + jnp.einsum(
        "skgj,sjkd->skgd", probs.astype(kv.dtype), kv[:, :, :, 1],
        preferred_element_type=jnp.float32)
    return new_max, rescale * run_sum + probs.sum(axis=-1), acc

  stats = jnp.full((seqs, num_kv, group), _MASK_VALUE, jnp.float32)
  init = (stats, jnp.zeros_like(stats), jnp.zeros(q.shape, jnp.float32))
  _, run_sum, acc = jax.lax.fori_loop(0, trips, block, init)
  return acc / jnp.where(run_sum > 0, run_sum, 1.0)[..., None]


def decode_attention(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array,
                     page_table: jax.Array, *, backend: str, dtype,
                     num_kv_pages_per_block=None, num_queries_per_block=None,
                     block_pages: int = 4, bucket: int = 16) -> jax.Array:
  """Attention of one query per sequence (a decode step) over its paged keys and values.

  Args:
    q: [S, Hkv, G, d] each sequence's query, at its last token (position kv_len - 1); it is read
      in the pool's dtype.
    kv_pages: [N, ps, 2 Hkv, d] the pool (`ragged_paged_attention`).
    kv_lens: i32[S] each sequence's tokens, its new one included; 0 marks an empty decode slot.
    page_table: i32[S, Pp] each sequence's pages.
    backend, num_kv_pages_per_block, num_queries_per_block: as `ragged_paged_attention`.
    dtype: the output's dtype.
    block_pages, bucket: the reference's pages a sequence per loop step, and sequences a
      bucket (`_decode_reference`: each bucket of sequences of like length reads the blocks its
      longest fills, not the whole table).

  Returns:
    [S, Hkv, G, d] in `dtype`, with scale 1 / sqrt(d); an empty slot (kv_len 0) gets zeros.
  """
  seqs, num_kv, group, head_dim = q.shape
  if backend == "reference":
    out = _decode_reference(q.astype(kv_pages.dtype), kv_pages, kv_lens.astype(jnp.int32),
                            page_table.astype(jnp.int32), block_pages, bucket).astype(dtype)
    return jnp.where(kv_lens[:, None, None, None] > 0, out, jnp.zeros((), dtype))
  out = ragged_paged_attention(
      q.reshape(seqs, num_kv * group, head_dim).astype(kv_pages.dtype), kv_pages,
      kv_lens.astype(jnp.int32), page_table.astype(jnp.int32),
      jnp.arange(seqs + 1, dtype=jnp.int32), jnp.full((1,), seqs, jnp.int32),
      sm_scale=head_dim ** -0.5, backend=backend,
      num_kv_pages_per_block=num_kv_pages_per_block, num_queries_per_block=num_queries_per_block)
  out = out.reshape(seqs, num_kv, group, head_dim).astype(dtype)
  # The kernel may divide by a zero softmax sum for an empty slot: zeros there on every backend.
  return jnp.where(kv_lens[:, None, None, None] > 0, out, jnp.zeros((), dtype))


def _combined(k: jax.Array, v: jax.Array, dtype) -> jax.Array:
  """[..., Hkv, d] keys and values -> [..., 2 Hkv, d] in `dtype`, keys at 0::2, values at 1::2."""
  kv = jnp.stack([k.astype(dtype), v.astype(dtype)], axis=-2)              # [..., Hkv, 2, d]
  return kv.reshape(*k.shape[:-2], 2 * k.shape[-2], k.shape[-1])


def write(kv_pages: jax.Array, k: jax.Array, v: jax.Array, page_table: jax.Array,
          position: jax.Array, live: jax.Array) -> jax.Array:
  """The pool with each live sequence's new key and value written at its token `position`.

  Args:
    kv_pages: [N, ps, 2 Hkv, d] the pool.
    k, v: [S, Hkv, d] each sequence's new key and value (cast to the pool's dtype).
    page_table: i32[S, Pp] each sequence's pages.
    position: i32[S] the token each sequence writes, below Pp * ps: page
      page_table[s, position[s] // ps], offset position[s] % ps.
    live: bool[S] which sequences write; a dead one writes nothing.

  Returns:
    [N, ps, 2 Hkv, d] the updated pool. Two live sequences must not write the same slot.
  """
  num_pages, page_size = kv_pages.shape[:2]
  seqs = k.shape[0]
  page = page_table[jnp.arange(seqs), position // page_size]
  page = jnp.where(live, page, num_pages)  # out of range: dropped by the scatter
  return kv_pages.at[page, position % page_size].set(_combined(k, v, kv_pages.dtype),
                                                     mode="drop")


def write_prefill(kv_pages: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                  pages: jax.Array) -> jax.Array:
  """The pool with P left-padded prompts' keys and values written to their pages.

  Args:
    kv_pages: [N, ps, 2 Hkv, d] the pool.
    k, v: [P, Tp, Hkv, d] each prompt's keys and values (cast to the pool's dtype).
    mask: bool[P, Tp] the real tokens, a suffix of each row (left padding).
    pages: i32[P, ceil(Tp / ps)] each prompt's pages: its real token j (j < len_p, the row's
      count of real tokens) goes to page pages[p, j // ps] at offset j % ps.

  Returns:
    [N, ps, 2 Hkv, d] the updated pool. A prompt's pages past pages_needed(len_p, ps) are not
    written; the slots of its last page past len_p are zeros (never read: kv_len bounds reads).
  """
  num_pages, page_size = kv_pages.shape[:2]
  prompts, tp = mask.shape
  per_prompt = pages.shape[1]
  lens = jnp.sum(mask.astype(jnp.int32), axis=1)                                    # [P]
  slots = jnp.arange(per_prompt * page_size, dtype=jnp.int32)                   # [Pp * ps]
  # Slot j of prompt p holds its real token j, row index Tp - len_p + j.
  source = jnp.minimum(slots[None, :] + (tp - lens)[:, None], tp - 1)           # [P, Pp * ps]
  kv = _combined(k, v, kv_pages.dtype)                                       # [P, Tp, 2Hkv, d]
  kv = jnp.take_along_axis(kv, source[:, :, None, None], axis=1)      # [P, Pp * ps, 2Hkv, d]
  real = slots[None, :] < lens[:, None]
  kv = jnp.where(real[:, :, None, None], kv, jnp.zeros((), kv.dtype))
  kv = kv.reshape(prompts, per_prompt, page_size, *kv.shape[2:])
  used = jnp.arange(per_prompt, dtype=jnp.int32)[None, :] < pages_needed(lens, page_size)[:, None]
  target = jnp.where(used, pages, num_pages)  # out of range: dropped by the scatter
  return kv_pages.at[target].set(kv, mode="drop")
