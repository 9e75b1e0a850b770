"""Tests for rl_curriculum.rl.advantages: NumPy loop references, jit agreement, invariants."""

import doctest
import functools
import math

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.rl import advantages
import test_util



# --- NumPy references: explicit loops over groups, float64 ---------------------------------------


def _valid_or_all(rewards, valid):
  return np.ones(rewards.shape, bool) if valid is None else np.asarray(valid, bool)


def ref_rloo(rewards, valid=None):
  rewards = np.asarray(rewards, np.float64)
  valid = _valid_or_all(rewards, valid)
  out = np.zeros_like(rewards)
  p_count, g_count = rewards.shape
  for p in range(p_count):
    idx = [g for g in range(g_count) if valid[p, g]]
    vals = [rewards[p, g] for g in idx]
    if len(idx) < 2 or max(vals) == min(vals):
      continue
    for g in idx:
      others = [rewards[p, j] for j in idx if j != g]
      out[p, g] = rewards[p, g] - sum(others) / len(others)
  return out


def ref_grpo(rewards, valid=None, eps=1e-6, unbiased=False):
  rewards = np.asarray(rewards, np.float64)
  valid = _valid_or_all(rewards, valid)
  out = np.zeros_like(rewards)
  for p in range(rewards.shape[0]):
    idx = [g for g in range(rewards.shape[1]) if valid[p, g]]
    vals = [rewards[p, g] for g in idx]
    if not vals or max(vals) == min(vals):
      continue
    mean = sum(vals) / len(vals)
    ss = sum((v - mean) ** 2 for v in vals)
    std = math.sqrt(ss / (len(vals) - 1 if unbiased else len(vals)))
    for g in idx:
      out[p, g] = (rewards[p, g] - mean) / (std + eps)
  return out


def ref_dr_grpo(rewards, valid=None):
  rewards = np.asarray(rewards, np.float64)
  valid = _valid_or_all(rewards, valid)
  out = np.zeros_like(rewards)
  for p in range(rewards.shape[0]):
    idx = [g for g in range(rewards.shape[1]) if valid[p, g]]
    vals = [rewards[p, g] for g in idx]
    if not vals or max(vals) == min(vals):
      continue
    mean = sum(vals) / len(vals)
    for g in idx:
      out[p, g] = rewards[p, g] - mean
  return out


def ref_reinforce_pp(rewards, valid=None, eps=1e-6):
  rewards = np.asarray(rewards, np.float64)
  valid = _valid_or_all(rewards, valid)
  centred = ref_dr_grpo(rewards, valid)
  entries = [centred[p, g] for p in range(rewards.shape[0]) for g in range(rewards.shape[1])
             if valid[p, g]]
  if not entries:
    return centred
  mean = sum(entries) / len(entries)
  std = math.sqrt(sum((c - mean) ** 2 for c in entries) / len(entries))
  out = np.zeros_like(rewards)
  for p in range(rewards.shape[0]):
    for g in range(rewards.shape[1]):
      if valid[p, g]:
        out[p, g] = (centred[p, g] - mean) / (std + eps)
  return out


def ref_gae(rewards, values, lengths, gamma, lam):
  """GAE from its definition A_t = sum_l (gamma lam)^l delta_{t+l} on rows of given length."""
  b_count, t_count = rewards.shape
  adv = np.zeros((b_count, t_count))
  for b in range(b_count):
    n = lengths[b]
    delta = []
    for t in range(n):
      v_next = values[b, t + 1] if t + 1 < n else 0.0
      delta.append(rewards[b, t] + gamma * v_next - values[b, t])
    for t in range(n):
      adv[b, t] = sum((gamma * lam) ** l * delta[t + l] for l in range(n - t))
  returns = np.zeros_like(adv)
  for b in range(b_count):
    for t in range(lengths[b]):
      returns[b, t] = adv[b, t] + values[b, t]
  return adv, returns


# --- Hand-checked values ------------------------------------------------------------------------


REWARDS = np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 6.0]], np.float32)
VALID = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]], bool)


@test_util.JIT
def test_rloo_hand_values(use_jit):
  out = test_util.maybe_jit(advantages.rloo, use_jit)(jnp.asarray(REWARDS))
  expected = np.array([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0, 0, 0, 0], [0, -8 / 3, -4 / 3, 4]])
  np.testing.assert_allclose(out, expected, **test_util.TOL)


@test_util.JIT
def test_grpo_hand_values(use_jit):
  out = test_util.maybe_jit(advantages.grpo, use_jit, eps=0.0)(jnp.asarray(REWARDS))
  # Group 2: mean 3, population std sqrt((0 + 4 + 1 + 9) / 4).
  std = math.sqrt(14 / 4)
  expected = np.array([[1, -1, -1, 1], [0, 0, 0, 0], [0, -2 / std, -1 / std, 3 / std]])
  np.testing.assert_allclose(out, expected, **test_util.TOL)


@test_util.JIT
@pytest.mark.parametrize("name", ["rloo", "grpo", "grpo_unbiased", "dr_grpo", "reinforce_pp"])
@pytest.mark.parametrize("with_valid", [False, True])
def test_group_estimators_match_reference(use_jit, name, with_valid):
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=(5, 6)).astype(np.float32)
  rewards[1] = 0.25  # a constant group
  valid = rng.random((5, 6)) < 0.7 if with_valid else None
  if with_valid:
    valid[2] = False  # a prompt with no completion
    valid[3, 1:] = False  # a prompt with a single completion
  fn, ref = {
      "rloo": (advantages.rloo, ref_rloo),
      "grpo": (advantages.grpo, ref_grpo),
      "grpo_unbiased": (functools.partial(advantages.grpo, unbiased_std=True),
                        functools.partial(ref_grpo, unbiased=True)),
      "dr_grpo": (advantages.dr_grpo, ref_dr_grpo),
      "reinforce_pp": (advantages.reinforce_pp, ref_reinforce_pp),
  }[name]
  kwargs = {} if valid is None else {"valid": jnp.asarray(valid)}
  out = test_util.maybe_jit(fn, use_jit)(jnp.asarray(rewards), **kwargs)
  assert out.dtype == jnp.float32 and out.shape == rewards.shape
  np.testing.assert_allclose(out, ref(rewards, valid), **test_util.TOL)
  if valid is not None:
    assert np.all(np.asarray(out)[~valid] == 0.0)


@test_util.JIT
def test_counterfactual_matches_reference(use_jit):
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=(4, 3)).astype(np.float32)
  baseline = rng.random(4).astype(np.float32)
  valid = rng.random((4, 3)) < 0.6
  expected = np.zeros((4, 3))
  for p in range(4):
    for g in range(3):
      if valid[p, g]:
        expected[p, g] = float(rewards[p, g]) - float(baseline[p])
  fn = test_util.maybe_jit(advantages.counterfactual, use_jit)
  np.testing.assert_allclose(fn(rewards, baseline, valid=valid), expected, **test_util.TOL)
  full = fn(rewards, baseline)
  np.testing.assert_allclose(full, rewards - baseline[:, None], **test_util.TOL)


@test_util.JIT
@pytest.mark.parametrize("estimator,grpo_std,ref", [
    ("rloo", "population", ref_rloo), ("grpo", "population", ref_grpo),
    ("grpo", "sample", functools.partial(ref_grpo, unbiased=True)),
    ("dr_grpo", "population", ref_dr_grpo), ("reinforce_pp", "population", ref_reinforce_pp)])
def test_group_advantages_dispatch_to_the_named_estimator(use_jit, estimator, grpo_std, ref):
  rng = np.random.default_rng(2)
  rewards = rng.normal(size=(4, 5)).astype(np.float32)
  valid = rng.random((4, 5)) < 0.7
  fn = test_util.maybe_jit(advantages.group_advantages, use_jit, estimator=estimator,
                           grpo_std=grpo_std)
  out = fn(jnp.asarray(rewards), jnp.asarray(valid))
  np.testing.assert_allclose(out, ref(rewards, valid) * valid, **test_util.TOL)


def test_group_advantages_counterfactual_subtracts_the_baseline_and_needs_one():
  rewards = jnp.array([[1.0, 0.0], [0.0, 0.0]])
  valid = jnp.array([[True, True], [True, False]])
  out = advantages.group_advantages(rewards, valid, "counterfactual",
                                    baseline=jnp.array([0.5, 0.25]))
  np.testing.assert_allclose(out, [[0.5, -0.5], [-0.25, 0.0]], **test_util.TOL)
  with pytest.raises(ValueError, match="baseline"):
    advantages.group_advantages(rewards, valid, "counterfactual")
  with pytest.raises(ValueError, match="unknown advantage estimator"):
    advantages.group_advantages(rewards, valid, "ppo")


def test_rloo_zero_for_single_completion():
  out = advantages.rloo(jnp.array([[3.0], [-1.0]]))
  np.testing.assert_array_equal(out, np.zeros((2, 1)))


def test_bfloat16_rewards_give_float32():
  rewards = jnp.asarray(REWARDS, jnp.bfloat16)
  for fn in (advantages.rloo, advantages.grpo, advantages.dr_grpo, advantages.reinforce_pp):
    out = fn(rewards)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, fn(rewards.astype(jnp.float32)), **test_util.TOL)


def test_rank_assertion():
  with pytest.raises(AssertionError):
    advantages.grpo(jnp.zeros((4,)))


# --- Property tests -----------------------------------------------------------------------------

# Rewards on a 1/8 grid: exact in float32 (so group sums are exact), ties and constant groups are
# frequent, as with the binary rewards of verifiable tasks.
GRID = st.integers(-32, 32).map(lambda k: k / 8.0)


@st.composite
def reward_batches(draw, values=GRID):
  # A few shapes only: each new shape costs a compilation, the values are what vary.
  p = draw(st.sampled_from([1, 2, 5]))
  g = draw(st.sampled_from([1, 2, 3, 8]))
  rewards = np.array(draw(st.lists(values, min_size=p * g, max_size=p * g)), np.float32)
  valid = np.array(draw(st.lists(st.booleans(), min_size=p * g, max_size=p * g)), bool)
  use_valid = draw(st.booleans())
  return rewards.reshape(p, g), (valid.reshape(p, g) if use_valid else None)


def _kwargs(valid):
  return {} if valid is None else {"valid": jnp.asarray(valid)}


# Jitted once at module level: property tests see many shapes, and one compilation per shape is
# much cheaper than op-by-op dispatch compiling every primitive per shape.
RLOO = jax.jit(advantages.rloo)
GRPO = jax.jit(advantages.grpo)
DR_GRPO = jax.jit(advantages.dr_grpo)
REINFORCE_PP = jax.jit(advantages.reinforce_pp)


@test_util.SETTINGS
@hypothesis.given(reward_batches())
def test_property_group_estimators(batch):
  rewards, valid = batch
  kw = _kwargs(valid)
  np.testing.assert_allclose(RLOO(rewards, **kw), ref_rloo(rewards, valid), **test_util.TOL)
  np.testing.assert_allclose(GRPO(rewards, **kw), ref_grpo(rewards, valid), **test_util.TOL)
  np.testing.assert_allclose(DR_GRPO(rewards, **kw), ref_dr_grpo(rewards, valid), **test_util.TOL)
  np.testing.assert_allclose(
      REINFORCE_PP(rewards, **kw), ref_reinforce_pp(rewards, valid), rtol=1e-5,
      atol=1e-4)


@test_util.SETTINGS
@hypothesis.given(reward_batches(values=st.floats(-10, 10, width=32)))
def test_property_rloo_dr_grpo_sum_to_zero(batch):
  rewards, valid = batch
  kw = _kwargs(valid)
  w = np.ones(rewards.shape, bool) if valid is None else valid
  for fn in (RLOO, DR_GRPO):
    out = np.asarray(fn(rewards, **kw), np.float64)
    np.testing.assert_allclose(out.sum(axis=1), 0.0, atol=1e-4)
    assert np.all(out[~w] == 0.0)
  np.testing.assert_allclose(RLOO(rewards, **kw), ref_rloo(rewards, valid), **test_util.TOL)
  np.testing.assert_allclose(DR_GRPO(rewards, **kw), ref_dr_grpo(rewards, valid), **test_util.TOL)


@test_util.SETTINGS
@hypothesis.given(reward_batches())
def test_property_grpo_standardised(batch):
  rewards, valid = batch
  w = np.ones(rewards.shape, bool) if valid is None else valid
  eps = 1e-6
  out = np.asarray(GRPO(rewards, eps=eps, **_kwargs(valid)), np.float64)
  for p in range(rewards.shape[0]):
    vals = rewards[p][w[p]].astype(np.float64)
    a = out[p][w[p]]
    if vals.size == 0 or vals.max() == vals.min():
      np.testing.assert_array_equal(out[p], 0.0)
      continue
    std = vals.std()
    np.testing.assert_allclose(a.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(a.std(), std / (std + eps), rtol=1e-5)  # 1 up to eps
    np.testing.assert_allclose(a.std(), 1.0, rtol=1e-4)


@test_util.SETTINGS
@hypothesis.given(reward_batches())
def test_property_reinforce_pp_whitened(batch):
  rewards, valid = batch
  w = np.ones(rewards.shape, bool) if valid is None else valid
  out = np.asarray(REINFORCE_PP(rewards, **_kwargs(valid)), np.float64)[w]
  if out.size and np.any(out != 0):
    np.testing.assert_allclose(out.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(), 1.0, rtol=1e-4)


# --- GAE ----------------------------------------------------------------------------------------


@test_util.JIT
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_matches_definition(use_jit, gamma, lam):
  rng = np.random.default_rng(2)
  b, t = 4, 7
  lengths = [7, 4, 0, 1]
  rewards = rng.normal(size=(b, t)).astype(np.float32)
  values = rng.normal(size=(b, t)).astype(np.float32)
  mask = np.array([[1.0 if j < n else 0.0 for j in range(t)] for n in lengths], np.float32)
  fn = test_util.maybe_jit(advantages.gae, use_jit, gamma=gamma, lam=lam)
  adv, ret = fn(rewards, values, mask)
  ref_adv, ref_ret = ref_gae(rewards, values, lengths, gamma, lam)
  np.testing.assert_allclose(adv, ref_adv, **test_util.TOL)
  np.testing.assert_allclose(ret, ref_ret, **test_util.TOL)


@test_util.JIT
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.7)])
def test_gae_passes_over_observations_between_turns(use_jit, gamma, lam):
  """A row with observations between its turns (mask 0 there) gets the GAE of its drawn tokens
  alone, taken in order: an outcome reward on the last turn reaches the first; nothing is read
  at, or written to, an observation position."""
  rng = np.random.default_rng(4)
  mask = np.array([[1, 1, 0, 0, 1, 1, 1, 0], [1, 0, 1, 0, 1, 0, 0, 0], [0, 0, 1, 1, 0, 1, 0, 0]],
                  np.float32)
  rewards = rng.normal(size=mask.shape).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  fn = test_util.maybe_jit(advantages.gae, use_jit, gamma=gamma, lam=lam)
  adv, ret = (np.asarray(x) for x in fn(rewards, values, mask))
  for b in range(mask.shape[0]):
    drawn = np.flatnonzero(mask[b])
    ref_adv, ref_ret = ref_gae(rewards[b:b + 1, drawn], values[b:b + 1, drawn], [len(drawn)],
                               gamma, lam)
    np.testing.assert_allclose(adv[b, drawn], ref_adv[0], **test_util.TOL)
    np.testing.assert_allclose(ret[b, drawn], ref_ret[0], **test_util.TOL)
    np.testing.assert_array_equal(adv[b, mask[b] == 0], 0.0)
    np.testing.assert_array_equal(ret[b, mask[b] == 0], 0.0)
  outcome = np.zeros_like(rewards)
  outcome[0, 6] = 1.0
  first, _ = advantages.gae(outcome, np.zeros_like(values), mask, gamma=1.0, lam=1.0)
  np.testing.assert_array_equal(np.asarray(first)[0], [1, 1, 0, 0, 1, 1, 1, 0])


def test_gae_lambda_one_is_monte_carlo_and_ignores_padding():
  rng = np.random.default_rng(3)
  rewards = rng.normal(size=(3, 6)).astype(np.float32)
  values = rng.normal(size=(3, 6)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], np.float32)
  adv, ret = advantages.gae(rewards, values, mask, gamma=1.0, lam=1.0)
  for b in range(3):
    n = int(mask[b].sum())
    for t in range(n):
      mc = sum(float(rewards[b, s]) for s in range(t, n))
      np.testing.assert_allclose(ret[b, t], mc, **test_util.TOL)
      np.testing.assert_allclose(adv[b, t], mc - float(values[b, t]), **test_util.TOL)
  garbage = np.where(mask > 0, 0.0, 1e6).astype(np.float32)
  adv2, ret2 = advantages.gae(rewards + garbage, values - garbage, mask, gamma=1.0, lam=1.0)
  np.testing.assert_array_equal(adv2, adv)
  np.testing.assert_array_equal(ret2, ret)


# --- Token helpers ------------------------------------------------------------------------------


@test_util.JIT
def test_broadcast_to_tokens(use_jit):
  adv = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
  mask = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], np.float32)
  tok = test_util.maybe_jit(advantages.broadcast_to_tokens, use_jit)(adv, mask)
  expected = np.zeros((4, 3))
  flat = [1.0, -2.0, 0.5, 3.0]
  for b in range(4):
    for t in range(3):
      expected[b, t] = flat[b] * mask[b, t]
  np.testing.assert_allclose(tok, expected, **test_util.TOL)
  np.testing.assert_allclose(advantages.broadcast_to_tokens(adv.reshape(-1), mask), expected)


def test_broadcast_to_tokens_rejects_wrong_count():
  with pytest.raises(AssertionError):
    advantages.broadcast_to_tokens(jnp.zeros((2, 3)), jnp.ones((5, 4)))


def test_docstring_examples_run():
  result = doctest.testmod(advantages)
  assert result.attempted > 0 and result.failed == 0
