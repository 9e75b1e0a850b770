"""Single-process behaviour of the multi-host helpers (the two-process run is in
multiprocess_test.py)."""

import jax
import numpy as np
import pytest

from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib


def _mesh():
  return mesh_lib.make_mesh((-1, 1, 1))


def test_initialize_is_a_no_op_for_one_process(monkeypatch):
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  assert distributed.initialize() is False
  assert distributed.initialize(None, 1, -1) is False
  assert distributed.is_main()


def test_initialize_needs_a_coordinator_for_many_processes(monkeypatch):
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
  monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
  with pytest.raises(ValueError, match="coordinator_address"):
    distributed.initialize(num_processes=2)
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  with pytest.raises(ValueError, match="coordinator_address"):
    distributed.initialize()


def test_rows_round_trip():
  mesh = _mesh()
  sharding = mesh_lib.batch_sharding(mesh, 2)
  rows = distributed.local_row_indices(sharding, 8)
  np.testing.assert_array_equal(rows, np.arange(8))
  data = np.arange(24, dtype=np.int32).reshape(8, 3)
  x = distributed.rows_to_global(data[rows], sharding, 8)
  assert x.shape == (8, 3) and x.sharding == sharding
  np.testing.assert_array_equal(distributed.local_rows(x), data)
  np.testing.assert_array_equal(distributed.to_host(x), data)


def test_gather_rows_puts_rows_in_place():
  local = np.array([[5.0], [7.0], [1.0]])
  out = distributed.gather_rows(local, np.array([2, 0, 1]), 3)
  np.testing.assert_array_equal(out, [[7.0], [1.0], [5.0]])
  with pytest.raises(ValueError, match="rows"):
    distributed.gather_rows(local, np.array([0, 1, 2]), 4)


def test_place_replicates_host_values_and_keys():
  mesh = _mesh()
  rep = mesh_lib.replicated(mesh)
  tree = {"q": np.arange(3.0), "key": jax.random.key(3), "none": None}
  placed = distributed.place(tree, {"q": rep, "key": rep, "none": None})
  assert placed["q"].sharding == rep and placed["none"] is None
  np.testing.assert_array_equal(jax.random.key_data(placed["key"]),
                                jax.random.key_data(jax.random.key(3)))
  distributed.assert_replicated(placed, "curriculum state")
  assert distributed.any_process(True) and not distributed.any_process(False)
  distributed.sync("test")

