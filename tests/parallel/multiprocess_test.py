"""Two processes with `jax.distributed` (CPU, loopback coordinator, 4 fake devices each) run the
toy config, are killed after a checkpoint, resume, and end where one 8-device process ends."""

import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import toy
from rl_curriculum.train.report.metrics import read_jsonl
import test_util

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 4
_TIMING = ("time/", "tokens_per_s")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, num_processes, process_id, port, devices, log):
  env = test_util.device_env(devices, PYTHONPATH=ROOT)
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(name, None)
  return subprocess.Popen(
      [sys.executable, os.path.join(HERE, "multiprocess_script.py"), workdir, str(STEPS),
       str(num_processes), str(process_id), str(port)],
      env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _two_processes(workdir, logdir, tag):
  port = _free_port()
  logs = [open(os.path.join(logdir, f"{tag}_{i}.log"), "w") for i in range(2)]
  return [_launch(workdir, 2, i, port, 4, logs[i]) for i in range(2)], logs


def _wait(procs, timeout=900):
  deadline = time.time() + timeout
  for p in procs:
    p.wait(timeout=max(deadline - time.time(), 1))
  return [p.returncode for p in procs]


def _states(workdir):
  """{step: saved state} of every checkpoint, read onto this process's one device (they were
  written from 8 devices, so the target layout must be given)."""
  folder = os.path.join(workdir, "checkpoints")
  checkpointer = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  out = {}
  for step in sorted(int(d) for d in os.listdir(folder) if d.isdigit()):
    path = os.path.join(folder, str(step), "state")
    meta = checkpointer.metadata(path)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)
    out[step] = checkpointer.restore(path, target)
  return out


def _tail(logdir):
  return "\n".join(open(os.path.join(logdir, f)).read()[-2000:] for f in sorted(os.listdir(logdir)))


@pytest.mark.slow
def test_two_processes_killed_and_resumed_match_one_process(tmp_path):
  single, multi, logdir = str(tmp_path / "single"), str(tmp_path / "multi"), tmp_path / "logs"
  logdir.mkdir()
  warm = test_util.shared_warm_start(toy.get_config())  # the mesh is not part of a warm start
  test_util.copy_warm_start(warm, single)
  test_util.copy_warm_start(warm, multi)
  with open(logdir / "single.log", "w") as log:
    assert _wait([_launch(single, 1, 0, 0, 8, log)]) == [0], _tail(logdir)

  procs, logs = _two_processes(multi, str(logdir), "first")
  deadline = time.time() + 900
  while time.time() < deadline:  # kill both once step 2 is logged (and checkpointed)
    rows = read_jsonl(os.path.join(multi, "metrics.jsonl"))
    if rows and rows[-1]["step"] >= 2 or any(p.poll() is not None for p in procs):
      break
    time.sleep(0.2)
  assert all(p.poll() is None for p in procs), _tail(logdir)
  for p in procs:
    p.send_signal(signal.SIGKILL)
  _wait(procs)
  killed_at = read_jsonl(os.path.join(multi, "metrics.jsonl"))[-1]["step"]
  assert 2 <= killed_at < STEPS

  procs, logs = _two_processes(multi, str(logdir), "resumed")
  assert _wait(procs) == [0, 0], _tail(logdir)
  assert "resumed from step" in open(logdir / "resumed_0.log").read()

  a, b = _states(single), _states(multi)
  assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
  for step in a:  # the curriculum evolves identically, step by step
    for x, y in zip(jax.tree.leaves(a[step]["curriculum"]), jax.tree.leaves(b[step]["curriculum"])):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for x, y in zip(jax.tree.leaves(a[STEPS]["train"]), jax.tree.leaves(b[STEPS]["train"])):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)
  rows_a = read_jsonl(os.path.join(single, "metrics.jsonl"))
  rows_b = read_jsonl(os.path.join(multi, "metrics.jsonl"))
  assert [r["step"] for r in rows_b] == list(range(STEPS + 1))
  for ra, rb in zip(rows_a, rows_b):
    for k, v in ra.items():
      if not k.startswith(_TIMING):
        np.testing.assert_allclose(rb[k], v, rtol=0, atol=1e-5, err_msg=k)
