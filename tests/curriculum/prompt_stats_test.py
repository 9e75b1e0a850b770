"""Tests of rl_curriculum/curriculum/prompt_stats.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum import prompt_stats
import test_util

E, H, NONE = prompt_stats.KIND_EASY, prompt_stats.KIND_HARD, prompt_stats.KIND_NONE



def _reference_update(ref, ids, correct, valid, step):
  """Loop reference: pool rows by id, then update each observed prompt."""
  n, s = {}, {}
  for row, i in enumerate(ids):
    for g in range(correct.shape[1]):
      if valid[row, g]:
        n[i] = n.get(i, 0) + 1
        s[i] = s.get(i, 0) + int(correct[row, g])
  for i in n:
    ref["attempts"][i] += n[i]
    ref["successes"][i] += s[i]
    ref["last_accuracy"][i] = s[i] / n[i]
    ref["last_step"][i] = step
    kind = E if s[i] == n[i] else (H if s[i] == 0 else NONE)
    if kind == NONE:
      ref["streak"][i], ref["streak_kind"][i] = 0, NONE
    elif kind == ref["streak_kind"][i]:
      ref["streak"][i] += 1
    else:
      ref["streak"][i], ref["streak_kind"][i] = 1, kind
    ref["beta_a"][i] += s[i]
    ref["beta_b"][i] += n[i] - s[i]


@test_util.JIT
def test_update_matches_loop_reference_with_duplicates_and_masks(use_jit):
  num, p, g = 12, 10, 3
  rng = np.random.default_rng(0)
  store = prompt_stats.init(num, prior_a=2.0, prior_b=0.5)
  ref = {"attempts": np.zeros(num, int), "successes": np.zeros(num, int),
         "last_accuracy": -np.ones(num), "last_step": -np.ones(num, int),
         "streak": np.zeros(num, int), "streak_kind": np.zeros(num, int),
         "beta_a": np.full(num, 2.0), "beta_b": np.full(num, 0.5)}
  update = jax.jit(prompt_stats.update) if use_jit else prompt_stats.update
  for step in range(8):
    ids = rng.integers(0, num, size=p)  # duplicates on purpose
    correct = rng.random((p, g)) < rng.choice([0.0, 0.5, 1.0], size=(p, 1))
    valid = rng.random((p, g)) < 0.8
    store = update(store, test_util.feedback(correct, ids=ids, valid=valid), step)
    _reference_update(ref, ids, correct, valid, step)
    for name, want in ref.items():
      np.testing.assert_allclose(np.asarray(getattr(store, name)), want, rtol=1e-6, err_msg=name)


def test_duplicate_rows_pool_into_one_observation():
  # Prompt 3 twice: 4/4 then 0/4 -> pooled 4/8, mixed, so the easy streak of 2 ends.
  store = prompt_stats.init(5)
  store = store._replace(streak=store.streak.at[3].set(2),
                         streak_kind=store.streak_kind.at[3].set(E))
  fb = test_util.feedback([[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]], ids=[3, 1, 3])
  out = jax.jit(prompt_stats.update)(store, fb, 7)
  assert int(out.attempts[3]) == 8 and int(out.successes[3]) == 4
  assert float(out.last_accuracy[3]) == 0.5
  assert int(out.streak[3]) == 0 and int(out.streak_kind[3]) == NONE
  assert int(out.streak[1]) == 1 and int(out.streak_kind[1]) == H
  assert float(out.beta_a[3]) == 5.0 and float(out.beta_b[3]) == 5.0
  assert int(out.last_step[3]) == 7 and int(out.last_step[0]) == -1
  # Order of rows does not matter.
  perm = test_util.feedback([[0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], ids=[3, 3, 1])
  out2 = jax.jit(prompt_stats.update)(store, perm, 7)
  jax.tree.map(np.testing.assert_array_equal, out, out2)


def test_two_duplicate_all_correct_rows_advance_the_streak_once():
  store = prompt_stats.init(2)
  fb = test_util.feedback([[1, 1], [1, 1]], ids=[0, 0])
  out = prompt_stats.update(store, fb, 0)
  assert int(out.streak[0]) == 1 and int(out.streak_kind[0]) == E


def test_streak_sequence_easy_easy_hard_mixed():
  store = prompt_stats.init(1)
  update = jax.jit(prompt_stats.update)
  seq = [[1, 1], [1, 1], [0, 0], [1, 0]]
  want = [(1, E), (2, E), (1, H), (0, NONE)]
  for step, (c, (k, kind)) in enumerate(zip(seq, want)):
    store = update(store, test_util.feedback([c], ids=[0]), step)
    assert (int(store.streak[0]), int(store.streak_kind[0])) == (k, kind)


def test_invalid_completions_do_not_count():
  store = prompt_stats.init(3)
  # Row 0: only the wrong completion is valid -> 0/1 (hard). Row 1: nothing valid -> unchanged.
  fb = test_util.feedback([[1, 0], [1, 1]], ids=[0, 1], valid=[[0, 1], [0, 0]])
  out = jax.jit(prompt_stats.update)(store, fb, 0)
  assert int(out.attempts[0]) == 1 and int(out.successes[0]) == 0
  assert int(out.streak_kind[0]) == H
  for name in ("attempts", "successes", "last_accuracy", "last_step", "streak", "streak_kind",
               "beta_a", "beta_b"):
    np.testing.assert_array_equal(np.asarray(getattr(out, name))[1:],
                                  np.asarray(getattr(store, name))[1:], err_msg=name)
  assert int(out.attempts[1]) == 0 and int(out.last_step[1]) == -1
  assert float(out.last_accuracy[1]) == -1


def test_decay_beta_moves_toward_prior():
  store = prompt_stats.init(2, prior_a=1.0, prior_b=2.0)
  store = store._replace(beta_a=jnp.array([5.0, 1.0]), beta_b=jnp.array([2.0, 10.0]))
  out = prompt_stats.decay_beta(store, jnp.array([0.5, 0.9]))
  np.testing.assert_allclose(out.beta_a, [3.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(out.beta_b, [2.0, 2.0 + 0.9 * 8.0], rtol=1e-6)


def test_init_rejects_bad_arguments():
  with pytest.raises(ValueError, match="num_prompts"):
    prompt_stats.init(0)
  with pytest.raises(ValueError, match="prior_a"):
    prompt_stats.init(3, prior_a=0.0)
