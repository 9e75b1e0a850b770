"""Tests of rl_curriculum/rl/credit.py: turns read from a mask, rewards and advantages placed on
turns, returns to go, and turn-level advantages, with the bias of per-turn-index normalisation
measured on a toy whose policy decides when its episode stops."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.rl import advantages
from rl_curriculum.rl import credit
import test_util

# Three rows of 9 positions: two turns with an observation between them and padding after; one
# turn; nothing drawn.
MASK = np.array([[1, 1, 0, 0, 1, 1, 1, 0, 0],
                 [1, 1, 1, 1, 0, 0, 0, 0, 0],
                 [0, 0, 0, 0, 0, 0, 0, 0, 0]], np.float32)


@test_util.JIT
def test_turns_are_runs_of_drawn_positions(use_jit):
  fns = {name: test_util.maybe_jit(getattr(credit, name), use_jit)
         for name in ("turn_starts", "turn_ends", "turn_index", "turn_count", "last_drawn",
                      "used_positions")}
  m = jnp.asarray(MASK)
  np.testing.assert_array_equal(fns["turn_starts"](m)[0], [1, 0, 0, 0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(fns["turn_ends"](m)[0], [0, 1, 0, 0, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(fns["turn_ends"](m)[1], [0, 0, 0, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(fns["turn_index"](m), [[0, 0, -1, -1, 1, 1, 1, -1, -1],
                                                       [0, 0, 0, 0, -1, -1, -1, -1, -1],
                                                       [-1] * 9])
  np.testing.assert_array_equal(fns["turn_count"](m), [2, 1, 0])
  np.testing.assert_array_equal(fns["last_drawn"](m), [6, 3, 0])
  # Positions used, observations included: the unit of a length cap over positions.
  np.testing.assert_array_equal(fns["used_positions"](m), [7, 4, 0])


@test_util.JIT
def test_turn_values_land_on_their_turns_and_never_on_observations(use_jit):
  values = jnp.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
  ends = test_util.maybe_jit(credit.on_turn_ends, use_jit)(values, jnp.asarray(MASK))
  every = test_util.maybe_jit(credit.on_turn_tokens, use_jit)(values, jnp.asarray(MASK))
  np.testing.assert_array_equal(ends, [[0, 1, 0, 0, 0, 0, 2, 0, 0], [0, 0, 0, 3, 0, 0, 0, 0, 0],
                                       [0] * 9])
  np.testing.assert_array_equal(every, [[1, 1, 0, 0, 2, 2, 2, 0, 0], [3, 3, 3, 3, 0, 0, 0, 0, 0],
                                        [0] * 9])


@test_util.JIT
@pytest.mark.parametrize("discount", [1.0, 0.9, 0.0])
def test_returns_to_go_match_their_definition(use_jit, discount):
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=(2, 3, 4)).astype(np.float32)
  got = test_util.maybe_jit(credit.returns_to_go, use_jit)(rewards, jnp.float32(discount))
  want = np.zeros_like(rewards, dtype=np.float64)
  for k in range(4):
    want[..., k] = sum(discount ** (j - k) * rewards[..., j].astype(np.float64)
                       for j in range(k, 4))
  np.testing.assert_allclose(got, want, **test_util.TOL)


@test_util.JIT
def test_shaped_turn_rewards_add_up_to_the_shaped_return(use_jit):
  turn_rewards = jnp.array([[[0.25, 0.5, 7.0], [0.75, 7.0, 7.0]]])
  turns = jnp.array([[2, 1]], jnp.int32)
  returns = jnp.array([[-0.4, 0.3]])
  got = np.asarray(test_util.maybe_jit(credit.shaped_turn_rewards, use_jit)(
      turn_rewards, turns, returns))
  np.testing.assert_allclose(got, [[[0.25, -0.65, 0.0], [0.3, 0.0, 0.0]]], **test_util.TOL)
  # An episode of one turn gets its shaped return itself, to the bit.
  assert got[0, 1, 0] == np.float32(0.3)


def _turn_advantages_reference(turn_rewards, turns, valid, discount):
  """NumPy RLOO of each turn index's returns to go, absent turns counting 0."""
  p, g, h = turn_rewards.shape
  to_go = np.zeros((p, g, h))
  for a, b in itertools.product(range(p), range(g)):
    for k in range(turns[a, b]):
      to_go[a, b, k] = sum(discount ** (j - k) * turn_rewards[a, b, j]
                           for j in range(k, turns[a, b]))
  out = np.zeros((p, g, h))
  for a, k in itertools.product(range(p), range(h)):
    members = np.flatnonzero(valid[a])
    if len(members) < 2 or np.ptp(to_go[a, members, k]) == 0:
      continue
    for b in members:
      if k < turns[a, b]:
        others = [to_go[a, j, k] for j in members if j != b]
        out[a, b, k] = to_go[a, b, k] - np.mean(others)
  return out


@test_util.JIT
@pytest.mark.parametrize("discount", [1.0, 0.8])
def test_turn_advantages_are_leave_one_out_at_each_turn(use_jit, discount):
  rng = np.random.default_rng(1)
  p, g, h = 3, 4, 3
  turns = rng.integers(1, h + 1, (p, g)).astype(np.int32)
  turn_rewards = rng.random((p, g, h)).astype(np.float32) * (np.arange(h) < turns[..., None])
  valid = np.ones((p, g), bool)
  valid[2, 3] = False
  fn = test_util.maybe_jit(credit.turn_advantages, use_jit, estimator="rloo")
  got = fn(turn_rewards, turns, valid, discount=jnp.float32(discount))
  want = _turn_advantages_reference(turn_rewards, turns, valid, discount)
  np.testing.assert_allclose(got, want, **test_util.TOL)


# --- The bias of per-turn-index normalisation --------------------------------------------------
#
# A policy with one parameter theta plays episodes of at most H = 3 turns. Each turn it goes on
# (a tool call, probability p = sigmoid(theta)), paid C = 0.3 for it, or stops with an answer
# paid ANSWER[k] at turn k; going on at the third turn ends the episode unanswered. The episode
# types are "stop at turn 1, 2, 3" and "cut"; groups of G episodes are enumerated whole, so each
# estimator's expected gradient is exact, to float rounding.

H, G, C = 3, 3, 0.3
ANSWER = np.array([0.0, 1.0, 0.4])
THETA = 0.2


def _episodes():
  """[(go-on decisions, turn rewards f64[H], turns)] of the four episode types."""
  out = []
  for stop in range(H):  # stop at turn stop + 1
    rewards = np.zeros(H)
    rewards[:stop] = C
    rewards[stop] = ANSWER[stop]
    out.append(([True] * stop + [False], rewards, stop + 1))
  out.append(([True] * H, np.full(H, C), H))
  return out


def _probability(decisions, p):
  return np.prod([p if go else 1 - p for go in decisions])


def _true_gradient() -> float:
  def j(theta):
    p = jax.nn.sigmoid(theta)
    return sum(jnp.prod(jnp.array([p if go else 1 - p for go in decisions])) * rewards.sum()
               for decisions, rewards, _ in _episodes())
  return float(jax.grad(j)(jnp.float64(THETA) if jax.config.jax_enable_x64 else THETA))


def _expected_gradient(turn_advantage) -> float:
  """E[(1/G) sum_i sum_k A_ik d/dtheta log pi(a_ik)] over every group of G episodes;
  turn_advantage(turn_rewards f32[G, H], turns i32[G]) -> f32[G, H]."""
  p = 1 / (1 + np.exp(-THETA))
  episodes = _episodes()
  total = 0.0
  for group in itertools.product(range(len(episodes)), repeat=G):
    chosen = [episodes[i] for i in group]
    weight = np.prod([_probability(d, p) for d, _, _ in chosen])
    adv = np.asarray(turn_advantage(np.stack([r for _, r, _ in chosen]).astype(np.float32),
                                    np.array([n for _, _, n in chosen], np.int32)), np.float64)
    score = sum(adv[i, k] * ((1 - p) if go else -p)
                for i, (decisions, _, _) in enumerate(chosen) for k, go in enumerate(decisions))
    total += weight * score / G
  return total


def _episode_credit(turn_rewards, turns):
  returns = jnp.asarray(turn_rewards).sum(axis=1)[None]
  adv = advantages.group_advantages(returns, jnp.ones((1, G), bool), "rloo")[0]
  return np.where(np.arange(H)[None] < turns[:, None], np.asarray(adv)[:, None], 0.0)


def _turn_credit(turn_rewards, turns):
  return credit.turn_advantages(turn_rewards[None], turns[None], np.ones((1, G), bool), "rloo",
                                discount=1.0)[0]


def _per_turn_index_normalised(turn_rewards, turns):
  """The construction of verl RFC #7244 (per-turn-index normalisation, MT-GRPO style), centred
  leave-one-out so that nothing but its structure differs from the estimators above: each turn
  index j's immediate rewards compared with the mean of the other episodes that reached turn j,
  those differences summed over the turns the episode itself went on to take."""
  centred = np.zeros((G, H))
  for i, j in itertools.product(range(G), range(H)):
    if j < turns[i]:
      others = [turn_rewards[l, j] for l in range(G) if l != i and j < turns[l]]
      centred[i, j] = turn_rewards[i, j] - (np.mean(others) if others else 0.0)
  return np.array([[centred[i, k:turns[i]].sum() if k < turns[i] else 0.0 for k in range(H)]
                   for i in range(G)])


def test_episode_and_turn_credit_are_unbiased_and_per_turn_index_normalisation_is_not():
  """verl RFC #7244: when the policy decides when its episode stops, normalising per turn index
  subtracts one baseline term per turn the episode took, an action-dependent baseline. Episode
  credit (the default) and turn credit give the exact policy gradient in expectation."""
  truth = _true_gradient()
  assert abs(truth) > 0.05  # the toy has a gradient to get right
  for name, estimator in (("episode", _episode_credit), ("turn", _turn_credit)):
    np.testing.assert_allclose(_expected_gradient(estimator), truth, rtol=1e-5, atol=1e-6,
                               err_msg=name)
  biased = _expected_gradient(_per_turn_index_normalised)
  # Going on is charged the group mean of later turns' rewards: the gradient toward going on is
  # underestimated by far more than any rounding.
  assert biased < truth - 0.02, (biased, truth)
