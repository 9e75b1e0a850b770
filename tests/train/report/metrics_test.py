"""Tests for metrics.jsonl writing, resume truncation and the end-of-run report."""

import io
import os
import struct
import subprocess
import sys

import numpy as np

from rl_curriculum.train.report import metrics as metrics_lib
from rl_curriculum.train.report import figures as report_lib
import test_util


def test_flatten_nests_and_expands_small_arrays():
  row = metrics_lib.flatten({"a": 1.5, "b": {"c": np.float32(2.0)}, "p": np.array([0.25, 0.75]),
                             "big": np.zeros(100), "flag": np.bool_(True)})
  assert row == {"a": 1.5, "b/c": 2.0, "p/0": 0.25, "p/1": 0.75, "flag": 1.0}


def test_resume_drops_rows_past_the_restored_step(tmp_path):
  workdir = str(tmp_path)
  writer = metrics_lib.MetricsWriter(workdir, total_steps=5, stream=io.StringIO())
  for step in range(1, 6):
    writer.write(step, {"reward_mean": step / 10})
  writer.close()
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 6, "rew')  # a torn line from a killed process
  assert [r["step"] for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == [1, 2, 3, 4, 5]
  writer = metrics_lib.MetricsWriter(workdir, total_steps=5, resume_step=3, stream=io.StringIO())
  writer.write(4, {"reward_mean": 0.9})
  writer.close()
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9)]
  assert os.listdir(os.path.join(workdir, "tensorboard"))


def test_a_fresh_start_drops_the_rows_of_an_earlier_attempt(tmp_path):
  # A run killed before its first checkpoint starts again from step 0 and logs step 0 again.
  workdir = str(tmp_path)
  writer = metrics_lib.MetricsWriter(workdir, total_steps=5, stream=io.StringIO())
  for step in range(3):
    writer.write(step, {"reward_mean": step / 10})
  writer.close()
  writer = metrics_lib.MetricsWriter(workdir, total_steps=5, resume_step=0, stream=io.StringIO())
  writer.write(0, {"reward_mean": 0.0})
  writer.write(1, {"reward_mean": 0.5})
  writer.close()
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [(r["step"], r["reward_mean"]) for r in rows] == [(0, 0.0), (1, 0.5)]


def test_the_eta_leaves_out_the_first_step_which_compiles(tmp_path):
  """A resumed run (after step 2) of 10 steps: its first step takes 50 s (compiling), the next
  ones 2 s each. The first is shown apart; the rate and ETA are those of the steps after it."""
  clock = iter([100.0, 150.0, 152.0, 154.0])
  stream = io.StringIO()
  writer = metrics_lib.MetricsWriter(str(tmp_path), total_steps=10, resume_step=2, stream=stream,
                                     clock=lambda: next(clock))
  lines = []
  for step in (3, 4, 5):
    writer.write(step, {"reward_mean": 0.5})
    lines.append(stream.getvalue().split("\r")[-1])
  writer.close()
  assert "3/10 first step 50.0s (compiling) reward_mean=0.500" in lines[0]
  assert "4/10 2.00s/step ETA 0:12" in lines[1]   # 6 steps left at 2 s
  assert "5/10 2.00s/step ETA 0:10" in lines[2]


def test_disabled_writer_writes_nothing(tmp_path):
  writer = metrics_lib.MetricsWriter(str(tmp_path / "w"), total_steps=2, enabled=False)
  writer.write(1, {"x": 1.0})
  assert not os.path.exists(tmp_path / "w")


def test_report_writes_a_real_png_and_html(tmp_path):
  rows = []
  for step in range(1, 41):
    row = {"step": step, "reward_mean": step / 40, "correct_mean": step / 50,
           "nonzero_adv_frac": 0.5, "kl": 0.01 * step,
           "curriculum/probs/0": 0.7, "curriculum/probs/1": 0.3}
    if step % 10 == 0:
      row.update({"eval/acc/easy": 0.5 + step / 100, "eval/acc/hard": step / 200})
    rows.append(row)
  table = report_lib.accuracy_table({"easy": 0.5, "hard": 0.1}, {"easy": 0.9, "hard": 0.2},
                                    ood=["hard"])
  assert "+40.0" in table and "(ood)" in table
  paired_table = report_lib.accuracy_table(
      {"easy": 0.5, "hard": 0.1}, {"easy": 0.9, "hard": 0.2},
      changes={"easy": {"mean": 0.4, "lo": 0.312, "hi": 0.488}})
  assert paired_table.splitlines()[0].endswith("change     95% interval")
  assert paired_table.splitlines()[2].endswith("+40.0  [ +31.2,  +48.8]")
  assert paired_table.splitlines()[3].endswith("+10.0" + " " * 17)  # no interval for "hard"
  assert report_lib.gain_sources_line({"gained": 8, "format": 6, "skill": 2, "lost": 1}) == (
      "Trained bins: 8 held-out problems went from wrong to right, 75% format (6 whose answer "
      "did not parse before) and 25% skill (2 answered wrongly before); 1 went from right to "
      "wrong.")
  paths = report_lib.write_report(str(tmp_path), rows, bin_names=["easy", "hard"],
                                  arm_names=["easy", "hard"], table=table)
  with open(paths["png"], "rb") as f:
    head = f.read(24)
  assert head[:8] == b"\x89PNG\r\n\x1a\n"
  width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
  assert width > 500 and height > 400
  assert os.path.getsize(paths["png"]) > 20_000  # four populated panels, not a blank canvas
  assert "+40.0" in open(paths["html"]).read()


def test_task_mass_sums_each_tasks_arms():
  series = [np.array([0.1, 0.2]), np.array([0.3, 0.1]), np.array([0.6, 0.7])]
  arms = ["countdown/n3", "zebra/2x2", "countdown/n4"]
  mass = report_lib.task_mass(series, arms, ["countdown", "zebra", "arc1d"])
  np.testing.assert_allclose(mass[0], [0.7, 0.9], rtol=1e-6)
  np.testing.assert_allclose(mass[1], [0.3, 0.1], rtol=1e-6)
  np.testing.assert_array_equal(mass[2], [0.0, 0.0])


def test_report_of_several_tasks_draws_tasks(tmp_path):
  arms = ["countdown/n3", "zebra/2x2", "zebra/2x3"]
  rows = []
  for step in range(1, 21):
    row = {"step": step, "reward_mean": 0.5, "correct_mean": 0.4, "nonzero_adv_frac": 0.5,
           **{f"curriculum/arm_frac/{k}": 1 / 3 for k in range(3)}}
    if step % 5 == 0:
      row.update({"eval/countdown/accuracy": step / 40, "eval/zebra/accuracy": 0.5,
                  **{f"eval/acc/{a}": 0.5 for a in arms}})
    rows.append(row)
  paths = report_lib.write_report(str(tmp_path), rows, bin_names=arms, arm_names=arms,
                                  tasks=["countdown", "zebra"])
  assert os.path.getsize(paths["png"]) > 20_000


def _events(folder: str) -> list:
  """The Event records of the TensorBoard event files in `folder` (TFRecord framing: a u64
  length, its masked CRC, the record, the record's masked CRC)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  events = []
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), "rb") as f:
      data = f.read()
    at = 0
    while at < len(data):
      (length,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[at + 12:at + 12 + length])
      events.append(event)
      at += 12 + length + 4
  return events


def test_tensorboard_scalars_are_written_without_importing_torch(tmp_path):
  """A process that writes metrics holds TensorBoard scalars by name and step afterwards, and
  has not imported torch (tensorboardX would, for seconds, where torch is installed)."""
  code = ("import io, sys\n"
          "from rl_curriculum.train.report import metrics\n"
          f"w = metrics.MetricsWriter({str(tmp_path)!r}, total_steps=2, stream=io.StringIO())\n"
          "w.write(1, {'reward_mean': 0.25, 'curriculum': {'probs': [0.5, 0.5]}})\n"
          "w.write(2, {'reward_mean': 0.75})\n"
          "w.close()\n"
          "print('torch' in sys.modules)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=test_util.ROOT, capture_output=True,
                          text=True, check=True)
  assert result.stdout.split() == ["False"]
  scalars = [(e.step, v.tag, v.simple_value)
             for e in _events(os.path.join(tmp_path, "tensorboard")) for v in e.summary.value]
  assert scalars == [(1, "reward_mean", 0.25), (1, "curriculum/probs/0", 0.5),
                     (1, "curriculum/probs/1", 0.5), (2, "reward_mean", 0.75)]
