"""Multi-process (multi-host) start-up and the host <-> global-array glue of a run.

JAX runs one Python process per host (or per GPU); all processes run the same program on the same
global arrays, and each process reaches only its own devices' shards. The helpers below move data
across that boundary; with one process every one of them is the plain single-host operation.

  initialize(coordinator_address, num_processes, process_id)    before any JAX computation
  place(tree, shardings)          host values (equal on every process) -> global arrays
  local_row_indices(sharding, n)  rows of an [n, ...] batch this process holds
  rows_to_global(local, sharding, n)    this process's rows -> the global [n, ...] array
  local_rows(x)                   this process's rows of a row-sharded global array (NumPy)
  gather_rows(local, indices, n)  every process's rows -> the full [n, ...] NumPy array
  to_host(x)                      any global array -> NumPy (replicated: no communication)
  any_process(flag), sync(name), assert_replicated(tree, what)

A run's per-step flow on P processes (rows b = p * G + g of the prompt batch): every process
computes the same selection from the replicated curriculum state, builds only its rows of the
prompt batch (`local_row_indices` + `rows_to_global`), samples (one SPMD program), decodes and
scores only its rows (`local_rows`), and shares the scores (`gather_rows`: rewards are [P, G],
tiny) so that the learn step and the curriculum update see the same global feedback everywhere.
"""

import os
from typing import Any, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Sharding


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> bool:
  """Starts `jax.distributed` for a multi-process run; returns whether the run is distributed.

  Each argument falls back to the environment when None (or, for process_id, negative):
  JAX_COORDINATOR_ADDRESS ("host:port" of process 0), JAX_NUM_PROCESSES, JAX_PROCESS_ID.
  - no coordinator and num_processes None or 1: one process; nothing happens (returns False);
  - num_processes 0: JAX detects the cluster itself (Cloud TPU pods, SLURM, Open MPI, GKE);
  - otherwise `jax.distributed.initialize(coordinator_address, num_processes, process_id)`.
  Calling it again after a successful start is a no-op.

  Raises:
    RuntimeError: JAX already ran a computation in this process (start-up must come first), or
      the coordinator could not be reached (JAX's own error, after its timeout).
    ValueError: num_processes > 1 without a coordinator address or a process id.
  """
  if jax.distributed.is_initialized():
    return True
  env = os.environ
  if not coordinator_address:
    coordinator_address = env.get("JAX_COORDINATOR_ADDRESS") or None
  if num_processes is None and env.get("JAX_NUM_PROCESSES"):
    num_processes = int(env["JAX_NUM_PROCESSES"])
  if process_id is None or process_id < 0:
    process_id = int(env["JAX_PROCESS_ID"]) if env.get("JAX_PROCESS_ID") else None
  if num_processes == 0:
    jax.distributed.initialize()
    return True
  if coordinator_address is None and num_processes in (None, 1):
    return False
  if num_processes is not None and num_processes > 1 and (coordinator_address is None
                                                          or process_id is None):
    raise ValueError(
        f"a run of {num_processes} processes needs coordinator_address (host:port of process 0) "
        f"and this process's id; got {coordinator_address!r} and {process_id!r}. Set "
        "config.parallel.* or JAX_COORDINATOR_ADDRESS / JAX_PROCESS_ID, or num_processes=0 to "
        "let JAX detect the cluster.")
  jax.distributed.initialize(coordinator_address, num_processes, process_id)
  return True


def is_main() -> bool:
  """True on process 0, the one that writes logs, reports and summaries."""
  return jax.process_index() == 0


def _place_leaf(x, sharding):
  if x is None:
    return None
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    impl = jax.random.key_impl(x)
    return jax.random.wrap_key_data(_place_leaf(jax.random.key_data(x), sharding), impl=impl)
  if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
    return jax.device_put(x, sharding)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place(tree: Any, shardings: Any) -> Any:
  """`tree` laid out as `shardings` (a tree of the same structure, e.g. from `mesh.*_shardings`).

  Host values and single-device arrays must be equal on every process (each process keeps only
  its devices' slices); arrays that are already global are resharded. One process:
  `jax.device_put`.
  """
  return jax.tree.map(_place_leaf, tree, shardings, is_leaf=lambda x: x is None)


def local_row_indices(sharding: Sharding, num_rows: int) -> np.ndarray:
  """i64[r] the rows (dimension 0) of an [num_rows, ...] array that this process's devices hold
  under `sharding`, ascending; all rows for a replicated sharding or a single process."""
  index_map = sharding.addressable_devices_indices_map((num_rows,))
  rows = set()
  for index in index_map.values():
    rows.update(range(num_rows)[index[0]] if index else range(num_rows))
  return np.asarray(sorted(rows), np.int64)


def rows_to_global(local: np.ndarray, sharding: Sharding, num_rows: int) -> jax.Array:
  """The global [num_rows, ...] array from each process's rows `local` [r, ...] (the rows
  `local_row_indices(sharding, num_rows)` names, in that order)."""
  local = np.asarray(local)
  return jax.make_array_from_process_local_data(sharding, local, (num_rows,) + local.shape[1:])


def local_rows(x: jax.Array) -> np.ndarray:
  """NumPy copy of this process's rows of `x` (dimension 0), ascending, each row once; the rows
  are `local_row_indices(x.sharding, x.shape[0])`."""
  pieces = {}
  for shard in x.addressable_shards:
    start = (shard.index[0].start or 0) if shard.index else 0
    if start not in pieces:
      pieces[start] = np.asarray(shard.data)
  return np.concatenate([pieces[s] for s in sorted(pieces)], axis=0)


def gather_rows(local: np.ndarray, indices: np.ndarray, num_rows: int) -> np.ndarray:
  """The full [num_rows, ...] array from every process's `local` rows at `indices` (each
  process passes the same number of rows; every row must be covered)."""
  local = np.asarray(local)
  if jax.process_count() == 1:
    if len(indices) != num_rows:
      raise ValueError(f"one process holds {len(indices)} of {num_rows} rows")
    out = np.empty((num_rows,) + local.shape[1:], local.dtype)
    out[indices] = local
    return out
  all_local = np.asarray(multihost_utils.process_allgather(local))
  all_indices = np.asarray(multihost_utils.process_allgather(np.asarray(indices, np.int64)))
  out = np.empty((num_rows,) + local.shape[1:], local.dtype)
  seen = np.zeros(num_rows, bool)
  for rows, values in zip(all_indices, all_local):
    out[rows] = values
    seen[rows] = True
  if not seen.all():
    raise ValueError(f"rows {np.flatnonzero(~seen)[:8]}... are held by no process")
  return out


def to_host(x: Any) -> np.ndarray:
  """NumPy value of a (global) array: local copy when replicated or fully addressable,
  otherwise an all-gather across processes."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def any_process(flag: bool) -> bool:
  """True on every process if `flag` is True on any (e.g. a SIGTERM that reached one host)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.asarray(bool(flag)))))


def sync(name: str) -> None:
  """Barrier: returns once every process reached `sync(name)`; no-op for one process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def assert_replicated(tree: Any, what: str = "state") -> None:
  """Checks that every replicated array of `tree` holds the same bits on every device of every
  process (the curriculum state must evolve identically everywhere).

  Raises:
    AssertionError: naming `what` and the first leaf that differs.
  """
  leaves = []
  for x in jax.tree.leaves(tree):
    if isinstance(x, jax.Array) and x.is_fully_replicated:
      is_key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
      leaves.append(jax.random.key_data(x) if is_key else x)
  for i, x in enumerate(leaves):
    shards = [np.asarray(s.data) for s in x.addressable_shards]
    for s in shards[1:]:
      if not np.array_equal(s, shards[0], equal_nan=True):
        raise AssertionError(f"{what}: leaf {i} differs between devices of process "
                             f"{jax.process_index()}")
  if jax.process_count() > 1:
    host = [np.asarray(x.addressable_shards[0].data) for x in leaves]
    multihost_utils.assert_equal(host, fail_message=f"{what} differs between processes")
