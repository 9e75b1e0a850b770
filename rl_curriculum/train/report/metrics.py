"""Run observability: metrics.jsonl, TensorBoard event files and a console progress line.

Only process 0 writes. `metrics.jsonl` holds one JSON object per logged step; after a resume the
entries past the restored step are dropped first, so the file reads as one uninterrupted run.
"""

import json
import math
import os
import sys
import time
from typing import Mapping

import numpy as np


def _scalar(value):
  value = np.asarray(value)
  if value.size != 1:
    return None
  value = value.item()
  if isinstance(value, bool):
    return float(value)
  return value


def flatten(metrics: Mapping, prefix: str = "") -> dict:
  """Flattens nested dicts and small arrays into {name: python scalar}; `a/b`, `x/0`, `x/1`..."""
  out = {}
  for key, value in metrics.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(flatten(value, name + "/"))
      continue
    array = np.asarray(value)
    if array.ndim == 0:
      out[name] = _scalar(array)
    elif array.ndim == 1 and array.size <= 64:
      for i, v in enumerate(array.tolist()):
        out[f"{name}/{i}"] = v
  return out


def read_jsonl(path: str) -> list[dict]:
  """Reads a metrics.jsonl file; a torn last line (a killed writer) is ignored."""
  rows = []
  if not os.path.exists(path):
    return rows
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return rows


def _summary_writer_class():
  """tensorboardX's SummaryWriter. Where torch is installed but not yet imported, tensorboardX is
  imported with torch hidden: it imports torch only to accept torch tensors, which scalars never
  are, and that import costs seconds (2.4 s against 0.25 s on a 2-core CPU) in every process
  that writes metrics."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricsWriter:
  """Writes step metrics to metrics.jsonl, TensorBoard and the console.

  Args:
    workdir: run folder; files go to `workdir/metrics.jsonl` and `workdir/tensorboard/`.
    total_steps: for the progress line's ETA.
    resume_step: steps > resume_step already in metrics.jsonl are dropped (a resumed run);
      0 is a fresh start, which drops every row of an earlier attempt (one killed before its
      first checkpoint), step 0 included.
    enabled: False on processes other than 0.
    console_keys: metric names shown on the progress line.
    stream: where the progress line goes (default stdout).
    clock: seconds, for the progress line's rate (default `time.monotonic`).
  """

  def __init__(self, workdir: str, *, total_steps: int, resume_step: int = 0,
               enabled: bool = True, console_keys=("reward_mean", "correct_mean"),
               stream=None, clock=time.monotonic):
    self.enabled = enabled
    self.total_steps = total_steps
    self.console_keys = tuple(console_keys)
    self.stream = stream or sys.stdout
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._start_step = resume_step
    self._first_done = None  # when this process's first step was written: it compiles
    self._first_seconds = 0.0
    self._clock = clock
    self._start = clock()
    self._tb = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    kept = ([r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
            if resume_step > 0 else [])
    with open(self.path, "w") as f:
      for row in kept:
        f.write(json.dumps(row) + "\n")
    self._tb = _summary_writer_class()(os.path.join(workdir, "tensorboard"),
                                       purge_step=resume_step + 1)

  def write(self, step: int, metrics: Mapping) -> dict:
    """Logs one step; returns the flattened row that was written."""
    row = {"step": int(step), **flatten(metrics)}
    if not self.enabled:
      return row
    with open(self.path, "a") as f:
      f.write(json.dumps(row, allow_nan=True) + "\n")
    for name, value in row.items():
      if name != "step" and isinstance(value, (int, float)) and math.isfinite(value):
        self._tb.add_scalar(name, value, global_step=step)
    self._progress(step, row)
    return row

  def _progress(self, step: int, row: dict) -> None:
    """The progress line. The first step a process runs also compiles its programs, so its
    time is shown apart, and the rate and ETA are those of the steps after it."""
    done = step - self._start_step
    now = self._clock()
    if done == 1:
      self._first_done, self._first_seconds = now, now - self._start
    if done >= 2 and self._first_done is not None:
      rate = (now - self._first_done) / (done - 1)
      eta = rate * max(self.total_steps - step, 0)
      timing = f"{rate:.2f}s/step ETA {int(eta) // 60}:{int(eta) % 60:02d}"
    elif done == 1:
      timing = f"first step {self._first_seconds:.1f}s (compiling)"
    else:
      timing = "starting"
    width = 24
    filled = int(width * step / max(self.total_steps, 1))
    bar = "#" * filled + "." * (width - filled)
    parts = [f"{k}={row[k]:.3f}" for k in self.console_keys
             if isinstance(row.get(k), (int, float))]
    line = f"\r[{bar}] {step}/{self.total_steps} {timing} " + " ".join(parts)
    self.stream.write(line.ljust(100))
    if step >= self.total_steps:
      self.stream.write("\n")
    self.stream.flush()

  def print(self, text: str) -> None:
    if self.enabled:
      self.stream.write(("\n" if not text.startswith("\n") else "") + text + "\n")
      self.stream.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
