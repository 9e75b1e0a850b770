"""One writer per workdir, and a resumed run's config against the one its checkpoints belong to."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from configs import toy
from rl_curriculum.train.durable import workdir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_second_lock_names_the_holder_and_a_released_one_is_taken(tmp_path):
  with workdir.Lock(str(tmp_path)):
    with pytest.raises(workdir.WorkdirBusy, match=rf"{tmp_path} is in use by pid {os.getpid()} "
                       rf"on {socket.gethostname()} \(since "):
      with workdir.Lock(str(tmp_path)):
        pass
  with workdir.Lock(str(tmp_path)):  # released: taken again
    pass
  with workdir.Lock(str(tmp_path), enabled=False), workdir.Lock(str(tmp_path)):
    pass  # processes other than 0 of a run take none


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from rl_curriculum.train.durable import workdir; "
       f"lock = workdir.Lock({str(tmp_path)!r}).__enter__(); print('held', flush=True); "
       "time.sleep(600)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(workdir.WorkdirBusy, match=f"pid {holder.pid} "):
      workdir.Lock(str(tmp_path)).__enter__()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with open(tmp_path / workdir.LOCK) as f:
    assert json.load(f)["pid"] == holder.pid  # the dead holder's record is still there ...
  with workdir.Lock(str(tmp_path)):  # ... and the lock is free
    with open(tmp_path / workdir.LOCK) as f:
      assert json.load(f)["pid"] == os.getpid()


def _recorded(tmp_path, config, checkpoint=True):
  workdir.record_config(config, str(tmp_path))
  if checkpoint:
    os.makedirs(tmp_path / "checkpoints" / "4")
  return str(tmp_path)


def test_safe_fields_may_change_and_a_workdir_without_checkpoints_checks_nothing(tmp_path):
  c = toy.get_config()
  path = _recorded(tmp_path, c)
  c.rl.steps, c.eval.every, c.checkpoint.every = 100, 7, 9
  c.parallel.coordinator_address = "10.0.0.1:1234"
  assert workdir.check_config(c, path) == {}
  c.rl.learning_rate = 1.0
  assert workdir.check_config(c, _recorded(tmp_path / "fresh", toy.get_config(),
                                           checkpoint=False)) == {}


def test_other_changes_stop_the_run_unless_allowed(tmp_path):
  c = toy.get_config()
  path = _recorded(tmp_path, c)
  c.rl.learning_rate = 1e-3
  c.curriculum.name, c.curriculum.options = "uniform", {}
  with pytest.raises(workdir.ConfigChanged) as error:
    workdir.check_config(c, path)
  message = str(error.value)
  assert "\n" not in message and "--allow_config_change" in message
  assert ('curriculum.name: "sec" -> "uniform", curriculum.options: {"alpha": 0.5, '
          in message and "rl.learning_rate: 2e-05 -> 0.001" in message)
  changes = workdir.check_config(c, path, allow_changes=True)
  assert sorted(changes) == ["curriculum.name", "curriculum.options", "rl.learning_rate"]
  assert changes["rl.learning_rate"] == (2e-5, 1e-3)


def test_fields_of_the_warm_start_never_change_in_a_workdir(tmp_path):
  c = toy.get_config()
  path = _recorded(tmp_path, c)
  c.sft.steps = 11
  with pytest.raises(workdir.ConfigChanged, match="sft.steps made its tokenizer and SFT warm "
                     "start: use a fresh --workdir"):
    workdir.check_config(c, path, allow_changes=True)


def test_a_recorded_config_is_replaced_whole(tmp_path):
  c = toy.get_config()
  workdir.record_config(c, str(tmp_path))
  c.rl.steps = 9
  workdir.record_config(c, str(tmp_path))
  with open(tmp_path / workdir.CONFIG) as f:
    assert json.load(f)["rl"]["steps"] == 9
  assert sorted(os.listdir(tmp_path)) == [workdir.CONFIG]
