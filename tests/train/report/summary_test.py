"""summary: per-problem outcomes on disk, and when a workdir holds a finished run."""

import json
import os

import ml_collections
import numpy as np

from rl_curriculum.train.durable import checkpointing
from rl_curriculum.train.report import summary


def test_outcomes_round_trip_and_a_missing_file_reads_none(tmp_path):
  outcomes = {"task/bin_a": (np.array([1, 0, 1], bool), np.array([1, 1, 0], bool)),
              "bin_b": (np.array([0], bool), np.array([0], bool))}
  path = summary.outcomes_path(str(tmp_path), 4)
  summary.write_outcomes(path, outcomes)
  back = summary.read_outcomes(path)
  assert list(back) == list(outcomes)
  for name, (correct, formatted) in outcomes.items():
    np.testing.assert_array_equal(back[name][0], correct)
    np.testing.assert_array_equal(back[name][1], formatted)
  assert os.listdir(os.path.dirname(path)) == ["step_4.npz"]  # no temporary file left
  assert summary.read_outcomes(summary.outcomes_path(str(tmp_path), 5)) is None


def _finished_workdir(workdir, steps):
  os.makedirs(os.path.join(workdir, "checkpoints", str(steps)))
  with open(os.path.join(workdir, "checkpoints", str(steps), "data"), "wb") as f:
    f.write(b"\0" * 64)
  checkpointing.seal(os.path.join(workdir, "checkpoints", str(steps)))
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step in range(steps + 1):
      f.write(json.dumps({"step": step}) + "\n")
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"steps": steps, "table": "t"}, f)


def test_a_run_is_finished_only_with_its_summary_last_row_and_intact_last_checkpoint(tmp_path):
  config = ml_collections.ConfigDict({"rl": {"steps": 3}})
  workdir = str(tmp_path)
  _finished_workdir(workdir, 3)
  assert summary.finished(config, workdir) == {"steps": 3, "table": "t"}
  config.rl.steps = 5  # more steps asked for: not finished
  assert summary.finished(config, workdir) is None
  config.rl.steps = 3
  with open(os.path.join(workdir, "checkpoints", "3", "data"), "r+b") as f:
    f.write(b"\1")  # the last checkpoint damaged: the run resumes from an earlier one
  assert summary.finished(config, workdir) is None
  workdir = str(tmp_path / "cut")
  _finished_workdir(workdir, 3)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    f.write('{"steps": 3, "ta')  # cut short
  assert summary.finished(config, workdir) is None
  os.remove(os.path.join(workdir, "summary.json"))
  assert summary.finished(config, workdir) is None


def test_paired_changes_count_gains_over_the_trained_bins_only():
  t, f = True, False
  before = {"train": (np.array([f, f, t]), np.array([f, t, t])),
            "held_only": (np.array([f, f]), np.array([t, t]))}  # evaluated, never trained on
  after = {"train": (np.array([t, t, t]), np.array([t, t, t])),
           "held_only": (np.array([t, t]), np.array([t, t]))}
  changes, sources = summary.paired_changes(before, after, ["train"])
  assert set(changes) == {"train", "held_only"}
  assert abs(changes["train"]["mean"] - 2 / 3) < 1e-9
  # Two problems of the trained bin gained: one whose answer did not parse before, one that did.
  assert sources == {"gained": 2, "format": 1, "skill": 1, "lost": 0, "format_share": 0.5}
  everything = summary.paired_changes(before, after, ["not evaluated"])[1]
  assert everything["gained"] == 4  # no trained bin evaluated: every bin counts
  after["train"] = (np.array([t, t]), np.array([t, t]))  # other problems: nothing to pair
  assert summary.paired_changes(before, after, ["train"]) == (None, None)
  assert summary.paired_changes(None, after, ["train"]) == (None, None)
