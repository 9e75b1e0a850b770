"""Tests for rl_curriculum/curriculum/category.py."""

import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rl_curriculum.curriculum import category as C
from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.types import Feedback

# Upper 0.1% points of the chi-square distribution (standard tables), by degrees of freedom.
CHI2_CRIT_999 = {2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}

SIZES = (3, 5, 2, 6)
POOL = PromptPool.from_arms(np.repeat(np.arange(4), SIZES))


def _pool(k):
  return PromptPool.from_arms(np.repeat(np.arange(k), 4))


def _feedback(arms, rewards, advantages=None, valid=None, correct=None):
  rewards = jnp.asarray(rewards, jnp.float32)
  if advantages is None:
    advantages = jnp.zeros_like(rewards)
  if correct is None:
    correct = rewards > 0.5
  return Feedback(prompt_ids=jnp.zeros((rewards.shape[0],), jnp.int32),
                  arms=jnp.asarray(arms, jnp.int32), rewards=rewards,
                  correct=jnp.asarray(correct, bool),
                  advantages=jnp.asarray(advantages, jnp.float32),
                  valid=None if valid is None else jnp.asarray(valid, bool))


# ------------------------------------------------------------------------------------------------
# SEC: hand-computed updates.
# ------------------------------------------------------------------------------------------------

# Arms 0, 0, 1, 1; arm 2 unsampled. G = 2.
FB_ARMS = [0, 0, 1, 1]
FB_REWARDS = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
FB_ADV = [[0.5, -0.5], [0.0, 0.0], [0.2, -0.6], [1.0, -1.0]]
FB_VALID = [[True, True], [True, False], [True, True], [False, True]]
Q0 = np.array([0.2, 0.4, 0.6], np.float32)


def _sec_state(cur, q, visits=None, last=None):
  state = cur.init(_pool(3), jax.random.key(0))
  state = state._replace(q=jnp.asarray(q, jnp.float32))
  if visits is not None:
    state = state._replace(visits=jnp.asarray(visits, jnp.int32))
  if last is not None:
    state = state._replace(last_mean_reward=jnp.asarray(last, jnp.float32))
  return state


# Expected q after one update from Q0 with alpha = 0.5, worked by hand:
#   abs_advantage: R0 = (.5 + .5 + 0 + 0) / 4 = .25, R1 = (.2 + .6 + 1 + 1) / 4 = .7
#   unnormalized:  group means .5, 1, 0, .5 -> |r - mean| = .5 .5 | 0 0 | 0 0 | .5 .5
#                  R0 = 1 / 4 = .25, R1 = 1 / 4 = .25
#   with valid:    abs: R0 = (.5 + .5 + 0) / 3, R1 = (.2 + .6 + 1) / 3 = .6
#                  unnormalized: group means .5, 1, 0, 0 -> R0 = 1 / 3, R1 = 0
HAND_CASES = [
    ("abs_advantage", "keep", False, [0.225, 0.55, 0.6]),
    ("abs_advantage", "decay", False, [0.225, 0.55, 0.3]),
    ("unnormalized_abs_advantage", "keep", False, [0.225, 0.325, 0.6]),
    ("unnormalized_abs_advantage", "decay", False, [0.225, 0.325, 0.3]),
    ("abs_advantage", "keep", True, [0.2 + 0.5 * (1 / 3 - 0.2), 0.5, 0.6]),
    ("unnormalized_abs_advantage", "decay", True, [0.2 + 0.5 * (1 / 3 - 0.2), 0.2, 0.3]),
]


@pytest.mark.parametrize("objective,unsampled,use_valid,expected", HAND_CASES)
@pytest.mark.parametrize("jit", [True, False])
def test_sec_update_hand_computed(objective, unsampled, use_valid, expected, jit):
  cur = C.sec(3, batch_size=4, alpha=0.5, objective=objective, unsampled=unsampled)
  state = _sec_state(cur, Q0)
  fb = _feedback(FB_ARMS, FB_REWARDS, FB_ADV, FB_VALID if use_valid else None)
  update = jax.jit(cur.update) if jit else cur.update
  state, metrics = update(state, fb)
  np.testing.assert_allclose(state.q, expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(metrics["q"], expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(metrics["sampled"], [1.0, 1.0, 0.0])
  np.testing.assert_array_equal(metrics["arm_counts"], [2.0, 2.0, 0.0])
  np.testing.assert_array_equal(state.visits, [1, 1, 0])
  np.testing.assert_allclose(jnp.sum(metrics["probs"]), 1.0, rtol=1e-6)


@pytest.mark.parametrize("unsampled", ["keep", "decay"])
def test_sec_learning_progress_hand_computed(unsampled):
  """First visit gives R = 0; the next gives |mean reward now - mean reward then|."""
  cur = C.sec(3, batch_size=4, alpha=0.5, objective="learning_progress", unsampled=unsampled)
  update = jax.jit(cur.update)
  state = _sec_state(cur, Q0)
  # Mean rewards: arm 0 (1 + 0 + 1 + 1) / 4 = .75, arm 1 (0 + 0 + 1 + 0) / 4 = .25.
  state, m1 = update(state, _feedback(FB_ARMS, FB_REWARDS, FB_ADV))
  np.testing.assert_allclose(m1["arm_reward"], [0.0, 0.0, 0.0], atol=1e-7)
  decayed = 0.3 if unsampled == "decay" else 0.6
  np.testing.assert_allclose(state.q, [0.1, 0.2, decayed], rtol=1e-6)
  np.testing.assert_allclose(state.last_mean_reward, [0.75, 0.25, 0.0], rtol=1e-6)
  # Second step: arm 0 all wrong (mean 0), arm 2 all right (first visit), arm 1 unsampled.
  state, m2 = update(state, _feedback([0, 0, 2, 2], [[0, 0], [0, 0], [1, 1], [1, 1]]))
  np.testing.assert_allclose(m2["arm_reward"], [0.75, 0.0, 0.0], atol=1e-7)
  q1 = 0.2 if unsampled == "keep" else 0.1
  np.testing.assert_allclose(state.q, [0.1 + 0.5 * (0.75 - 0.1), q1, 0.5 * decayed], rtol=1e-6)
  np.testing.assert_allclose(state.last_mean_reward, [0.0, 0.25, 1.0], atol=1e-7)


def _ref_sec_rewards(arms, rewards, adv, valid, k, objective, last, visits):
  """Loop reference for SEC's arm reward."""
  out = np.zeros(k)
  for arm in range(k):
    vals, rs = [], []
    for p in range(len(arms)):
      if arms[p] != arm:
        continue
      members = [g for g in range(rewards.shape[1]) if valid[p, g]]
      gmean = sum(rewards[p, g] for g in members) / max(len(members), 1)
      for g in members:
        rs.append(rewards[p, g])
        if objective == "abs_advantage":
          vals.append(abs(adv[p, g]))
        else:
          vals.append(abs(rewards[p, g] - gmean))
    if not rs:
      continue
    if objective == "learning_progress":
      out[arm] = abs(sum(rs) / len(rs) - last[arm]) if visits[arm] > 0 else 0.0
    else:
      out[arm] = sum(vals) / len(vals)
  return out


@pytest.mark.parametrize("objective", C.SEC_OBJECTIVES)
def test_sec_arm_rewards_match_loop_reference(objective):
  rng = np.random.default_rng(3)
  p, g, k = 12, 5, 4
  arms = rng.integers(0, k - 1, size=p)  # arm k-1 never sampled
  rewards = rng.uniform(size=(p, g)).astype(np.float32)
  adv = rng.normal(size=(p, g)).astype(np.float32)
  valid = rng.uniform(size=(p, g)) < 0.7
  last = rng.uniform(size=k).astype(np.float32)
  visits = np.array([0, 2, 1, 0], np.int32)
  fb = _feedback(arms, rewards, adv, valid)
  fn = jax.jit(C.sec_arm_rewards, static_argnums=(1, 2))
  r, sampled, _ = fn(fb, k, objective, jnp.asarray(last), jnp.asarray(visits))
  np.testing.assert_allclose(r, _ref_sec_rewards(arms, rewards, adv, valid, k, objective, last,
                                                 visits), rtol=1e-5, atol=1e-6)
  assert not bool(sampled[k - 1])


def test_sec_alpha_one_sets_q_to_last_reward():
  cur = C.sec(3, batch_size=4, alpha=1.0)
  state, metrics = jax.jit(cur.update)(_sec_state(cur, Q0), _feedback(FB_ARMS, FB_REWARDS, FB_ADV))
  np.testing.assert_allclose(state.q[:2], metrics["arm_reward"][:2], rtol=1e-6)
  np.testing.assert_allclose(state.q, [0.25, 0.7, 0.6], rtol=1e-6)


def test_sec_keep_leaves_unsampled_arms_unchanged():
  cur = C.sec(3, batch_size=4)
  update = jax.jit(cur.update)
  state = _sec_state(cur, Q0)
  for _ in range(3):
    state, _ = update(state, _feedback(FB_ARMS, FB_REWARDS, FB_ADV))
    assert float(state.q[2]) == float(np.float32(0.6))  # bit for bit


# ------------------------------------------------------------------------------------------------
# SEC: selection distributions.
# ------------------------------------------------------------------------------------------------

def test_sec_probabilities_hand_computed():
  q = jnp.array([0.1, 0.5, 0.5, 0.2])
  sizes = jnp.array([2, 2, 2, 0])
  p = C.sec_probabilities(q, jnp.zeros(4, jnp.int32), sizes, "boltzmann", 0.5, 0.1, 1.0)
  e = np.exp(np.array([0.1, 0.5, 0.5]) / 0.5)
  np.testing.assert_allclose(p, list(e / e.sum()) + [0.0], rtol=1e-6)
  p = C.sec_probabilities(q, jnp.zeros(4, jnp.int32), sizes, "epsilon_greedy", 1.0, 0.3, 1.0)
  np.testing.assert_allclose(p, [0.1, 0.1 + 0.35, 0.1 + 0.35, 0.0], rtol=1e-6)
  # UCB: every arm tried once first (untried arms share the mass) ...
  p = C.sec_probabilities(q, jnp.array([3, 0, 0, 0]), sizes, "ucb", 1.0, 0.1, 1.0)
  np.testing.assert_allclose(p, [0.0, 0.5, 0.5, 0.0])
  # ... then argmax of q + c sqrt(ln N / n): N = 8, scores .1 + sqrt(ln8/4) = .821,
  # .5 + sqrt(ln8 / 1) = 1.942, .5 + sqrt(ln8 / 3) = 1.333.
  q3 = jnp.array([0.1, 0.5, 0.5])
  p = C.sec_probabilities(q3, jnp.array([4, 1, 3]), jnp.array([1, 1, 1]), "ucb", 1.0, 0.1, 1.0)
  np.testing.assert_allclose(p, [0.0, 1.0, 0.0])
  p = C.sec_probabilities(q3, jnp.array([1, 4, 3]), jnp.array([1, 1, 1]), "ucb", 1.0, 0.1, 0.1)
  np.testing.assert_allclose(p, [0.0, 0.0, 1.0])  # .1+.144 < .5+.072 < .5+.083


def _chi2(counts, probs):
  n = counts.sum()
  expected = n * probs
  keep = probs > 0
  assert np.all(counts[~keep] == 0)
  return float(np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep])), int(keep.sum()) - 1


@pytest.mark.parametrize("exploration,temperature", [("boltzmann", 0.5), ("boltzmann", 1.0),
                                                     ("epsilon_greedy", 1.0)])
def test_sec_select_frequencies_chi_square(exploration, temperature):
  """Arm counts over 64 x 512 draws fit pi (chi-square at the 0.1% level, fixed seed)."""
  cur = C.sec(POOL, batch_size=512, temperature=temperature, exploration=exploration, epsilon=0.2)
  state = cur.init(POOL, jax.random.key(0))._replace(q=jnp.array([0.1, 0.9, 0.4, 0.6]))
  keys = jax.random.split(jax.random.key(7), 64)
  sels, _ = jax.jit(jax.vmap(cur.select, in_axes=(None, 0)))(state, keys)
  counts = np.bincount(np.asarray(sels.arms).ravel(), minlength=4)
  probs = np.asarray(C.sec_probabilities(state.q, state.visits, state.sampler.sizes, exploration,
                                         temperature, 0.2, 1.0), np.float64)
  if exploration == "boltzmann":
    ref = np.exp(np.array([0.1, 0.9, 0.4, 0.6]) / temperature)
    np.testing.assert_allclose(probs, ref / ref.sum(), rtol=1e-6)
  stat, df = _chi2(counts, probs)
  assert stat < CHI2_CRIT_999[df], (stat, counts, probs)
  # The test can fail: the same counts against a visibly different distribution do not fit.
  stat_wrong, _ = _chi2(counts, np.roll(probs, 1))
  assert stat_wrong > CHI2_CRIT_999[df]


# ------------------------------------------------------------------------------------------------
# 2-D arms.
# ------------------------------------------------------------------------------------------------

def test_product_arms_round_trip():
  diff = np.array([0, 2, 1, 2, 0])
  task = np.array([1, 0, 2, 2, 0])
  arms, k = C.product_arms(diff, task)
  assert k == 9
  np.testing.assert_array_equal(arms, [1, 6, 5, 8, 0])
  a, b = C.split_arms(arms, 3)
  np.testing.assert_array_equal(a, diff)
  np.testing.assert_array_equal(b, task)
  arms, k = C.product_arms(diff, task, num_a=4, num_b=5)
  assert k == 20
  with pytest.raises(ValueError, match="labels_b"):
    C.product_arms(diff, task, num_b=2)


# ------------------------------------------------------------------------------------------------
# Uniform and schedules.
# ------------------------------------------------------------------------------------------------

def test_uniform_probabilities():
  for by, expected in [("prompt", np.array(SIZES) / sum(SIZES)), ("arm", [0.25] * 4)]:
    cur = C.uniform(POOL, batch_size=4, by=by)
    _, m = cur.update(cur.init(POOL, jax.random.key(0)), _feedback([0, 1, 2, 3], [[1.0]] * 4))
    np.testing.assert_allclose(m["probs"], expected, rtol=1e-6)


def _probs_sequence(cur, k, steps, correct=0.0):
  """Probabilities of the next selection after each of `steps` updates (all arms sampled)."""
  update = jax.jit(cur.update)
  state = cur.init(_pool(k), jax.random.key(0))
  out = []
  for _ in range(steps):
    fb = _feedback(list(range(k)), [[correct, correct]] * k)
    state, m = update(state, fb)
    out.append(np.asarray(m["probs"]))
  return np.stack(out)


def test_easy_to_hard_advances_every_n_steps():
  cur = C.easy_to_hard(3, batch_size=2, steps_per_arm=2)
  sel, _ = jax.jit(cur.select)(cur.init(_pool(3), jax.random.key(0)), jax.random.key(1))
  np.testing.assert_array_equal(sel.arms, [0, 0])
  p = _probs_sequence(cur, 3, 6)
  np.testing.assert_array_equal(np.argmax(p, axis=1), [0, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(p.max(axis=1), 1.0)


def test_easy_to_hard_advances_on_accuracy():
  cur = C.easy_to_hard(3, batch_size=2, steps_per_arm=None, accuracy_threshold=0.7)
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 2, correct=0.0), 1), [0, 0])
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 3, correct=1.0), 1), [1, 2, 2])


def test_hard_to_easy_and_custom_order():
  cur = C.hard_to_easy(3, batch_size=2, steps_per_arm=1)
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 3), 1), [1, 0, 0])
  cur = C.easy_to_hard(3, batch_size=2, steps_per_arm=1, order=[2, 0, 1])
  np.testing.assert_array_equal(np.argmax(_probs_sequence(cur, 3, 3), 1), [0, 1, 1])


def test_linear_pacing_hand_computed():
  # m(t) = 1 + floor(2 t / 4): t = 1..5 -> 1, 2, 2, 3, 3.
  p = _probs_sequence(C.linear_pacing(3, batch_size=2, steps_to_full=4), 3, 5)
  expected = [[1, 0, 0], [.5, .5, 0], [.5, .5, 0], [1 / 3] * 3, [1 / 3] * 3]
  np.testing.assert_allclose(p, expected, rtol=1e-6)


def test_cyclical_hand_computed():
  # Period 4: tri = 0, .5, 1, .5, 0 at t = 0..4; m = 1 + round(2 tri) = 1, 2, 3, 2, 1.
  p = _probs_sequence(C.cyclical(3, batch_size=2, period=4), 3, 4)
  expected = [[.5, .5, 0], [1 / 3] * 3, [.5, .5, 0], [1, 0, 0]]
  np.testing.assert_allclose(p, expected, rtol=1e-6)


def test_mixed_replay_hand_computed():
  p = _probs_sequence(C.mixed_replay(3, batch_size=2, steps_per_arm=1, replay_prob=0.2), 3, 3)
  np.testing.assert_allclose(p, [[.2, .8, 0], [.1, .1, .8], [.1, .1, .8]], rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# DUMP, ALP teacher, mastering rate.
# ------------------------------------------------------------------------------------------------

def test_dump_hand_computed():
  cur = C.dump(2, batch_size=3, window=3, temperature=0.1)
  update = jax.jit(cur.update)
  state = cur.init(PromptPool.from_arms([0, 0, 1, 1]), jax.random.key(0))
  # Arm 0 receives |A| = .2 .2 .4 0 (4 values, window 3 keeps .2 .4 0); arm 1 receives 1 .5.
  state, m = update(state, _feedback([0, 0, 1], [[0, 0]] * 3,
                                     [[0.2, -0.2], [0.4, 0.0], [1.0, -0.5]]))
  np.testing.assert_array_equal(state.counts, [2, 1])
  np.testing.assert_array_equal(state.filled, [3, 2])
  np.testing.assert_allclose(m["window_mean"], [0.2, 0.75], rtol=1e-6)
  s = np.array([0.2 + math.sqrt(2 * math.log(4) / 3), 0.75 + math.sqrt(2 * math.log(4) / 2)])
  np.testing.assert_allclose(m["score"], s, rtol=1e-6)
  e = np.exp(s / 0.1)
  np.testing.assert_allclose(m["probs"], e / e.sum(), rtol=1e-5)
  # Arm 1 receives .1 .1 .3 .3 0 0 with one invalid slot (the second .3): window keeps .3 0 0.
  valid = [[True, True], [True, False], [True, True]]
  state, m = update(state, _feedback([1, 1, 1], [[0, 0]] * 3,
                                     [[0.1, 0.1], [0.3, 0.3], [0.0, 0.0]], valid))
  np.testing.assert_array_equal(state.counts, [2, 4])
  np.testing.assert_allclose(m["window_mean"], [0.2, 0.1], rtol=1e-6)
  s = np.array([0.2 + math.sqrt(2 * math.log(7) / 3), 0.1 + math.sqrt(2 * math.log(7) / 5)])
  np.testing.assert_allclose(m["score"], s, rtol=1e-6)
  e = np.exp(s / 0.1)
  np.testing.assert_allclose(m["probs"], e / e.sum(), rtol=1e-5)


def test_alp_teacher_hand_computed():
  # W = 2 steps, ring of 4 steps per arm; each step pushes (correct, valid) per sampled arm.
  cur = C.alp_teacher(2, batch_size=2, window=2, epsilon=0.2)
  update = jax.jit(cur.update)
  state = cur.init(PromptPool.from_arms([0, 0, 1, 1]), jax.random.key(0))
  # Arm 0 pushes (3, 4): recent .75, older window empty -> ALP 0, uniform.
  state, m = update(state, _feedback([0, 0], [[1, 1], [1, 0]]))
  np.testing.assert_allclose(m["recent"], [0.75, 0.0])
  np.testing.assert_allclose(m["alp"], [0.0, 0.0])
  np.testing.assert_allclose(m["probs"], [0.5, 0.5], rtol=1e-6)
  # Arm 0 pushes (0, 2), arm 1 (2, 2): arm 0 recent 3/6 = .5, older still empty.
  state, m = update(state, _feedback([0, 1], [[0, 0], [1, 1]]))
  np.testing.assert_allclose(m["recent"], [0.5, 1.0])
  np.testing.assert_allclose(m["alp"], [0.0, 0.0])
  np.testing.assert_array_equal(state.filled, [2, 1])
  # Arm 0 pushes (1, 3) (one invalid slot): recent (0 + 1) / (2 + 3) = .2, older 3/4 = .75,
  # ALP .55 -> pi = .1 + .8 [1, 0]. Arm 1 is not sampled and keeps its window.
  valid = [[True, True], [False, True]]
  state, m = update(state, _feedback([0, 0], [[0, 0], [1, 1]], valid=valid))
  np.testing.assert_allclose(m["recent"], [0.2, 1.0], rtol=1e-6)
  np.testing.assert_allclose(m["older"], [0.75, 0.0])
  np.testing.assert_allclose(m["alp"], [0.55, 0.0], rtol=1e-6)
  np.testing.assert_allclose(m["probs"], [0.9, 0.1], rtol=1e-6)
  # Arm 0's group has no valid completion: it pushes nothing. Arm 1 pushes (1, 2).
  valid = [[True, True], [False, False]]
  state, m = update(state, _feedback([1, 0], [[1, 0], [1, 1]], valid=valid))
  np.testing.assert_array_equal(state.filled, [3, 2])
  np.testing.assert_array_equal(m["arm_counts"], [1, 1])
  np.testing.assert_allclose(m["recent"], [0.2, 0.75], rtol=1e-6)
  np.testing.assert_allclose(m["alp"], [0.55, 0.0], rtol=1e-6)
  # Arm 0 pushes (4, 4) and fills its ring (3,4) (0,2) (1,3) (4,4):
  # recent (1 + 4) / (3 + 4) = 5/7, older (3 + 0) / (4 + 2) = .5, ALP 3/14.
  state, m = update(state, _feedback([0, 0], [[1, 1], [1, 1]]))
  np.testing.assert_allclose(m["recent"][0], 5 / 7, rtol=1e-6)
  np.testing.assert_allclose(m["older"][0], 0.5, rtol=1e-6)
  np.testing.assert_allclose(m["alp"], [3 / 14, 0.0], rtol=1e-6)
  # Arm 0 pushes (0, 2) over its oldest entry (3, 4): ring (0,2) (1,3) (4,4) (0,2), recent
  # 4/6, older 1/5, ALP 7/15. Arm 1 pushes (0, 2): (2,2) (1,2) (0,2), recent 1/4, older 1, ALP .75.
  state, m = update(state, _feedback([0, 1], [[0, 0], [0, 0]]))
  np.testing.assert_array_equal(state.filled, [4, 3])
  np.testing.assert_allclose(m["recent"], [2 / 3, 0.25], rtol=1e-6)
  np.testing.assert_allclose(m["older"], [0.2, 1.0], rtol=1e-6)
  alp = np.array([7 / 15, 0.75])
  np.testing.assert_allclose(m["alp"], alp, rtol=1e-6)
  np.testing.assert_allclose(m["probs"], 0.1 + 0.8 * alp / alp.sum(), rtol=1e-6)


@pytest.mark.parametrize("window", [1, 2, None])
def test_alp_windows_count_steps_not_completions(window):
  """256 prompts x 8 completions over 3 arms: accuracy 0 for W steps, then 1 for W steps.

  The older window holds the W zero steps and the recent one the W one steps, so ALP = 1 on every
  arm. Windows counted in completions fill both halves from one step of 256 x 8 outcomes and read
  ALP = 0. None builds the default window (8 steps).
  """
  kwargs = {} if window is None else {"window": window}
  steps = 8 if window is None else window
  cur = C.alp_teacher(3, batch_size=256, **kwargs)
  update = jax.jit(cur.update)
  state = cur.init(_pool(3), jax.random.key(0))
  arms = np.arange(256) % 3
  for t in range(2 * steps):
    state, m = update(state, _feedback(arms, np.full((256, 8), float(t >= steps))))
    if t < steps:  # the older window is still empty
      np.testing.assert_allclose(m["alp"], [0.0] * 3, err_msg=f"step {t + 1}")
  np.testing.assert_allclose(m["alp"], [1.0] * 3)
  np.testing.assert_allclose(m["recent"], [1.0] * 3)
  np.testing.assert_allclose(m["older"], [0.0] * 3)
  np.testing.assert_allclose(m["probs"], [1 / 3] * 3, rtol=1e-6)


def test_mastering_rate_chain():
  cur = C.mastering_rate(3, batch_size=2, unlock_threshold=0.5, mastery_threshold=0.85, rate=0.5)
  update = jax.jit(cur.update)
  state = cur.init(_pool(3), jax.random.key(0))
  sel, _ = jax.jit(cur.select)(state, jax.random.key(1))
  np.testing.assert_array_equal(sel.arms, [0, 0])  # only arm 0 is available at first
  five = lambda c: [[1.0] * c + [0.0] * (5 - c)]
  state, m = update(state, _feedback([0], five(3)))         # success .6 -> unlocks arm 1
  np.testing.assert_allclose(m["probs"], [0.5, 0.5, 0.0])
  state, m = update(state, _feedback([0], five(5)))         # .6 + .5 (1 - .6) = .8
  np.testing.assert_allclose(m["success"], [0.8, 0.0, 0.0], rtol=1e-6)
  state, m = update(state, _feedback([0], five(5)))         # .9 >= .85: arm 0 mastered
  np.testing.assert_allclose(m["probs"], [0.0, 1.0, 0.0])
  state, m = update(state, _feedback([1], five(5)))         # arm 1 at 1.0: mastered, unlocks 2
  np.testing.assert_allclose(m["probs"], [0.0, 0.0, 1.0])
  state, m = update(state, _feedback([2], five(5)))         # all mastered: all available arms
  np.testing.assert_allclose(m["probs"], [1 / 3] * 3, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Every curriculum: invariants, tracing, checkpoints, argument checks.
# ------------------------------------------------------------------------------------------------

CONSTRUCTORS = {
    "sec": lambda pool, p: C.sec(pool, batch_size=p),
    "sec_ucb_lp": lambda pool, p: C.sec(pool, batch_size=p, exploration="ucb",
                                        objective="learning_progress", unsampled="decay"),
    "uniform": lambda pool, p: C.uniform(pool, batch_size=p, by="arm"),
    "easy_to_hard": lambda pool, p: C.easy_to_hard(pool, batch_size=p, steps_per_arm=1,
                                                   accuracy_threshold=0.5),
    "linear_pacing": lambda pool, p: C.linear_pacing(pool, batch_size=p, steps_to_full=3),
    "cyclical": lambda pool, p: C.cyclical(pool, batch_size=p, period=3),
    "mixed_replay": lambda pool, p: C.mixed_replay(pool, batch_size=p, steps_per_arm=1),
    "dump": lambda pool, p: C.dump(pool, batch_size=p, window=8),
    "alp_teacher": lambda pool, p: C.alp_teacher(pool, batch_size=p, window=4),
    "mastering_rate": lambda pool, p: C.mastering_rate(pool, batch_size=p),
}


def _random_feedback(sel, key, g=3):
  r = (jax.random.uniform(key, (sel.arms.shape[0], g)) < 0.5).astype(jnp.float32)
  return Feedback(prompt_ids=sel.prompt_ids, arms=sel.arms, rewards=r, correct=r > 0,
                  advantages=r - jnp.mean(r, axis=1, keepdims=True))


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_jit_without_retracing_and_invariants(name):
  # Curricula built by one factory share code objects, and chex counts traces per code object.
  chex.clear_trace_counter()
  cur = CONSTRUCTORS[name](POOL, 6)
  select = jax.jit(chex.assert_max_traces(cur.select, n=1))
  update = jax.jit(chex.assert_max_traces(cur.update, n=1))
  state = cur.init(POOL, jax.random.key(0))
  pool_arms = np.asarray(POOL.arms)
  for t in range(4):
    sel, state = select(state, jax.random.key(10 + t))
    assert sel.prompt_ids.shape == (6,) and sel.arms.shape == (6,)
    np.testing.assert_array_equal(pool_arms[np.asarray(sel.prompt_ids)], sel.arms)
    state, metrics = update(state, _random_feedback(sel, jax.random.key(100 + t)))
    probs = np.asarray(metrics["probs"])
    assert probs.shape == (4,) and np.all(probs >= 0)
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(metrics["arm_counts"],
                                  np.bincount(np.asarray(sel.arms), minlength=4))


@pytest.mark.parametrize("name", ["sec", "dump"])
def test_checkpoint_round_trip_then_identical_selections(name, tmp_path):
  cur = CONSTRUCTORS[name](POOL, 5)
  select, update = jax.jit(cur.select), jax.jit(cur.update)
  state = cur.init(POOL, jax.random.key(0))
  for t in range(3):
    sel, state = select(state, jax.random.key(t))
    state, _ = update(state, _random_feedback(sel, jax.random.key(50 + t)))
  ckpt = ocp.StandardCheckpointer()
  path = os.path.join(tmp_path, "curriculum")
  ckpt.save(path, state)
  ckpt.wait_until_finished()
  restored = ckpt.restore(path, state)
  assert type(restored) is type(state)
  chex.assert_trees_all_equal(restored, state)

  def continue_run(s):
    out = []
    for t in range(3, 7):
      sel, s = select(s, jax.random.key(t))
      s, _ = update(s, _random_feedback(sel, jax.random.key(50 + t)))
      out.append((np.asarray(sel.prompt_ids), np.asarray(sel.arms)))
    return out

  for (ia, aa), (ib, ab) in zip(continue_run(state), continue_run(restored)):
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(aa, ab)


def test_select_is_deterministic_given_key():
  """Two curricula built alike give equal selections for equal keys; another key differs."""
  def first(key):
    cur = C.sec(POOL, batch_size=8)
    sel, _ = jax.jit(cur.select)(cur.init(POOL, jax.random.key(0)), key)
    return np.asarray(sel.prompt_ids)
  a, b, c = first(jax.random.key(3)), first(jax.random.key(3)), first(jax.random.key(4))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@pytest.mark.parametrize("build,match", [
    (lambda: C.sec(4, batch_size=2, objective="abs_adv"), "objective must be one of"),
    (lambda: C.sec(4, batch_size=2, unsampled="drop"), "unsampled must be one of"),
    (lambda: C.sec(4, batch_size=2, exploration="thompson"), "exploration must be one of"),
    (lambda: C.sec(4, batch_size=2, alpha=0.0), "alpha"),
    (lambda: C.sec(4, batch_size=2, temperature=0.0), "temperature"),
    (lambda: C.sec(4, batch_size=0), "batch_size"),
    (lambda: C.sec(0, batch_size=2), "pool_or_num_arms"),
    (lambda: C.uniform(4, batch_size=2, by="task"), "by must be one of"),
    (lambda: C.easy_to_hard(3, batch_size=2, order=[0, 0, 1]), "order"),
    (lambda: C.easy_to_hard(3, batch_size=2, steps_per_arm=None), "steps_per_arm"),
    (lambda: C.mixed_replay(3, batch_size=2, replay_prob=1.5), "replay_prob"),
    (lambda: C.dump(3, batch_size=2, window=0), "window"),
    (lambda: C.alp_teacher(3, batch_size=2, epsilon=-0.1), "epsilon"),
    (lambda: C.mastering_rate(3, batch_size=2, prerequisites=[(0, 3)]), "prerequisites"),
])
def test_bad_arguments_raise(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_init_rejects_a_pool_with_other_arm_count():
  with pytest.raises(ValueError, match="built for 3 arms"):
    C.sec(3, batch_size=2).init(POOL, jax.random.key(0))


def test_update_rejects_mismatched_feedback_shapes():
  cur = C.sec(3, batch_size=4)
  state = _sec_state(cur, Q0)
  bad = _feedback(FB_ARMS, FB_REWARDS, FB_ADV)._replace(advantages=jnp.zeros((4, 3)))
  with pytest.raises(ValueError, match="advantages"):
    cur.update(state, bad)
  bad = _feedback(FB_ARMS, FB_REWARDS, FB_ADV)._replace(arms=jnp.zeros((5,), jnp.int32))
  with pytest.raises(ValueError, match="arms"):
    cur.update(state, bad)
