"""experiments/studies/admission_bias.py on hand-made run folders."""

import json
import os

import pytest

from experiments.studies import admission_bias


def _run(folder, rows):
  os.makedirs(folder)
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    for step, (frac, trained, dropped) in enumerate(rows, start=1):
      f.write(json.dumps({"step": step, "curriculum/arm_frac/0": frac[0],
                          "curriculum/arm_frac/1": frac[1], "curriculum/arm_trained/0": trained[0],
                          "curriculum/arm_trained/1": trained[1],
                          "rollout/groups_dropped": dropped,
                          "groups_trained": sum(trained)}) + "\n")


def test_shares_of_groups_selected_and_trained_per_arm(tmp_path):
  # Two runs of 4-group batches: arm 1 (long completions) loses groups to drop.
  _run(str(tmp_path / "a"), [((0.5, 0.5), (2, 1), 1), ((0.25, 0.75), (1, 2), 1)])
  _run(str(tmp_path / "b"), [((0.5, 0.5), (2, 2), 0)])
  r = admission_bias.shares([str(tmp_path / "a"), str(tmp_path / "b")])
  assert r["selected_pct"] == pytest.approx([100 * 1.25 / 3, 100 * 1.75 / 3])
  assert r["trained_pct"] == pytest.approx([50.0, 50.0])            # 5 and 5 groups
  assert r["difference_pct"][1] == pytest.approx(50.0 - 100 * 1.75 / 3)
  assert r["dropped_frac"] == pytest.approx(2 / 12) and r["runs"] == 2
  text = admission_bias.markdown({"runs": "x", "arms": ["short", "long"],
                                  "methods": {"drop": r}})
  assert "| drop | 2 | 16.7% | 41.7 -> 50.0 (+8.3) | 58.3 -> 50.0 (-8.3) |" in text
