"""Tests of rl_curriculum/curriculum/filters.py."""

import functools

from hypothesis import given, settings, strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum import filters
import test_util



def _labels(correct):
  """ids 100, 101, ..., arms 0, 1, 2, 0, ... and advantages 0, 1, 2, ...: distinct values that
  `gather_groups` must carry along with each group."""
  p, g = np.shape(correct)
  return dict(ids=np.arange(p) + 100, arms=np.arange(p) % 3,
              advantages=np.arange(p * g, dtype=np.float32).reshape(p, g))


_all_equal = jax.jit(functools.partial(filters.dynamic_filter, mode="all_equal"))
_band = jax.jit(functools.partial(filters.dynamic_filter, mode="accuracy_band", lo=0.25, hi=0.5))
_compact4 = jax.jit(functools.partial(filters.compact_indices, batch_size=4))

GROUPS = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 1, 0]]


@test_util.JIT
def test_all_equal_drops_all_right_and_all_wrong(use_jit):
  fn = _all_equal if use_jit else functools.partial(filters.dynamic_filter, mode="all_equal")
  out = fn(test_util.feedback(GROUPS, **_labels(GROUPS)))
  np.testing.assert_array_equal(out.keep, [False, False, True, True, True])
  assert int(out.num_kept) == 3


def test_accuracy_band_is_closed():
  out = _band(test_util.feedback(GROUPS, **_labels(GROUPS)))  # accuracies 1, 0, .5, .25, .75
  np.testing.assert_array_equal(out.keep, [False, False, True, True, False])
  assert int(out.num_kept) == 2


def test_valid_mask_restricts_the_group():
  # Row 0: only the correct completion is valid -> all equal. Row 1: nothing valid -> dropped
  # in both modes. Row 2: mixed among valid ones.
  correct = [[1, 0, 0], [1, 0, 1], [1, 1, 0]]
  fb = test_util.feedback(correct, valid=[[1, 0, 0], [0, 0, 0], [1, 0, 1]], **_labels(correct))
  np.testing.assert_array_equal(_all_equal(fb).keep, [False, False, True])
  band = filters.dynamic_filter(fb, mode="accuracy_band", lo=0.0, hi=1.0)
  np.testing.assert_array_equal(band.keep, [True, False, True])


def test_filter_reads_correctness_not_shaped_reward():
  correct = np.array([[0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
  fmt = np.array([[1, 0, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1]])  # format bonus varies inside groups
  shaped = correct + 0.1 * fmt  # rewards differ in groups 0 and 1 although correctness does not
  fb = test_util.feedback(correct, rewards=shaped, **_labels(correct))
  assert np.ptp(shaped[0]) > 0 and np.ptp(shaped[1]) > 0
  np.testing.assert_array_equal(_all_equal(fb).keep, [False, False, True])
  plain = test_util.feedback(correct, **_labels(correct))
  np.testing.assert_array_equal(_all_equal(plain).keep, _all_equal(fb).keep)


def test_compact_pads_with_masked_groups_when_short():
  keep = jnp.array([False, True, False, False, True, False])
  idx, ok = _compact4(keep, key=jax.random.key(0))
  idx = np.asarray(idx)
  np.testing.assert_array_equal(ok, [True, True, False, False])
  assert sorted(idx[:2].tolist()) == [1, 4]  # both kept groups, in random slot order
  np.testing.assert_array_equal(idx[2:], [0, 0])
  fb = test_util.feedback(np.ones((6, 3)), **_labels(np.ones((6, 3))))
  out = jax.jit(filters.gather_groups)(fb, jnp.asarray(idx), ok)
  np.testing.assert_array_equal(out.prompt_ids[:2], 100 + idx[:2])
  np.testing.assert_array_equal(out.valid, [[True] * 3, [True] * 3, [False] * 3, [False] * 3])
  np.testing.assert_array_equal(out.advantages[:2], np.asarray(fb.advantages)[idx[:2]])


def test_compact_takes_distinct_kept_groups_when_more_than_batch():
  keep = jnp.array([True, False, True, True, True, True, False, True])
  idx, ok = _compact4(keep, key=jax.random.key(0))
  idx = np.asarray(idx)
  assert len(set(idx.tolist())) == 4 and set(idx.tolist()) <= {0, 2, 3, 4, 5, 7}
  assert bool(ok.all())
  # The same key gives the same subset.
  np.testing.assert_array_equal(_compact4(keep, key=jax.random.key(0))[0], idx)


_compact4_many = jax.jit(jax.vmap(lambda keep, key: filters.compact_indices(keep, 4, key),
                                  in_axes=(None, 0)))


@pytest.mark.parametrize("keep", [[True] * 8, [True, False, True, True, False, True, True, True]])
def test_compact_keeps_a_uniformly_random_subset(keep):
  """More kept groups than slots: each call takes distinct kept groups, and over 4000 keys every
  kept group fills a slot with probability 4 / num_kept (binomial sd <= 0.008; bound 0.05). Taking
  the first four kept groups gives frequencies 1 and 0 instead."""
  keep = np.asarray(keep)
  kept = np.flatnonzero(keep)
  idx, ok = _compact4_many(jnp.asarray(keep), jax.random.split(jax.random.key(7), 4000))
  idx, ok = np.asarray(idx), np.asarray(ok)
  assert ok.all()
  for row in idx:
    assert len(set(row.tolist())) == 4 and set(row.tolist()) <= set(kept.tolist()), row
  freq = np.bincount(idx.reshape(-1), minlength=keep.size) / idx.shape[0]
  np.testing.assert_array_equal(freq[~keep], 0.0)
  np.testing.assert_allclose(freq[kept], 4 / kept.size, atol=0.05,
                             err_msg="share of keys whose batch holds each kept group")


def test_gather_keeps_existing_invalid_slots():
  fb = test_util.feedback(np.ones((3, 2)), valid=[[1, 0], [1, 1], [0, 1]],
                          **_labels(np.ones((3, 2))))
  out = filters.gather_groups(fb, jnp.array([2, 0]), jnp.array([True, True]))
  np.testing.assert_array_equal(out.valid, [[False, True], [True, False]])


def test_oversampled_size_and_bad_arguments():
  assert filters.oversampled_size(8) == 16
  assert filters.oversampled_size(10, 1.5) == 15
  assert filters.oversampled_size(3, 1.1) == 4
  with pytest.raises(ValueError, match="factor"):
    filters.oversampled_size(8, 0.5)
  fb = test_util.feedback(GROUPS, **_labels(GROUPS))
  with pytest.raises(ValueError, match="mode"):
    filters.dynamic_filter(fb, mode="variance")
  with pytest.raises(ValueError, match="lo and hi"):
    filters.dynamic_filter(fb, mode="accuracy_band", lo=0.2)
  with pytest.raises(ValueError, match="lo <= hi"):
    filters.dynamic_filter(fb, mode="accuracy_band", lo=0.6, hi=0.2)
  with pytest.raises(ValueError, match="accuracy_band"):
    filters.dynamic_filter(fb, mode="all_equal", lo=0.2, hi=0.3)
  with pytest.raises(ValueError, match="batch_size"):
    filters.compact_indices(jnp.ones(3, bool), batch_size=4, key=jax.random.key(0))


_band_wide = jax.jit(functools.partial(filters.dynamic_filter, mode="accuracy_band", lo=0.25,
                                      hi=0.75))
_compact = jax.jit(filters.compact_indices, static_argnames="batch_size")
_gather = jax.jit(filters.gather_groups)


# Fixed array shapes (12 groups of 5 slots) keep compilation to a few programs; the valid mask
# varies the effective group sizes and the prefix `num_groups` the effective batch.
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.sampled_from([1, 4, 12]), st.integers(0, 2**31 - 1),
       st.sampled_from(["all_equal", "band"]))
def test_filter_and_compact_properties(num_groups, batch_size, seed, mode):
  total, group_size = 12, 5
  rng = np.random.default_rng(seed)
  correct = rng.random((total, group_size)) < rng.random((total, 1))
  valid = rng.random((total, group_size)) < rng.random((total, 1))
  valid[num_groups:] = False  # groups past num_groups do not exist
  fb = test_util.feedback(correct, valid=valid, **_labels(correct))
  res = (_all_equal if mode == "all_equal" else _band_wide)(fb)
  # Loop reference of the keep rule.
  want = []
  for p in range(total):
    vals = [bool(correct[p, g]) for g in range(group_size) if valid[p, g]]
    if not vals:
      want.append(False)
    elif mode == "all_equal":
      want.append(0 < sum(vals) < len(vals))
    else:
      want.append(0.25 <= sum(vals) / len(vals) <= 0.75)
  np.testing.assert_array_equal(res.keep, want)
  assert int(res.num_kept) == sum(want)
  idx, ok = _compact(res.keep, batch_size=batch_size, key=jax.random.key(seed))
  idx, ok = np.asarray(idx), np.asarray(ok)
  assert idx.shape == ok.shape == (batch_size,)
  kept_positions = [p for p in range(total) if want[p]]
  n_ok = min(len(kept_positions), batch_size)
  np.testing.assert_array_equal(ok, np.arange(batch_size) < n_ok)
  chosen = idx[:n_ok].tolist()
  assert len(set(chosen)) == n_ok and set(chosen) <= set(kept_positions)  # distinct and kept
  if len(kept_positions) <= batch_size:
    assert sorted(chosen) == kept_positions  # nothing to drop: every kept group is used
  np.testing.assert_array_equal(idx[n_ok:], 0)
  out = _gather(fb, jnp.asarray(idx), jnp.asarray(ok))
  assert not np.asarray(out.valid)[~ok].any()
  np.testing.assert_array_equal(np.asarray(out.valid)[ok], valid[idx[ok]])
