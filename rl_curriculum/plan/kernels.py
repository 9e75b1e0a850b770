"""What JAX's TPU attention kernels cost, counted from their shapes.

XLA sees a Pallas kernel as one custom call and reads no cost from it, so a roofline that trusts
the compiler's counts alone (`roofline.program_cost`) would leave attention out of every program
that runs a kernel, and its bound could fall below the model's own work. This module counts the
kernels the model calls, recognised by the custom call's name (Pallas names it after the kernel
function), from the shapes of its operands:

  ragged_paged_attention     JAX's ragged paged attention (decode and ragged prefill over pages):
                             operands kv_lens i32[S], page_indices i32[S, Pp], ..., q [Tq, H, d],
                             kv_pages [Np, ps, 2 Hkv, d]. Each of the Tq queries attends over K
                             keys of its sequence, each sequence's K keys and values read once:
                               FLOPs  4 Tq H d K          (scores, then probabilities x values)
                               bytes  q + out + S K 2 Hkv d itemsize + the page table
                             K is the program's `kv_tokens` when it gives one (the planner: a
                             decode slot's mean context), else every token its table lists
                             (Pp ps). A group's shared prompt pages are read by each sequence
                             that lists them, as the kernel fetches pages per sequence.
  splash_mha_fwd             splash attention's forward, dq and dkv kernels (one call per row):
  splash_mha_dq              operands block tables s8[1, nq, nk], q [H, T, d], k and v
  splash_mha_dkv             [Hkv, S, d], ...; queries sit at the last T of the S key slots
                             (causal). The kernels visit every (query block, key block) pair
                             that holds a visible pair; with C the query-key pairs of those
                             blocks,
                               FLOPs  fwd 4 H d C (QK^T, PV); dq 6 H d C (QK^T, dO V^T, dS K);
                                      dkv 8 H d C (QK^T, dO V^T, P^T dO, dS^T Q)
                               bytes  every operand once and every output once, and what each
                                      block of the grid streams: keys and values once per query
                                      block they meet (fwd, dq), queries and output gradients
                                      once per key block they meet (dkv), per query head.

The blockwise reference attention is plain JAX (a scan over key blocks) and needs no entry here:
its matmuls are counted where they run. A TPU custom call this module does not know is counted as
nothing and reported (`roofline.Cost.unknown_kernels`), so a bound that misses a kernel says so.

References: Dao et al. (2022), "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", arXiv:2205.14135 (the forward and backward passes' matmuls and reads); Kwon et al.
(2023), "Efficient Memory Management for Large Language Model Serving with PagedAttention",
arXiv:2309.06180 (attention over pages).
"""

import math
from typing import Optional


def causal_block_pairs(t: int, s: int, block_q: int, block_kv: int) -> int:
  """Query-key pairs of the blocks a causal kernel visits: queries at the last t of s key slots
  (query i at slot s - t + i sees slots <= s - t + i), split into blocks of block_q queries and
  block_kv keys; a block pair is visited when any of its pairs is visible, and counts whole."""
  offset, nk = s - t, -(-s // block_kv)
  total = 0
  for start in range(0, t, block_q):
    rows = min(block_q, t - start)
    last = offset + start + rows - 1                 # the block's last query's slot
    total += rows * min(s, min(nk, last // block_kv + 1) * block_kv)
  return total


def ragged_paged_attention(operands: list, outputs: list, kv_tokens: Optional[float]) -> tuple:
  """(FLOPs, bytes) of one ragged paged attention call (module docstring).

  Args:
    operands, outputs: the call's operand and output shapes as (dims, itemsize) pairs, in the
      kernel's order.
    kv_tokens: keys a sequence attends over on average (None, or more than its page table
      holds: the table's whole width).
  """
  (seqs,), _ = operands[0]
  (_, pages_per_seq), table_item = operands[1]
  q_dims, q_item = operands[5]
  (_, page_size, combined, head_dim), kv_item = operands[6]
  tokens, heads = q_dims[0], q_dims[1]
  k = float(pages_per_seq * page_size)                     # the table's whole width
  k = min(k, float(kv_tokens)) if kv_tokens else k
  flops = 4.0 * tokens * heads * head_dim * k
  read = (tokens * heads * head_dim * q_item + seqs * k * combined * head_dim * kv_item
          + seqs * pages_per_seq * table_item)
  return flops, read + sum(_size(dims) * item for dims, item in outputs)


def splash(kind: str, operands: list, outputs: list) -> tuple:
  """(FLOPs, bytes) of one splash attention kernel call, `kind` "fwd", "dq" or "dkv" (module
  docstring). operands and outputs: (dims, itemsize) pairs in the kernel's order."""
  (_, nq, nk), _ = operands[0]
  (heads, t, head_dim), q_item = operands[2]
  (_, s, _), kv_item = operands[3]
  pairs = causal_block_pairs(t, s, t // nq, s // nk)
  flops = {"fwd": 4, "dq": 6, "dkv": 8}[kind] * heads * head_dim * float(pairs)
  streamed_operands = (2, 8) if kind == "dkv" else (3, 4)   # (q, dO) or (k, v)
  once = sum(_size(dims) * item for i, (dims, item) in enumerate(operands)
             if i not in streamed_operands)
  once += sum(_size(dims) * item for dims, item in outputs)
  if kind == "dkv":   # queries and output gradients streamed past each key block
    streamed = 2 * heads * (pairs / (s // nk)) * head_dim * q_item
  else:               # keys and values streamed past each query block, for every query head
    streamed = 2 * heads * (pairs / (t // nq)) * head_dim * kv_item
  return flops, once + streamed


def _size(dims: list) -> int:
  return math.prod(dims)


def kind_of(name: str) -> Optional[str]:
  """The kernel a custom call's instruction name says it is ("ragged_paged_attention",
  "fwd", "dq", "dkv"), or None."""
  if name.startswith("ragged_paged_attention"):
    return "ragged_paged_attention"
  for kind in ("fwd", "dq", "dkv"):
    if name.startswith(f"splash_mha_{kind}"):
      return kind
  return None


def cost(name: str, operands: list, outputs: list,
         kv_tokens: Optional[float] = None) -> Optional[tuple]:
  """(FLOPs, bytes) of the kernel call named `name` (the HLO instruction's name) with these
  operand and output shapes ((dims, itemsize) pairs), or None for a kernel not known here."""
  kind = kind_of(name)
  if kind is None:
    return None
  if kind == "ragged_paged_attention":
    return ragged_paged_attention(operands, outputs, kv_tokens)
  return splash(kind, operands, outputs)
