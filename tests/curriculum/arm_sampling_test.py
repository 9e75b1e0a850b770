"""Tests for rl_curriculum/curriculum/arm_sampling.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum import arm_sampling

SIZES = (3, 5, 2, 6)
POOL_ARMS = np.repeat(np.arange(len(SIZES)), SIZES).astype(np.int32)
# Shuffle the pool so that prompt ids are not grouped by arm.
_ORDER = np.random.default_rng(0).permutation(POOL_ARMS.size)
POOL_ARMS = POOL_ARMS[_ORDER]


def _members(arm):
  return sorted(np.flatnonzero(POOL_ARMS == arm).tolist())


def _run(num_steps, batch_size, probs, jit=True, seed=0):
  """Returns per-step (arms, ids) lists and the final state."""
  state = arm_sampling.init_arm_sampler(jnp.asarray(POOL_ARMS), len(SIZES), jax.random.key(seed))
  fn = arm_sampling.sample_selection
  if jit:
    fn = jax.jit(fn, static_argnums=3)
  steps = []
  for t in range(num_steps):
    sel, state = fn(state, jnp.asarray(probs, jnp.float32), jax.random.key(1000 + t), batch_size)
    steps.append((np.asarray(sel.arms), np.asarray(sel.prompt_ids)))
  return steps, state


def test_init_groups_pool_by_arm():
  state = arm_sampling.init_arm_sampler(jnp.asarray(POOL_ARMS), 4, jax.random.key(0))
  np.testing.assert_array_equal(state.sizes, SIZES)
  np.testing.assert_array_equal(state.offsets, [0, 3, 8, 10])
  np.testing.assert_array_equal(state.cursor, [0, 0, 0, 0])
  perm = np.asarray(state.perm)
  assert sorted(perm.tolist()) == list(range(POOL_ARMS.size))
  np.testing.assert_array_equal(POOL_ARMS[perm], np.asarray(state.arms))
  assert np.all(np.diff(np.asarray(state.arms)) >= 0)


@pytest.mark.parametrize("batch_size", [1, 3, 7])
def test_without_replacement_until_exhausted_then_reshuffle(batch_size):
  """Each arm's stream of prompts splits into consecutive blocks that are permutations of it."""
  steps, _ = _run(40, batch_size, [0.25, 0.25, 0.25, 0.25])
  streams = {k: [] for k in range(4)}
  for arms, ids in steps:
    for a, i in zip(arms, ids):  # slot order is the order of hand-out within a step
      assert POOL_ARMS[i] == a, "prompt does not belong to its slot's arm"
      streams[int(a)].append(int(i))
  for arm, stream in streams.items():
    size = SIZES[arm]
    full = len(stream) // size
    blocks = [stream[b * size:(b + 1) * size] for b in range(full)]
    for block in blocks:
      assert sorted(block) == _members(arm)
    tail = stream[full * size:]
    assert len(set(tail)) == len(tail)
    if size >= 5 and len(blocks) >= 3:
      # Reshuffling happens: later epochs are not all copies of the first one (for arms of 5 or
      # more prompts a chance repeat of one order has probability <= 1/120 per epoch).
      assert any(block != blocks[0] for block in blocks[1:])


_take = jax.jit(arm_sampling.take_prompts)


def test_cursor_and_wrap_hand_checked():
  """One arm of 3 prompts, 2 slots a step: cursor 2, then wraps to 1 with a new permutation."""
  arms = jnp.zeros((3,), jnp.int32)
  state = arm_sampling.init_arm_sampler(arms, 1, jax.random.key(0))
  first_perm = np.asarray(state.perm)
  ids1, state = _take(state, jnp.zeros((2,), jnp.int32), jax.random.key(1))
  np.testing.assert_array_equal(ids1, first_perm[:2])
  assert int(state.cursor[0]) == 2
  ids2, state = _take(state, jnp.zeros((2,), jnp.int32), jax.random.key(2))
  assert int(ids2[0]) == first_perm[2]
  assert int(ids2[1]) == int(state.perm[0])
  assert int(state.cursor[0]) == 1
  assert sorted(np.asarray(state.perm).tolist()) == [0, 1, 2]
  # The new epoch starts with the prompts not taken in this call and ends with first_perm[2].
  assert sorted(np.asarray(state.perm)[:2].tolist()) == sorted(first_perm[:2].tolist())
  assert int(state.perm[2]) == first_perm[2]


def test_more_slots_than_prompts_in_one_step():
  arms = jnp.zeros((3,), jnp.int32)
  state = arm_sampling.init_arm_sampler(arms, 1, jax.random.key(0))
  ids, state = _take(state, jnp.zeros((5,), jnp.int32), jax.random.key(1))
  ids = np.asarray(ids)
  assert sorted(ids[:3].tolist()) == [0, 1, 2]
  np.testing.assert_array_equal(ids[3:], np.asarray(state.perm)[:2])
  assert int(state.cursor[0]) == 2
  # From cursor 2, five slots: the old epoch's last prompt, the whole next epoch, then that epoch
  # read again from its start (count > size: repeats cannot be avoided).
  old = np.asarray(state.perm)
  ids, state = _take(state, jnp.zeros((5,), jnp.int32), jax.random.key(2))
  ids, new = np.asarray(ids), np.asarray(state.perm)
  assert sorted(new.tolist()) == [0, 1, 2]
  assert int(new[2]) == old[2] and sorted(new[:2].tolist()) == sorted(old[:2].tolist())
  np.testing.assert_array_equal(ids, [old[2], new[0], new[1], new[2], new[0]])
  assert int(state.cursor[0]) == 1


@jax.jit
def _take_crossing(key, cursor, slot_arms):
  """Arm 0 and arm 1 of S = len(slot_arms) prompts each (ids 0..S-1 and S..2S-1), random first
  permutations, arm 0's cursor set, then one call with slots of arms `slot_arms`.

  Arm 1 (cursor 0) takes the slots arm 0 does not, so one compiled program serves every count of
  arm 0. Returns (ids i32[S], new perm i32[2S], new cursor i32[2]).
  """
  size = slot_arms.shape[0]
  k_init, k_take = jax.random.split(key)
  pool = jnp.repeat(jnp.arange(2, dtype=jnp.int32), size, total_repeat_length=2 * size)
  state = arm_sampling.init_arm_sampler(pool, 2, k_init)
  state = state._replace(cursor=jnp.stack([cursor, 0]).astype(jnp.int32))
  ids, state = arm_sampling.take_prompts(state, slot_arms, k_take)
  return ids, state.perm, state.cursor


@pytest.mark.parametrize("size", [2, 5, 7])
def test_no_repeat_within_a_call_that_crosses_the_epoch_boundary(size):
  """count <= size: a call that reshuffles the arm hands out distinct prompts, for every cursor
  (cursor == size included) and count, over 200 keys; the new epoch is a permutation of the arm
  that ends with the prompts this call took from the old one."""
  take = jax.vmap(_take_crossing, in_axes=(0, None, None))
  keys = jax.random.split(jax.random.key(size), 200)
  for count in range(1, size + 1):
    slot_arms = jnp.asarray([0] * count + [1] * (size - count), jnp.int32)
    for cursor in range(size - count + 1, size + 1):  # cursor + count > size: the call crosses
      ids, perm, new_cursor = (np.asarray(x) for x in take(keys, jnp.int32(cursor), slot_arms))
      ids, seg = ids[:, :count], perm[:, :size]        # arm 0's slots and segment
      repeats = [i for i, row in enumerate(ids) if len(set(row.tolist())) < count]
      assert not repeats, (f"size {size}, cursor {cursor}, count {count}: repeated ids "
                           f"{ids[repeats[0]].tolist()} (key {repeats[0]})")
      np.testing.assert_array_equal(new_cursor[:, 0], cursor + count - size)
      for row, p in zip(ids, seg):
        assert sorted(p.tolist()) == list(range(size))
        # The old tail [cursor, size) went out first in this call and ends the new epoch.
        assert set(p[cursor:].tolist()) == set(row[:size - cursor].tolist())


def test_reshuffle_orders_each_part_at_random():
  """Arm of 6 with cursor 2: the next epoch is old[0:2] then old[2:6], each part in random order.

  Over 6000 keys all 2! 4! = 48 such orders occur, and each prompt lands on each position of its
  part about equally often (1/2 and 1/4; bound 0.04 is over 5 binomial sd)."""
  size, cursor = 6, 2
  pool = jnp.zeros((size,), jnp.int32)
  state = arm_sampling.init_arm_sampler(pool, 1, jax.random.key(0))
  state = state._replace(cursor=jnp.array([cursor], jnp.int32))
  old = np.asarray(state.perm)
  shuffle = jax.jit(jax.vmap(lambda k: arm_sampling._shuffle_arms(state, jnp.array([True]), k)))
  new = np.asarray(shuffle(jax.random.split(jax.random.key(1), 6000)))
  assert len({tuple(row) for row in new}) == 48
  where = np.argsort(old)[new]  # old position of the prompt at each new slot
  for j in range(size):
    part = range(cursor) if j < cursor else range(cursor, size)
    share = np.bincount(where[:, j], minlength=size) / new.shape[0]
    np.testing.assert_allclose(share[list(part)], 1 / len(part), atol=0.04)
    assert share[[i for i in range(size) if i not in part]].sum() == 0


def test_no_repeat_within_a_call_over_several_arms():
  """Four arms with random cursors, 10 slots with at most `size` slots per arm: distinct ids in
  every call, and every arm's later stream still splits into permutations of the arm."""
  rng = np.random.default_rng(0)
  sorted_arms = np.sort(POOL_ARMS)
  for trial in range(300):
    state = arm_sampling.init_arm_sampler(jnp.asarray(POOL_ARMS), 4, jax.random.key(trial))
    cursor = np.array([rng.integers(0, s + 1) for s in SIZES], np.int32)
    state = state._replace(cursor=jnp.asarray(cursor))
    arms = rng.permutation(sorted_arms)[:10]  # at most SIZES[k] slots of arm k
    ids, new = _take(state, jnp.asarray(arms, jnp.int32), jax.random.key(10_000 + trial))
    ids = np.asarray(ids)
    assert len(set(ids.tolist())) == ids.size, (f"trial {trial}: cursors {cursor.tolist()}, "
                                                f"arms {arms.tolist()}, ids {ids.tolist()}")
    np.testing.assert_array_equal(POOL_ARMS[ids], arms)
    for k in range(4):
      seg = np.asarray(new.perm)[sum(SIZES[:k]):sum(SIZES[:k + 1])]
      assert sorted(seg.tolist()) == _members(k)


def test_jit_matches_no_jit():
  # One step of 12 slots exhausts at least one arm, so the reshuffle path runs in both modes.
  a, sa = _run(1, 12, [0.1, 0.2, 0.3, 0.4], jit=True)
  b, sb = _run(1, 12, [0.1, 0.2, 0.3, 0.4], jit=False)
  drawn = np.bincount(np.concatenate([arms for arms, _ in a]), minlength=4)
  assert np.any(drawn > np.asarray(SIZES)), "no arm was exhausted; the test misses the reshuffle"
  for (x1, y1), (x2, y2) in zip(a, b):
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
  np.testing.assert_array_equal(sa.perm, sb.perm)
  np.testing.assert_array_equal(sa.cursor, sb.cursor)


def test_zero_probability_arm_is_never_drawn():
  arms = arm_sampling.draw_arms(jax.random.key(0), jnp.array([0.5, 0.0, 0.5, 0.0]), 4000)
  assert set(np.unique(np.asarray(arms)).tolist()) == {0, 2}


def test_mask_empty_arms():
  out = arm_sampling.mask_empty_arms(jnp.array([0.2, 0.3, 0.5]), jnp.array([4, 0, 1]))
  np.testing.assert_allclose(out, [0.2 / 0.7, 0.0, 0.5 / 0.7], rtol=1e-6)
  out = arm_sampling.mask_empty_arms(jnp.array([0.0, 1.0, 0.0]), jnp.array([4, 0, 1]))
  np.testing.assert_allclose(out, [0.5, 0.0, 0.5], rtol=1e-6)


def _keyed_perms(n, reps):
  def one(k):
    bits = jax.random.bits(k, (1, arm_sampling._FEISTEL_ROUNDS + 1), jnp.uint32)
    return arm_sampling._keyed_permutation(
        jnp.arange(n, dtype=jnp.uint32), jnp.full((n,), n, jnp.uint32),
        jnp.repeat(bits[:, :-1], n, axis=0), jnp.repeat(bits[:, -1], n, axis=0))
  return np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(n), reps)))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 9, 100, 257])
def test_keyed_permutation_is_a_bijection(n):
  for row in _keyed_perms(n, 4):
    assert sorted(row.tolist()) == list(range(n))


def test_keyed_permutation_reaches_every_order_with_uniform_positions():
  perms = _keyed_perms(4, 4800)
  assert len({tuple(p) for p in perms}) == 24
  # Where element 0 lands: uniform over 4 positions (chi-square, 3 df, 0.1% level: 16.27).
  counts = np.bincount(perms[:, 0], minlength=4)
  stat = np.sum((counts - 1200.0) ** 2 / 1200.0)
  assert stat < 16.27, counts
