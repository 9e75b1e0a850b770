"""Tests for rl_curriculum/tasks/data.py: left padding, arms, and the PromptPool hand-off."""

import numpy as np
import pytest

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.tasks import data, get_task


def _encode(text):
  return [ord(c) for c in text]


def test_left_pad_reference():
  tokens, mask = data.left_pad([[5, 6, 7], [8], [9, 10]], pad_id=0)
  np.testing.assert_array_equal(tokens, [[5, 6, 7], [0, 0, 8], [0, 9, 10]])
  np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1], [0, 1, 1]])
  assert tokens.dtype == np.int32 and mask.dtype == bool
  tokens, _ = data.left_pad([[1]], pad_id=-1, length=3)
  np.testing.assert_array_equal(tokens, [[-1, -1, 1]])
  with pytest.raises(ValueError, match="max_prompt_len"):
    data.left_pad([[1, 2, 3]], pad_id=0, length=2)
  with pytest.raises(ValueError):
    data.left_pad([[]], pad_id=0)


def test_make_pool_from_task():
  task = get_task("arithmetic")
  problems = [task.generate(s, b) for b in task.train_bins for s in range(3)]
  pool = data.make_pool(problems, _encode, pad_id=0, num_arms=len(task.train_bins))
  n = len(problems)
  assert pool.tokens.shape[0] == n and pool.mask.shape == pool.tokens.shape
  np.testing.assert_array_equal(pool.arms, [p.difficulty for p in problems])
  for i, p in enumerate(problems):
    row = pool.tokens[i][pool.mask[i]]
    assert "".join(map(chr, row)) == p.prompt
    assert not pool.mask[i, :pool.mask.shape[1] - len(p.prompt)].any()
  pp = pool.prompt_pool()
  assert isinstance(pp, PromptPool) and pp.num_arms == len(task.train_bins) and pp.size == n
  np.testing.assert_array_equal(np.asarray(pp.difficulty), pool.arms.astype(np.float32))


def test_make_pool_bins_map_and_errors():
  task = get_task("arithmetic")
  problems = [task.generate(0, 4), task.generate(0, 2), task.generate(1, 4)]
  pool = data.make_pool(problems, _encode, pad_id=0, bins=(2, 4))
  np.testing.assert_array_equal(pool.arms, [1, 0, 1])
  assert pool.num_arms == 2
  with pytest.raises(ValueError, match="bins"):
    data.make_pool(problems, _encode, pad_id=0, bins=(2,))
  with pytest.raises(ValueError):
    data.make_pool([], _encode, pad_id=0)
  with pytest.raises(ValueError):
    data.make_pool(problems, _encode, pad_id=0, max_prompt_len=2)
  pool = data.make_pool(problems, _encode, pad_id=0, difficulty=[0.5, 0.1, 0.9],
                        prompt_fn=lambda p: "Q:" + p.prompt)
  np.testing.assert_allclose(pool.difficulty, [0.5, 0.1, 0.9])
  assert "".join(map(chr, pool.tokens[0][pool.mask[0]])) == "Q:" + problems[0].prompt


def test_bins_can_share_an_arm():
  task = get_task("arithmetic")
  problems = [task.generate(0, 4), task.generate(0, 2), task.generate(1, 0)]
  pool = data.make_pool(problems, _encode, pad_id=0, bins=(0, 2, 4), bin_arms=(1, 0, 1))
  np.testing.assert_array_equal(pool.arms, [1, 0, 1])
  assert pool.num_arms == 2
  with pytest.raises(ValueError, match="2 labels for 3 bins"):
    data.make_pool(problems, _encode, pad_id=0, bins=(0, 2, 4), bin_arms=(1, 0))


def test_difficulty_is_the_bin_not_the_arm_for_unsorted_bins():
  """train_bins listed out of order: arm 0 holds bin 5 (the hardest). Curricula that read
  difficulty must still start on bin 0: easy-to-hard's default order and AdaRFT's target come
  from the problems' bins, not from the arms' positions."""
  import jax  # pylint: disable=g-import-not-at-top
  from rl_curriculum import curriculum as cur  # pylint: disable=g-import-not-at-top
  task = get_task("arithmetic")
  bins = (5, 0, 1)
  problems = [task.generate(s, b) for b in bins for s in range(8)]
  pool = data.make_pool(problems, _encode, pad_id=0, bins=bins)
  np.testing.assert_array_equal(pool.arms, np.repeat([0, 1, 2], 8))
  np.testing.assert_array_equal(pool.difficulty, np.repeat([5.0, 0.0, 1.0], 8))
  prompt_pool = pool.prompt_pool()
  key = jax.random.PRNGKey(0)
  for build in (cur.easy_to_hard, cur.mastering_rate, cur.linear_pacing):
    curriculum = build(prompt_pool, batch_size=4)
    selection, _ = curriculum.select(curriculum.init(prompt_pool, key), key)
    np.testing.assert_array_equal(selection.arms, [1, 1, 1, 1])  # bin 0 first
  hard_first = cur.hard_to_easy(prompt_pool, batch_size=4)
  selection, _ = hard_first.select(hard_first.init(prompt_pool, key), key)
  np.testing.assert_array_equal(selection.arms, [0, 0, 0, 0])  # bin 5 first
  adarft = cur.adarft(prompt_pool, batch_size=4)
  selection, _ = adarft.select(adarft.init(prompt_pool, key), key)
  assert {problems[i].difficulty for i in np.asarray(selection.prompt_ids)} == {0}
