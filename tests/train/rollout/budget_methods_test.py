"""Rollout-side methods switched on from the config, end to end at toy size: rollout allocation,
GRESO's skipped rollouts, the counterfactual baseline and VCRL's training mask. A pool of 12
prompts (4 per bin) makes prompts come back within 4 steps; the runs share one warm start."""

import ml_collections
import pytest
import test_util

from configs import toy

STEPS = 4
BUDGET = 4 * 4  # toy: 4 prompts x 4 completions a step


def _config(**fields):
  c = toy.get_config()
  c.rl.steps = STEPS
  c.task.train_per_bin = 4
  c.eval.every = 100
  c.checkpoint.every = 100
  return test_util.set_fields(c, **fields)


@pytest.fixture(scope="module")
def allocated(tmp_path_factory):
  """Variance allocation with up to 8 completions a prompt, and the counterfactual baseline (both
  read the run's per-prompt statistics)."""
  workdir = str(tmp_path_factory.mktemp("budget") / "allocated")
  config = _config(rl__allocation="variance", rl__allocation_max=8,
                   rl__algorithm="counterfactual")
  return workdir, test_util.run_rl(config, workdir)


@pytest.mark.slow
def test_allocation_spends_the_budget_unevenly_once_prompts_come_back(allocated):
  _, rows = allocated
  for r in rows:
    assert r["rollouts"] == BUDGET and r["rollouts_saved"] == 0
    assert 2 <= r["allocation/min"] <= 4 <= r["allocation/max"] <= 8
  # Step 1: every prompt is new (equal posteriors, 4 each); later a prompt seen before has a
  # narrower posterior than a new one and gets fewer completions.
  assert rows[0]["allocation/min"] == rows[0]["allocation/max"] == 4
  assert any(r["allocation/max"] > r["allocation/min"] for r in rows[1:])


@pytest.mark.slow
def test_counterfactual_baseline_gives_every_group_signal(allocated):
  _, rows = allocated
  # Step 1: every baseline is 0.5 (no history) and no reward is 0.5, so every group has a
  # nonzero advantage, although hardly any group mixes right and wrong answers.
  assert rows[0]["nonzero_adv_frac"] == 1.0
  assert rows[0]["mixed_correct_frac"] < 1.0
  assert all(r["abs_adv_mean"] > 0 for r in rows)


@pytest.mark.slow
def test_greso_rolls_out_fewer_prompts_once_it_skips(allocated, tmp_path):
  # No spare candidates (oversample 1) and a low keep probability on a streak (0.2 per step).
  options = ml_collections.ConfigDict(dict(oversample=1.0, p_init=0.2))
  config = _config(curriculum__name="greso", curriculum__options=options)
  rows = test_util.run_rl(config, str(tmp_path / "greso"))
  for r in rows:
    assert r["rollouts"] + r["rollouts_saved"] == BUDGET and r["rollouts"] % 4 == 0
    assert r["groups_trained"] <= r["rollouts"] / 4
  # Nothing is skipped before any prompt has a streak; all-wrong groups start streaks, and GRESO
  # then leaves some of its slots without rollouts.
  assert rows[0]["rollouts"] == BUDGET
  assert min(r["rollouts"] for r in rows) < BUDGET


@pytest.mark.slow
def test_vcrl_mask_trains_only_on_high_variance_groups(allocated, tmp_path):
  config = _config(curriculum__name="vcrl", curriculum__options=ml_collections.ConfigDict(),
                   curriculum__high_variance_only=True)
  rows = test_util.run_rl(config, str(tmp_path / "vcrl"))
  for r in rows:
    high = sum(r[f"curriculum/high_variance/{i}"] for i in range(4))
    assert r["groups_trained"] == high
    if high == 0:
      assert r["steps_taken"] == 0.0
  # The mask acts: some step had groups with a learning signal that it kept out of the loss.
  assert any(r["nonzero_adv_frac"] * 4 > r["groups_trained"] for r in rows)
