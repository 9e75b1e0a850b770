"""The loss-side methods switched on from the config, end to end at toy size: each run's
metrics.jsonl shows the method acting (CAPO, truncated importance sampling, dual clip, KL in the
reward, entropy bonus). The runs share one tokenizer and SFT warm start."""

import numpy as np
import pytest
import test_util


STEPS = 3


def _config(**rl):
  return test_util.toy_rl_config(STEPS, **rl)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("methods") / "baseline")
  return workdir, test_util.run_rl(_config(), workdir)


@pytest.fixture(scope="module")
def combined(baseline, tmp_path_factory):
  """CAPO (positive advantages only for two updates), TIS, dual clip and a KL reward together:
  each writes its own metric."""
  workdir = str(tmp_path_factory.mktemp("methods") / "combined")
  config = _config(capo_positive_steps=2, tis_cap=2.0, dual_clip=3.0, kl_reward_coef=0.1)
  return test_util.run_rl(config, workdir)


@pytest.mark.slow
def test_methods_are_off_by_default(baseline):
  _, rows = baseline
  for name in ("capo_negative_weight", "tis_weight_mean", "entropy_bonus", "kl_reward"):
    assert name not in rows[-1], name
  assert all(r["dual_clipfrac"] == 0.0 for r in rows)


@pytest.mark.slow
def test_capo_learns_from_positive_advantages_before_negative_ones(baseline, combined):
  # Updates 0 and 1 (logged as steps 1 and 2) are positive-only; update 2 weighs negatives fully.
  assert [r["capo_negative_weight"] for r in combined] == [0.0, 0.0, 1.0]
  # The first rollout is the baseline's, and there the other methods are inactive (weights 1, no
  # KL yet): with ratios near 1 the loss -mean(w A) loses its negative advantages' share.
  assert combined[0]["reward_mean"] == baseline[1][0]["reward_mean"]
  assert abs(combined[0]["tis_weight_mean"] - 1.0) < 1e-2 and abs(combined[0]["kl_reward"]) < 1e-6
  assert combined[0]["loss"] < baseline[1][0]["loss"] - 1e-3


@pytest.mark.slow
def test_truncated_importance_weights_stay_in_range(combined):
  for r in combined:
    # The sampler and the trainer compute the same policy's log-probs: weights near 1, never
    # above the cap, and none truncated.
    assert 0.0 < r["tis_weight_mean"] <= 2.0
    assert abs(r["tis_weight_mean"] - 1.0) < 1e-2
    assert r["tis_truncated_frac"] == 0.0


@pytest.mark.slow
def test_dual_clip_and_kl_reward_are_reported(combined):
  assert all(0.0 <= r["dual_clipfrac"] <= 1.0 for r in combined)
  # The reference is the warm start: the first update's policy is the reference (no penalty);
  # afterwards the policy has moved away from it.
  assert abs(combined[0]["kl_reward"]) < 1e-6
  assert abs(combined[-1]["kl_reward"]) > 1e-6
  assert "kl" not in combined[-1]  # no KL loss term (rl.kl_coef = 0)


@pytest.mark.slow
def test_entropy_bonus_keeps_the_policy_more_random(baseline, tmp_path):
  """The same seed with a large entropy bonus: the first rollout is the same, and the policy's
  entropy after the updates is higher than without the bonus."""
  _, plain = baseline
  bonus = test_util.run_rl(_config(entropy_coef=1.0), str(tmp_path / "entropy"))
  assert bonus[0]["reward_mean"] == plain[0]["reward_mean"]  # the same first rollout
  # Token-mean aggregation: the bonus is the mean entropy of the trained tokens.
  np.testing.assert_allclose(bonus[0]["entropy_bonus"], bonus[0]["entropy"], rtol=1e-4)
  assert bonus[-1]["entropy"] > plain[-1]["entropy"]
