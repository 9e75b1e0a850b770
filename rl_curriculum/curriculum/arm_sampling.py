"""Two-stage sampling for category-level curricula: arms i.i.d., then prompts without replacement.

A category-level curriculum produces a distribution `pi: f32[K]` over arms. A step's P prompt slots
are filled in two stages:

  1. each slot draws an arm i.i.d. from pi;
  2. each slot takes the next prompt of its arm's current random permutation; when an arm's
     permutation is used up, the arm is reshuffled and its cursor starts again.

The first permutation comes from a sort of random keys; reshuffles apply keyed pseudo-random
permutations (a Feistel network with cycle walking) within the exhausted arms' segments, which
costs O(N) without a sort: with many arms some arm runs out on most steps, and a sort of the pool
then dominated the cost of `select`.

So within an arm no prompt repeats until every prompt of that arm has been handed out once (one
"epoch" of that arm). The state keeps one flat permutation of the pool, grouped by arm in ascending
arm order and shuffled within each arm's segment, plus one cursor per arm.

A step can finish one epoch of an arm and start the next. The next epoch is therefore built as a
random order of the prompts this step did not take from the old epoch (old positions [0, cursor)),
followed by a random order of the prompts it did take (old positions [cursor, size)); the step's
remaining slots read the new epoch from its start, so they never meet a prompt the same step
already holds.

Limit, exactly: within one call (one step) an arm hands out distinct prompts whenever the call
asks it for count <= size prompts. Only when count > size does a prompt repeat within the call:
the slots beyond the first epoch's remainder read the whole new epoch, and past it the same new
epoch is read again from its start. Every prompt of an arm still appears exactly once per epoch
(each epoch is a permutation of the arm), whatever the counts.

Everything here is pure and jittable; `ArmSamplerState` is a pytree of arrays that Orbax can save.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_curriculum.types import Selection

__all__ = [
    "ArmSamplerState",
    "init_arm_sampler",
    "draw_arms",
    "take_prompts",
    "sample_selection",
    "mask_empty_arms",
]


class ArmSamplerState(NamedTuple):
  """Per-arm permutations of the pool and the cursors into them."""
  perm: jax.Array      # i32[N] prompt ids grouped by arm (ascending), shuffled within each arm
  arms: jax.Array      # i32[N] arm of the prompt at each position of `perm` (non-decreasing)
  offsets: jax.Array   # i32[K] position in `perm` where arm k's segment starts
  sizes: jax.Array     # i32[K] number of prompts in arm k
  cursor: jax.Array    # i32[K] prompts of arm k's current permutation already handed out


_FEISTEL_ROUNDS = 6


def _hash32(x: jax.Array) -> jax.Array:
  """A 32-bit integer mixing function (xor-shift-multiply finaliser); u32 -> u32."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _keyed_permutation(x: jax.Array, n: jax.Array, round_keys: jax.Array,
                       shift: jax.Array) -> jax.Array:
  """Image of x in [0, n) under a keyed pseudo-random permutation of [0, n), elementwise.

  A balanced Feistel network on 2h bits (4^h >= n) is a bijection of [0, 4^h); re-applying it
  until the value falls in [0, n) ("cycle walking") restricts it to a bijection of [0, n). A
  random rotation, (y + shift) mod n, follows: it makes every element equally likely to land on
  every position (small Feistel networks alone are visibly non-uniform). Costs O(len(x)) per walk
  step and needs no sort. The result is a pseudo-random permutation, not a uniform draw from all
  n! orders; every element still appears exactly once.

  Args:
    x: u32[M] inputs, each < its n.
    n: u32[M] domain size of each input (>= 1).
    round_keys: u32[M, R] Feistel round keys of each input's permutation.
    shift: u32[M] rotation of each input's permutation (any value; reduced mod n).

  Returns:
    u32[M] outputs, each < its n.
  """
  bits = jnp.uint32(32) - jax.lax.clz(jnp.maximum(n, 2) - jnp.uint32(1))
  h = (bits + jnp.uint32(1)) // jnp.uint32(2)
  mask = (jnp.uint32(1) << h) - jnp.uint32(1)

  def feistel(v):
    left, right = v >> h, v & mask
    for r in range(_FEISTEL_ROUNDS):
      left, right = right, left ^ (_hash32(right ^ round_keys[:, r]) & mask)
    return (left << h) | right

  y = feistel(x)
  y = jax.lax.while_loop(lambda y: jnp.any(y >= n),
                         lambda y: jnp.where(y >= n, feistel(y), y), y)
  return (y + shift % n) % n


def _shuffle_arms(state: ArmSamplerState, which: jax.Array, key: jax.Array) -> jax.Array:
  """Returns `state.perm` with the segments of the arms in `which: bool[K]` freshly permuted.

  With c = cursor[k], s = sizes[k] and pi a keyed permutation of [0, s), arm k's new segment is
  the random order  old[pi(0)], ..., old[pi(s - 1)]  stably partitioned by pi(i) < c: the prompts
  at old positions [0, c) first, then those at [c, s), each part in the order pi gives it (for a
  uniform pi, two independent uniform orders). The prompts at [c, s) are the ones the current call
  takes from the old epoch, so they close the next one (see the module docstring).

  One permutation of the whole segment, not one per part: the Feistel domain then has the arm's
  size, as before, whereas parts of arbitrary sizes need many more cycle-walking passes over all N
  positions. The partition is a cumulative sum and one scatter. Segments stay in place; other
  arms are untouched; each arm has its own round keys. Costs O(N) without a sort.
  """
  num_arms = state.sizes.shape[0]
  bits = jax.random.bits(key, (num_arms, _FEISTEL_ROUNDS + 1), jnp.uint32)
  pos = jnp.arange(state.perm.shape[0], dtype=jnp.int32)
  start = state.offsets[state.arms]
  within = (pos - start).astype(jnp.uint32)
  n = jnp.maximum(state.sizes[state.arms], 1).astype(jnp.uint32)  # domains must hold >= 1 value
  per_pos = bits[state.arms]
  src = _keyed_permutation(within, n, per_pos[:, :-1], per_pos[:, -1]).astype(jnp.int32)
  cursor = state.cursor[state.arms]
  head = src < cursor                                    # bool[N] drawn from old [0, c)
  head_i = head.astype(jnp.int32)
  before = jnp.cumsum(head_i) - head_i                   # heads at earlier flat positions
  rank_head = before - before[start]                     # heads earlier in the same segment
  rank_tail = pos - start - rank_head                    # tails earlier in the same segment
  dest = start + jnp.where(head, rank_head, cursor + rank_tail)
  shuffled = jnp.zeros_like(state.perm).at[dest].set(state.perm[start + src],
                                                     unique_indices=True)
  return jnp.where(which[state.arms], shuffled, state.perm)


def init_arm_sampler(pool_arms: jax.Array, num_arms: int, key: jax.Array) -> ArmSamplerState:
  """Builds the sampler for a pool whose prompt i belongs to arm `pool_arms[i]`.

  Args:
    pool_arms: i32[N] arm of each prompt, in [0, K).
    num_arms: K (static).
    key: PRNG key for the first permutation of every arm.

  Returns:
    ArmSamplerState with all cursors at 0.
  """
  pool_arms = jnp.asarray(pool_arms, jnp.int32)
  u = jax.random.uniform(key, pool_arms.shape)
  perm = jnp.lexsort((u, pool_arms)).astype(jnp.int32)
  arms_at = pool_arms[perm]
  sizes = jnp.bincount(pool_arms, length=num_arms).astype(jnp.int32)
  offsets = (jnp.cumsum(sizes) - sizes).astype(jnp.int32)
  return ArmSamplerState(perm=perm, arms=arms_at, offsets=offsets, sizes=sizes,
                         cursor=jnp.zeros((num_arms,), jnp.int32))


def mask_empty_arms(probs: jax.Array, sizes: jax.Array) -> jax.Array:
  """Zeroes the probability of arms without prompts and renormalises.

  Args:
    probs: f32[K] probabilities (or non-negative weights).
    sizes: i32[K] prompts per arm.

  Returns:
    f32[K] summing to 1 over the non-empty arms (uniform over them if all weights vanish).
  """
  nonempty = sizes > 0
  w = jnp.where(nonempty, probs, 0.0)
  total = jnp.sum(w)
  uniform = nonempty.astype(probs.dtype) / jnp.maximum(jnp.sum(nonempty), 1)
  return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), uniform)


def draw_arms(key: jax.Array, probs: jax.Array, batch_size: int) -> jax.Array:
  """Draws P arms i.i.d. from `probs: f32[K]` (weights, need not be normalised); returns i32[P].

  Inverse-CDF sampling: one uniform per slot (a Gumbel-max draw would need K per slot). Arms with
  probability 0 are never drawn.
  """
  cdf = jnp.cumsum(probs)
  u = jax.random.uniform(key, (batch_size,), dtype=cdf.dtype) * cdf[-1]
  idx = jnp.searchsorted(cdf, u, side="right")
  # Rounding can put u on cdf[-1]; fall back to the last arm with positive probability.
  last = probs.shape[0] - 1 - jnp.argmax(probs[::-1] > 0)
  return jnp.minimum(idx, last).astype(jnp.int32)


def take_prompts(state: ArmSamplerState, arms: jax.Array,
                 key: jax.Array) -> tuple[jax.Array, ArmSamplerState]:
  """Hands out, for each slot, the next unused prompt of its arm.

  Slot p gets position `cursor[a] + rank_p` of arm a's permutation, where rank_p counts the
  earlier slots of the same arm in this call. Positions t >= size come from the arm's next
  permutation, at position (t - size) mod size, which then replaces the old one (reshuffle on
  exhaustion). The next permutation puts the prompts this call takes from the old one last
  (`_shuffle_arms`), so an arm asked for count <= size prompts hands out distinct prompts.

  Args:
    state: the sampler.
    arms: i32[P] arm of each slot; every arm used must hold at least one prompt.
    key: PRNG key used only when some arm is exhausted.

  Returns:
    (prompt_ids i32[P], new state).
  """
  num_arms = state.sizes.shape[0]
  onehot = (arms[:, None] == jnp.arange(num_arms)[None, :]).astype(jnp.int32)  # i32[P, K]
  count = jnp.sum(onehot, axis=0)                                                # i32[K]
  rank = jnp.take_along_axis(jnp.cumsum(onehot, axis=0) - 1, arms[:, None], axis=1)[:, 0]
  size = jnp.maximum(state.sizes, 1)
  end = state.cursor + count                     # i32[K] cursor after this call, unwrapped
  need = end > state.sizes                       # bool[K] arm runs out during this call

  perm = jax.lax.cond(jnp.any(need), lambda: _shuffle_arms(state, need, key),
                      lambda: state.perm)

  t = state.cursor[arms] + rank                  # i32[P] position within the arm, unwrapped
  size_p = size[arms]
  first = t < size_p
  pos_old = state.offsets[arms] + jnp.minimum(t, size_p - 1)
  pos_new = state.offsets[arms] + jnp.mod(t - size_p, size_p)
  ids = jnp.where(first, state.perm[pos_old], perm[pos_new])

  wrapped = jnp.mod(end - state.sizes - 1, size) + 1  # in [1, size] after a reshuffle
  cursor = jnp.where(need, wrapped, end).astype(jnp.int32)
  return ids.astype(jnp.int32), state._replace(perm=perm, cursor=cursor)


def sample_selection(state: ArmSamplerState, probs: jax.Array, key: jax.Array,
                     batch_size: int) -> tuple[Selection, ArmSamplerState]:
  """Draws P arms i.i.d. from `probs: f32[K]`, then prompts without replacement within each arm.

  Args:
    state: the sampler.
    probs: f32[K] arm probabilities; arms without prompts must have probability 0 (see
      `mask_empty_arms`).
    key: PRNG key; split into the arm draw and the reshuffle.
    batch_size: P (static).

  Returns:
    (Selection(prompt_ids i32[P], arms i32[P]), new sampler state).
  """
  k_arms, k_shuffle = jax.random.split(key)
  arms = draw_arms(k_arms, probs, batch_size)
  ids, state = take_prompts(state, arms, k_shuffle)
  return Selection(prompt_ids=ids, arms=arms), state
