"""Tests of experiments/studies/seeds.py: the summary of RL seeds against their one warm start,
from run folders written here (held-out outcomes and episode statistics as a run writes them)."""

import json

import numpy as np
import pytest

from configs import toy_episodes
from experiments.studies import seeds
from rl_curriculum.train.report import paired
from rl_curriculum.train.report import summary as run_summary


def _run(folder, steps, before, after, stats_after):
  """A finished run's held-out records: outcomes at step 0 and `steps`, episode statistics."""
  for step, outcomes, stats in ((0, before, {"episode/tool_call_rate": 0.1}),
                                (steps, after, stats_after)):
    path = run_summary.outcomes_path(folder, step)
    run_summary.write_outcomes(path, {name: (np.asarray(c, bool), np.ones(len(c), bool))
                                      for name, c in outcomes.items()})
    with open(path[:-len(".npz")] + "_episodes.json", "w") as f:
      json.dump({name: stats for name in outcomes}, f)


def test_the_summary_pairs_every_seed_with_the_warm_start(tmp_path):
  config = toy_episodes.get_config()
  config.rl.steps = 4
  rng = np.random.default_rng(0)
  before = {"calculator/l0": rng.random(16) < 0.3, "guess/l0": rng.random(16) < 0.5}
  afters = [{name: rng.random(16) < 0.6 for name in before} for _ in range(3)]
  for s, after in enumerate(afters):
    _run(str(tmp_path / f"seed_{s}"), 4, before, after, {"episode/tool_call_rate": 0.2 * s})
  result = seeds.summarise(config, 3, str(tmp_path))
  row = result["bins"]["calculator/l0"]
  final = np.stack([a["calculator/l0"] for a in afters]).astype(float)
  want = paired.paired_difference(final, before["calculator/l0"].astype(float))
  assert row["change"] == pytest.approx(want["mean"])
  assert row["interval"] == pytest.approx([want["lo"], want["hi"]])
  assert row["after_per_seed"] == pytest.approx(final.mean(axis=1).tolist())
  assert row["episodes_before"] == {"episode/tool_call_rate": 0.1}
  assert row["episodes_after"]["episode/tool_call_rate"] == pytest.approx(0.2)
  assert "calculator/l0 | " in seeds.markdown(result)
  assert "guess/l0 (never trained)" not in seeds.markdown(result)  # a training bin of the toy
  # Seeds that did not start from one warm start are refused.
  other = {name: ~c for name, c in before.items()}
  _run(str(tmp_path / "seed_2"), 4, other, afters[2], {})
  with pytest.raises(ValueError, match="did not start from one warm start"):
    seeds.summarise(config, 3, str(tmp_path))
