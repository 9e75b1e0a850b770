"""Fixtures shared by the tests of experiments/studies/."""

import pytest

from experiments.studies import comparison_stats


def _run_record(curve, *, per_step=10, signal=0.5, wall=1.0, ood=0.0, tasks=None,
                outcomes=None) -> dict:
  """A run's record as `comparison_stats.read_run` gives it, from its held-out accuracy curve
  (one value per evaluation, `per_step` rollouts apart); `tasks`: {task: per-task curve} of a run
  on several tasks; `outcomes`: (final per-problem outcomes, their bin indices), or None as in a
  folder from before outcomes were kept."""
  steps = list(range(len(curve)))
  rollouts = [s * per_step for s in steps]
  tasks = tasks or {}
  now = {t: c[-1] for t, c in tasks.items()}
  gains = [c[-1] - c[0] for c in tasks.values()]
  return {"steps": steps, "rollouts": rollouts, "heldout": list(curve),
          "auc": comparison_stats.curve_area(rollouts, curve),
          "final_tasks": now, "start_tasks": {t: c[0] for t, c in tasks.items()},
          "min_task_gain": min(gains) if gains else None,
          "task_spread": max(now.values()) - min(now.values()) if now else None,
          "task_curves": {t: list(c) for t, c in tasks.items()},
          "final_bins": {"a": curve[-1], "b": 0.0}, "final_heldout": curve[-1],
          "start_heldout": curve[0],
          "final_ood": ood, "signal_frac": signal, "mixed_frac": signal / 2, "wall_s": wall,
          "arm_probs": [],
          "rollouts_per_step": per_step,
          "final_outcomes": None if outcomes is None else outcomes[0],
          "final_outcome_bins": None if outcomes is None else outcomes[1]}


@pytest.fixture
def run_record():
  """The record of a synthetic finished run, `_run_record(curve, ...)`, for `summarise`."""
  return _run_record
