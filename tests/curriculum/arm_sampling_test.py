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


def test_more_slots_than_prompts_in_one_step():
  arms = jnp.zeros((3,), jnp.int32)
  state = arm_sampling.init_arm_sampler(arms, 1, jax.random.key(0))
  ids, state = _take(state, jnp.zeros((5,), jnp.int32), jax.random.key(1))
  ids = np.asarray(ids)
  assert sorted(ids[:3].tolist()) == [0, 1, 2]
  np.testing.assert_array_equal(ids[3:], np.asarray(state.perm)[:2])
  assert int(state.cursor[0]) == 2


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
