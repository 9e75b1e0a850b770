"""Tests for rl_curriculum/curriculum/sec.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.sec import (SEC_OBJECTIVES, sec, sec_arm_rewards,
                                          sec_probabilities)
import test_util

# Upper 0.1% points of the chi-square distribution (standard tables), by degrees of freedom.
CHI2_CRIT_999 = {2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}

SIZES = (3, 5, 2, 6)
POOL = PromptPool.from_arms(np.repeat(np.arange(4), SIZES))


# ------------------------------------------------------------------------------------------------
# SEC: hand-computed updates.
# ------------------------------------------------------------------------------------------------

# Arms 0, 0, 1, 1; arm 2 unsampled. G = 2.
FB_ARMS = [0, 0, 1, 1]
FB_REWARDS = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
FB_ADV = [[0.5, -0.5], [0.0, 0.0], [0.2, -0.6], [1.0, -1.0]]
FB_VALID = [[True, True], [True, False], [True, True], [False, True]]
Q0 = np.array([0.2, 0.4, 0.6], np.float32)
FB_IDS = [0, 0, 0, 0]  # category curricula ignore prompt ids


def _sec_state(cur, q, visits=None, last=None):
  state = cur.init(test_util.arm_pool(3), jax.random.key(0))
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
@test_util.JIT
def test_sec_update_hand_computed(objective, unsampled, use_valid, expected, use_jit):
  cur = sec(3, batch_size=4, alpha=0.5, objective=objective, unsampled=unsampled)
  state = _sec_state(cur, Q0)
  fb = test_util.feedback(rewards=FB_REWARDS, ids=FB_IDS, arms=FB_ARMS, advantages=FB_ADV,
                          valid=FB_VALID if use_valid else None)
  update = test_util.maybe_jit(cur.update, use_jit)
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
  cur = sec(3, batch_size=4, alpha=0.5, objective="learning_progress", unsampled=unsampled)
  update = jax.jit(cur.update)
  state = _sec_state(cur, Q0)
  # Mean rewards: arm 0 (1 + 0 + 1 + 1) / 4 = .75, arm 1 (0 + 0 + 1 + 0) / 4 = .25.
  state, m1 = update(state, test_util.feedback(rewards=FB_REWARDS, ids=FB_IDS, arms=FB_ARMS,
                                               advantages=FB_ADV))
  np.testing.assert_allclose(m1["arm_reward"], [0.0, 0.0, 0.0], atol=1e-7)
  decayed = 0.3 if unsampled == "decay" else 0.6
  np.testing.assert_allclose(state.q, [0.1, 0.2, decayed], rtol=1e-6)
  np.testing.assert_allclose(state.last_mean_reward, [0.75, 0.25, 0.0], rtol=1e-6)
  # Second step: arm 0 all wrong (mean 0), arm 2 all right (first visit), arm 1 unsampled.
  state, m2 = update(state, test_util.feedback(rewards=[[0, 0], [0, 0], [1, 1], [1, 1]],
                                               ids=FB_IDS, arms=[0, 0, 2, 2]))
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


@pytest.mark.parametrize("objective", SEC_OBJECTIVES)
def test_sec_arm_rewards_match_loop_reference(objective):
  rng = np.random.default_rng(3)
  p, g, k = 12, 5, 4
  arms = rng.integers(0, k - 1, size=p)  # arm k-1 never sampled
  rewards = rng.uniform(size=(p, g)).astype(np.float32)
  adv = rng.normal(size=(p, g)).astype(np.float32)
  valid = rng.uniform(size=(p, g)) < 0.7
  last = rng.uniform(size=k).astype(np.float32)
  visits = np.array([0, 2, 1, 0], np.int32)
  fb = test_util.feedback(rewards=rewards, ids=np.zeros(p), arms=arms, advantages=adv,
                          valid=valid)
  fn = jax.jit(sec_arm_rewards, static_argnums=(1, 2))
  r, sampled, _ = fn(fb, k, objective, jnp.asarray(last), jnp.asarray(visits))
  np.testing.assert_allclose(r, _ref_sec_rewards(arms, rewards, adv, valid, k, objective, last,
                                                 visits), rtol=1e-5, atol=1e-6)
  assert not bool(sampled[k - 1])


def test_sec_alpha_one_sets_q_to_last_reward():
  cur = sec(3, batch_size=4, alpha=1.0)
  fb = test_util.feedback(rewards=FB_REWARDS, ids=FB_IDS, arms=FB_ARMS, advantages=FB_ADV)
  state, metrics = jax.jit(cur.update)(_sec_state(cur, Q0), fb)
  np.testing.assert_allclose(state.q[:2], metrics["arm_reward"][:2], rtol=1e-6)
  np.testing.assert_allclose(state.q, [0.25, 0.7, 0.6], rtol=1e-6)


def test_sec_keep_leaves_unsampled_arms_unchanged():
  cur = sec(3, batch_size=4)
  update = jax.jit(cur.update)
  state = _sec_state(cur, Q0)
  fb = test_util.feedback(rewards=FB_REWARDS, ids=FB_IDS, arms=FB_ARMS, advantages=FB_ADV)
  for _ in range(3):
    state, _ = update(state, fb)
    assert float(state.q[2]) == float(np.float32(0.6))  # bit for bit


# ------------------------------------------------------------------------------------------------
# SEC: selection distributions.
# ------------------------------------------------------------------------------------------------

def test_sec_probabilities_hand_computed():
  q = jnp.array([0.1, 0.5, 0.5, 0.2])
  sizes = jnp.array([2, 2, 2, 0])
  p = sec_probabilities(q, jnp.zeros(4, jnp.int32), sizes, "boltzmann", 0.5, 0.1, 1.0)
  e = np.exp(np.array([0.1, 0.5, 0.5]) / 0.5)
  np.testing.assert_allclose(p, list(e / e.sum()) + [0.0], rtol=1e-6)
  p = sec_probabilities(q, jnp.zeros(4, jnp.int32), sizes, "epsilon_greedy", 1.0, 0.3, 1.0)
  np.testing.assert_allclose(p, [0.1, 0.1 + 0.35, 0.1 + 0.35, 0.0], rtol=1e-6)
  # UCB: every arm tried once first (untried arms share the mass) ...
  p = sec_probabilities(q, jnp.array([3, 0, 0, 0]), sizes, "ucb", 1.0, 0.1, 1.0)
  np.testing.assert_allclose(p, [0.0, 0.5, 0.5, 0.0])
  # ... then argmax of q + c sqrt(ln N / n): N = 8, scores .1 + sqrt(ln8/4) = .821,
  # .5 + sqrt(ln8 / 1) = 1.942, .5 + sqrt(ln8 / 3) = 1.333.
  q3 = jnp.array([0.1, 0.5, 0.5])
  p = sec_probabilities(q3, jnp.array([4, 1, 3]), jnp.array([1, 1, 1]), "ucb", 1.0, 0.1, 1.0)
  np.testing.assert_allclose(p, [0.0, 1.0, 0.0])
  p = sec_probabilities(q3, jnp.array([1, 4, 3]), jnp.array([1, 1, 1]), "ucb", 1.0, 0.1, 0.1)
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
  cur = sec(POOL, batch_size=512, temperature=temperature, exploration=exploration, epsilon=0.2)
  state = cur.init(POOL, jax.random.key(0))._replace(q=jnp.array([0.1, 0.9, 0.4, 0.6]))
  keys = jax.random.split(jax.random.key(7), 64)
  sels, _ = jax.jit(jax.vmap(cur.select, in_axes=(None, 0)))(state, keys)
  counts = np.bincount(np.asarray(sels.arms).ravel(), minlength=4)
  probs = np.asarray(sec_probabilities(state.q, state.visits, state.sampler.sizes, exploration,
                                         temperature, 0.2, 1.0), np.float64)
  if exploration == "boltzmann":
    ref = np.exp(np.array([0.1, 0.9, 0.4, 0.6]) / temperature)
    np.testing.assert_allclose(probs, ref / ref.sum(), rtol=1e-6)
  stat, df = _chi2(counts, probs)
  assert stat < CHI2_CRIT_999[df], (stat, counts, probs)
  # The test can fail: the same counts against a visibly different distribution do not fit.
  stat_wrong, _ = _chi2(counts, np.roll(probs, 1))
  assert stat_wrong > CHI2_CRIT_999[df]


def test_select_is_deterministic_given_key():
  """Two curricula built alike give equal selections for equal keys; another key differs."""
  def first(key):
    cur = sec(POOL, batch_size=8)
    sel, _ = jax.jit(cur.select)(cur.init(POOL, jax.random.key(0)), key)
    return np.asarray(sel.prompt_ids)
  a, b, c = first(jax.random.key(3)), first(jax.random.key(3)), first(jax.random.key(4))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_update_rejects_mismatched_feedback_shapes():
  cur = sec(3, batch_size=4)
  state = _sec_state(cur, Q0)
  fb = test_util.feedback(rewards=FB_REWARDS, ids=FB_IDS, arms=FB_ARMS, advantages=FB_ADV)
  bad = fb._replace(advantages=jnp.zeros((4, 3)))
  with pytest.raises(ValueError, match="advantages"):
    cur.update(state, bad)
  bad = fb._replace(arms=jnp.zeros((5,), jnp.int32))
  with pytest.raises(ValueError, match="arms"):
    cur.update(state, bad)
