"""Fixtures shared by the tests of experiments/studies/."""

import numpy as np
import pytest

from experiments.studies import comparison_stats


def _joined(outcomes: dict) -> tuple:
  """(outcomes of {bin: correct} end to end, each problem's bin index); (None, None) for {}."""
  if not outcomes:
    return None, None
  return (np.concatenate([np.asarray(c, bool) for c in outcomes.values()]),
          np.concatenate([np.full(len(c), i) for i, c in enumerate(outcomes.values())]))


def _test_fields(test, test_ood) -> dict:
  """The test-split fields of a run's record, as `comparison_stats.read_run` gives them, from
  {bin: correct bool[n]} of the training bins (`test`; None: the run has no test outcomes, and
  every field is None) and of the OOD bins (`test_ood`; None: no OOD bins)."""
  keys = ("test_outcomes", "test_outcome_bins", "test_ood_outcomes", "test_ood_bins",
          "final_test", "final_test_bins", "final_test_ood")
  if test is None:
    return dict.fromkeys(keys)
  ood = test_ood or {}
  bins = {b: float(np.mean(c)) for b, c in {**test, **ood}.items()}
  (train, train_bins), (ood_outcomes, ood_bins) = _joined(test), _joined(ood)
  return {"test_outcomes": train, "test_outcome_bins": train_bins,
          "test_ood_outcomes": ood_outcomes, "test_ood_bins": ood_bins,
          "final_test": float(np.mean([bins[b] for b in test])), "final_test_bins": bins,
          "final_test_ood": float(np.mean([bins[b] for b in ood])) if ood else None}


def _run_record(curve, *, per_step=10, signal=0.5, wall=1.0, ood=0.0, tasks=None,
                outcomes=None, test=None, test_ood=None) -> dict:
  """A run's record as `comparison_stats.read_run` gives it, from its held-out accuracy curve
  (one value per evaluation, `per_step` rollouts apart); `tasks`: {task: per-task curve} of a run
  on several tasks; `outcomes`: (final per-problem outcomes, their bin indices), or None as in a
  folder from before outcomes were kept; `test` / `test_ood`: {bin: correct outcomes} of the
  final checkpoint on the test split's training / OOD bins, or None as in a run not yet evaluated
  on the test split (no OOD bins)."""
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
          "final_outcome_bins": None if outcomes is None else outcomes[1],
          **_test_fields(test, test_ood)}


@pytest.fixture
def run_record():
  """The record of a synthetic finished run, `_run_record(curve, ...)`, for `summarise`."""
  return _run_record
