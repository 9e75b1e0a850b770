"""The signs of a collapsed policy in one step's metrics (`collapse.reason`)."""

import math

import numpy as np
import pytest

from rl_curriculum.train.durable import collapse

V = 16
HEALTHY = {"entropy": 1.2, "grad_norm": 0.3, "nonzero_adv_frac": 0.5, "steps_taken": 2.0,
           "reward_mean": 0.5}


def _reason(metrics, min_entropy=0.0, reward_drop=0.0, reward_mean=None, entropy_min=1.2):
  return collapse.reason({**HEALTHY, **metrics}, vocab_size=V, min_entropy=min_entropy,
                         reward_drop=reward_drop, reward_mean=reward_mean,
                         entropy_min=entropy_min)


def test_a_healthy_step_and_a_step_without_an_optimizer_step_are_not_collapsed():
  assert _reason({}) is None
  assert _reason({"entropy": math.log(V), "steps_taken": 0.0}) is None  # nothing measured


@pytest.mark.parametrize("fraction,collapsed", [(1.0, True), (0.95, True), (0.94, False)])
def test_an_entropy_near_ln_v_is_a_uniform_policy(fraction, collapsed):
  why = _reason({"entropy": fraction * math.log(V)})
  assert (why is not None) == collapsed
  if collapsed:
    assert why.startswith("entropy") and "uniform" in why


@pytest.mark.parametrize("entropy_min", [None, 0.95 * math.log(V), math.log(V)])
def test_a_policy_that_was_never_below_uniform_did_not_collapse(entropy_min):
  """An untrained model starts uniform: only a fall back to it after a healthy step below
  counts."""
  assert _reason({"entropy": math.log(V)}, entropy_min=entropy_min) is None


def test_a_zero_gradient_counts_only_when_groups_have_an_advantage():
  assert _reason({"grad_norm": 0.0}) == "gradient norm 0 although groups have an advantage"
  assert _reason({"grad_norm": 0.0, "nonzero_adv_frac": 0.0}) is None  # no signal: no gradient
  assert _reason({"grad_norm": 1e-12}) is None


def test_no_entropy_is_off_by_default_and_needs_groups_without_signal():
  quiet = {"entropy": 1e-5, "nonzero_adv_frac": 0.0}
  assert _reason(quiet) is None
  assert "below 0.001" in _reason(quiet, min_entropy=1e-3)
  assert _reason({**quiet, "nonzero_adv_frac": 0.25}, min_entropy=1e-3) is None


def test_a_reward_cliff_is_measured_against_the_running_mean():
  assert _reason({"reward_mean": 0.1}, reward_mean=0.5) is None  # off
  assert "below 0.50 x its running mean 0.500" in _reason({"reward_mean": 0.2}, reward_drop=0.5,
                                                          reward_mean=0.5)
  assert _reason({"reward_mean": 0.26}, reward_drop=0.5, reward_mean=0.5) is None
  assert _reason({"reward_mean": 0.0}, reward_drop=0.5, reward_mean=None) is None  # no history


def test_the_running_mean_of_the_reward():
  mean = None
  for r in (0.4, 0.6, 0.6):
    mean = collapse.reward_mean_after(mean, {"reward_mean": r})
  np.testing.assert_allclose(mean, 0.9 * (0.9 * 0.4 + 0.1 * 0.6) + 0.1 * 0.6, rtol=1e-12)
