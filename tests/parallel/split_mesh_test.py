"""Rollouts on a mesh of their own (parallel.rollout_devices) on 4 fake CPU devices: the learner
and the engine hold disjoint halves of the devices (two each: each mesh is itself sharded), and
the run equals one on a single mesh of all of them (same tokens, parameters to the module
tolerance); so does a run whose learner splits its weights by FSDP over all four while the
engine decodes a copy of its own, made each step, over a tensor axis of two. (8 devices, four a mesh, ran the same code at 86 s against 75 s, and were dropped
for the suite's time.)

The runs happen in a subprocess (split_mesh_script.py) that sees the fake devices.
"""

import json
import os

import pytest

from configs import toy
import test_util

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
@pytest.mark.parametrize("devices", [4])
def test_rollout_mesh_apart_equals_one_mesh(devices, tmp_path):
  warm = test_util.shared_warm_start(toy.get_config())  # the script's runs change RL fields only
  out = str(tmp_path / "out.json")
  result = test_util.run_script(os.path.join(HERE, "split_mesh_script.py"), out, warm,
                                devices=devices)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(out) as f:
    r = json.load(f)
  half = list(range(devices // 2))
  assert r["devices"] == devices and r["steps"] == [2, 2]
  assert r["learner_mesh"] == half and r["rollout_mesh"] == [d + devices // 2 for d in half]
  assert r["engine"] == r["rollout_mesh"]          # the rows in flight live on the rollout mesh
  assert r["token_metrics_equal"] and r["staleness_max"] == 1
  assert r["params_moved"] > 1e-3
  assert r["params_diff"] <= 1e-4
  own = r["own_layout"]   # FSDP learner, the engine's copy over a tensor axis of 2
  assert own["learner_mesh"] == {"data": 1, "fsdp": devices, "tensor": 1}
  assert own["rollout_mesh"] == {"data": devices // 2, "fsdp": 1, "tensor": 2}
  assert own["resharded"] and own["steps"] == 2
  assert own["token_metrics_equal"] and own["params_diff"] <= 1e-4
