"""Post-rollout dynamic filtering (DAPO-style dynamic sampling).

A separate stage from the curricula, with its own small interface. The trainer over-samples: it
asks the curriculum for `oversampled_size(P, factor)` prompts, rolls them all out, then

  result = dynamic_filter(feedback, mode="all_equal")            # FilterResult(keep, num_kept)
  indices, slot_valid = compact_indices(result.keep, P, key)     # <= P kept groups, drawn at random
  batch = gather_groups(feedback, indices, slot_valid)            # static shape [P, G]

Groups are judged on raw correctness (`Feedback.correct`, restricted to `Feedback.valid`), never on
the shaped reward: a format bonus makes the rewards of a group differ although every completion is
wrong, and such a group carries no correctness signal.

When more than P groups survive, a uniformly random P of them are kept (not the first P: batches
may be ordered). When fewer than P groups survive, the missing slots are filled with MASKED groups
(slot_valid False, and `gather_groups` clears their `valid` rows), never with silent duplicates.

Reference: Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476 (dynamic sampling).
"""

import math
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.types import Feedback

FILTER_MODES = ("all_equal", "accuracy_band")


class FilterResult(NamedTuple):
  """Which groups of a batch to keep."""
  keep: jax.Array      # bool[P] group p is kept
  num_kept: jax.Array  # i32[] number of kept groups


def oversampled_size(batch_size: int, factor: float = 2.0) -> int:
  """Prompts to roll out so that about `batch_size` survive filtering: ceil(factor * batch_size).

  Raises:
    ValueError: if batch_size < 1 or factor < 1.
  """
  if int(batch_size) < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not factor >= 1.0:
    raise ValueError(f"factor must be >= 1, got {factor}")
  return int(math.ceil(factor * batch_size - 1e-9))


def dynamic_filter(feedback: Feedback, *, mode: str = "all_equal", lo: Optional[float] = None,
                   hi: Optional[float] = None) -> FilterResult:
  """Keeps the groups that carry a correctness signal.

  With n[p] valid completions of which s[p] are correct and accuracy acc[p] = s[p] / n[p]:
    mode="all_equal":     keep[p] = 0 < s[p] < n[p]           (drop all-right and all-wrong groups)
    mode="accuracy_band": keep[p] = n[p] > 0 and lo <= acc[p] <= hi   (closed band)
  A group with no valid completion is never kept.

  Args:
    feedback: correct bool[P, G] and optional valid bool[P, G] are read; rewards are ignored.
    mode: "all_equal" (default) or "accuracy_band"; a Python string (static under jit).
    lo, hi: the accuracy band, required for "accuracy_band" with 0 <= lo <= hi <= 1.
  Returns:
    FilterResult(keep bool[P], num_kept i32[]).
  Raises:
    ValueError: on an unknown mode, or a missing / malformed band.
  """
  if mode not in FILTER_MODES:
    raise ValueError(f"mode must be one of {FILTER_MODES}, got {mode!r}")
  n, s = prompt_stats.group_counts(feedback)
  if mode == "all_equal":
    if lo is not None or hi is not None:
      raise ValueError("lo and hi apply only to mode='accuracy_band'")
    keep = (s > 0) & (s < n)
  else:
    if lo is None or hi is None:
      raise ValueError("mode='accuracy_band' needs both lo and hi")
    if not 0.0 <= lo <= hi <= 1.0:
      raise ValueError(f"need 0 <= lo <= hi <= 1, got lo={lo}, hi={hi}")
    # Compare counts instead of a rounded float: lo * n <= s <= hi * n.
    nf = n.astype(jnp.float32)
    sf = s.astype(jnp.float32)
    keep = (n > 0) & (sf >= lo * nf) & (sf <= hi * nf)
  return FilterResult(keep=keep, num_kept=keep.sum(dtype=jnp.int32))


def compact_indices(keep: jax.Array, batch_size: int,
                    key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Static-shape gather indices of a uniformly random subset of the kept groups.

  With m = num_kept and P = batch_size, slots j < min(m, P) hold distinct kept groups; when m > P
  they are a uniformly random P-subset of the m kept groups (every kept group is chosen with
  probability P / m), in random slot order. Batch order is not used: curricula may order their
  batches (replayed prompts first, prompts sorted by score), and the first P kept groups would
  then favour the front of the batch. The other slots are padding: `slot_valid` is False there
  and the index points at group 0 (any in-range index would do; the slot must be masked by the
  consumer, see `gather_groups`).

  Implementation: a uniform random permutation of the Po groups, then a stable sort of it by
  `not keep`, so the kept groups come first in random order; the first P are taken.

  Args:
    keep: bool[Po] kept groups of the over-sampled batch (Po >= batch_size).
    batch_size: P, the number of slots of the training batch (static).
    key: PRNG key that draws the subset.
  Returns:
    (indices i32[P], slot_valid bool[P]).
  Raises:
    ValueError: if keep is not 1-D or has fewer than batch_size rows.
  """
  keep = jnp.asarray(keep, bool)
  if keep.ndim != 1:
    raise ValueError(f"keep must be 1-D, got shape {keep.shape}")
  if keep.shape[0] < batch_size:
    raise ValueError(f"the over-sampled batch ({keep.shape[0]} groups) is smaller than "
                     f"batch_size={batch_size}")
  shuffled = jax.random.permutation(key, keep.shape[0])
  order = shuffled[jnp.argsort(~keep[shuffled], stable=True)][:batch_size].astype(jnp.int32)
  slot_valid = jnp.arange(batch_size) < keep.sum()
  return jnp.where(slot_valid, order, 0), slot_valid


def gather_groups(feedback: Feedback, indices: jax.Array, slot_valid: jax.Array) -> Feedback:
  """Rows `indices` of every field; padded slots get `valid` all False (masked groups).

  Args:
    feedback: an over-sampled batch of Po groups.
    indices: i32[P] from `compact_indices`.
    slot_valid: bool[P] from `compact_indices`.
  Returns:
    Feedback of P groups whose `valid` is `feedback.valid[indices] & slot_valid[:, None]`.
  """
  chex.assert_rank([indices, slot_valid], 1)
  valid = prompt_stats.valid_mask(feedback)[indices] & slot_valid[:, None]
  return Feedback(
      prompt_ids=feedback.prompt_ids[indices],
      arms=feedback.arms[indices],
      rewards=feedback.rewards[indices],
      correct=feedback.correct[indices],
      advantages=feedback.advantages[indices],
      valid=valid,
  )
