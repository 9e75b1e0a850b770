"""Orbax checkpoints of everything a run needs to continue exactly where it stopped.

A checkpoint holds one pytree of arrays (train state, curriculum state, data cursors, rng) and a
small JSON document (config fingerprint, anything host-side). Saving is asynchronous; the manager
keeps the newest `max_to_keep` steps; `restore_latest` returns None for a fresh workdir, `restore`
reads a given step and `metadata` the JSON documents alone.
"""

import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


def make_manager(directory: str, *, max_to_keep: int = 3,
                 enable_async: bool = True) -> ocp.CheckpointManager:
  """Returns a CheckpointManager for `directory` (created if missing), saving on request only."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True, enable_async_checkpointing=enable_async)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                               item_names=("state", "meta"))


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict,
         *, wait: bool = False) -> None:
  """Saves `state` (a pytree of arrays) and `meta` (JSON-serialisable) as checkpoint `step`."""
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                             meta=ocp.args.JsonSave(meta)), force=True)
  if wait:
    manager.wait_until_finished()


def restore(manager: ocp.CheckpointManager, step: int, like: Any) -> tuple[int, Any, dict]:
  """Restores checkpoint `step` into the structure, shapes and shardings of `like`.

  Returns:
    (step, state, meta).
  """
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
  return step, restored["state"], restored["meta"]


def restore_latest(manager: ocp.CheckpointManager,
                   like: Any) -> Optional[tuple[int, Any, dict]]:
  """Restores the newest checkpoint into the structure, shapes and shardings of `like`.

  Returns:
    (step, state, meta), or None when the directory holds no checkpoint.
  """
  step = manager.latest_step()
  if step is None:
    return None
  return restore(manager, step, like)


def metadata(manager: ocp.CheckpointManager) -> dict[int, dict]:
  """{step: meta} of every checkpoint the manager keeps (the JSON documents; no array is read)."""
  return {step: manager.restore(step, args=ocp.args.Composite(
      meta=ocp.args.JsonRestore()))["meta"] for step in manager.all_steps()}
