"""Grouped-query causal attention over key/value slots, as functions of arrays.

Queries sit at slots of the same axis as the keys (a cache's S slots, or the T tokens themselves
without a cache); query slot t attends to key slot s iff s <= t and the key is valid:

  out[b, t, k, g] = sum_s softmax_s(q[b, t, k, g] . keys[b, s, k] / sqrt(d) | mask[b, t, s])
                    * values[b, s, k]

Grouped-query attention (Ainslie et al. (2023), "GQA: Training Generalized Multi-Query Transformer
Models from Multi-Head Checkpoints", arXiv:2305.13245): each of the Hkv key/value heads serves G
query heads. `transformer.Attention` projects and rotates q, k and v, then calls these; a decode
step (one query per row) uses `kv_cache.one_query_attention`, the same numbers in the cache's
slot-major order.

Shapes: B rows, T queries, S key slots, Hkv key/value heads, G query heads per key/value head,
d = head_dim.
"""

import jax
import jax.numpy as jnp


def backend(name: str) -> str:
  """The attention kernels `ModelConfig.attention` names: `reference` (pure JAX) or `tpu` (JAX's
  TPU kernels); `auto` is `tpu` when JAX's default backend is a TPU, else `reference`."""
  if name == "auto":
    return "tpu" if jax.default_backend() == "tpu" else "reference"
  return name


def many_query_backend(name: str, block: int, q_offset, rows_left: int = 0) -> str:
  """How T > 1 queries attend (`blockwise_attention.attend`) under ModelConfig.attention =
  `name` and attention_block = `block`: the reference holds the scores whole (`dense`) with
  block 0 and walks key blocks (`blockwise`) otherwise. The TPU backend is the splash kernel
  when the first query's slot `q_offset` is a Python int (the learn step, a whole prompt's
  prefill) and the rows split evenly over a mesh's devices (`rows_left`: rows % devices), else
  XLA's blockwise attention: a chunked prefill's chunks (a traced offset; the kernel's mask is
  built before tracing) and the learn step's pass over a few groups' prompts (fewer rows than
  devices; the kernel runs per device)."""
  if backend(name) == "tpu":
    return "splash" if isinstance(q_offset, int) and not rows_left else "blockwise"
  return "blockwise" if block else "dense"


def causal_slot_mask(key_mask: jax.Array, q_slots: jax.Array, num_slots: int) -> jax.Array:
  """bool[B, T, S]: query slot t sees key slot s iff s <= t and the key is valid.

  Args:
    key_mask: bool[B, S] validity of each key slot, or bool[B, T, S] per query.
    q_slots: i32[T] the slot of each query.
    num_slots: S.
  """
  causal = q_slots[:, None] >= jnp.arange(num_slots, dtype=jnp.int32)[None, :]
  if key_mask.ndim == 2:
    return causal[None, :, :] & key_mask[:, None, :]
  return causal[None, :, :] & key_mask


def grouped_query_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
                            dtype) -> jax.Array:
  """Attention of T queries per row over S key/value slots (formula in the module docstring).

  Args:
    q: [B, T, Hkv, G, d] queries.
    keys, values: [B, S, Hkv, d].
    mask: bool[B, T, S] (`causal_slot_mask`).
    dtype: the activation dtype; scores and the softmax are float32, probabilities and the output
      in `dtype`.

  Returns:
    [B, T, Hkv, G, d] in `dtype`. A query with no valid key gets a finite (unused) output.
  """
  scores = jnp.einsum("btkgd,bskd->bkgts", q, keys.astype(q.dtype),
                      preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)
  # A finite floor, not -inf: a padding query with no valid key gets a finite (unused) output.
  scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  return jnp.einsum("bkgts,bskd->btkgd", probs, values.astype(dtype))
