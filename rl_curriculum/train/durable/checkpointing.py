"""Orbax checkpoints of everything a run needs to continue exactly where it stopped, verified.

A checkpoint holds one pytree of arrays (train state, curriculum state, data cursors, rng) and a
small JSON document (config fingerprint, anything host-side). `save` writes a step, waits for it
and seals it: `checksums.json` in the step's folder records the size and SHA-256 of every file
Orbax wrote. Every restore verifies the seal first, so a checkpoint whose bytes changed on disk,
lost a file, or was cut short (a run killed while sealing leaves no seal) is never read as if it
were intact:

  save(manager, step, state, meta)                  # CheckpointError when the write fails
  restore_latest(manager, like, log)                # the newest intact step, or None
  restore(manager, step, like)                      # that step; CheckpointError if damaged
  metadata(manager)                                 # {step: meta} of the intact steps

A step whose files are intact but hold a state of another layout (a config change that alters
what the state holds) is not damage: the restore stops with a `CheckpointError` saying so.

`restore_latest` passes over damaged steps, newest first, with one line each naming the step and
the damage, and moves them aside (`<folder>.damaged/<step>`: kept for a look, out of the way of
the run that writes that step again). Saving waits for the write: a step can only be sealed once
its files are final, and an unsealed newest step would be passed over on resume.
"""

import contextlib
import hashlib
import json
import logging
import os
import shutil
from typing import Any, Callable, Optional

import jax
import orbax.checkpoint as ocp

from rl_curriculum.parallel import distributed

__all__ = ["CHECKSUMS", "CheckpointError", "DamagedCheckpoint", "make_manager", "save", "seal",
           "digests", "damage", "restore", "restore_latest", "metadata"]

CHECKSUMS = "checksums.json"  # in each step folder: {relative path: [bytes, sha256]}


class CheckpointError(RuntimeError):
  """A checkpoint could not be written or read."""


class DamagedCheckpoint(CheckpointError):
  """A step's files are not those that were written (`damage`)."""


def make_manager(directory: str, *, max_to_keep: int = 3,
                 writer: bool = False) -> ocp.CheckpointManager:
  """Returns a CheckpointManager for `directory` (created if missing), saving on request only.
  The `writer` (the run that holds the workdir's lock) also deletes what killed writes left
  behind (Orbax's temporary step folders); a reader leaves them: they may be a live run's."""
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False,
                                         cleanup_tmp_directories=writer)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                               item_names=("state", "meta"))


def _step_dir(manager: ocp.CheckpointManager, step: int) -> str:
  return os.path.join(str(manager.directory), str(step))


def digests(folder: str, skip=(CHECKSUMS, CHECKSUMS + ".tmp")) -> dict:
  """{path relative to folder: [size, sha256 hex]} of every file below `folder` but those in
  `skip` (by default the seal)."""
  out = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, folder)
      if rel in skip:
        continue
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
      out[rel] = [os.path.getsize(path), digest.hexdigest()]
  return out


def seal(folder: str) -> None:
  """Writes `folder`/checksums.json for the files now in `folder` (atomically)."""
  path, found = os.path.join(folder, CHECKSUMS), digests(folder)
  with open(path + ".tmp", "w") as f:
    json.dump(found, f, indent=0, sort_keys=True)
  os.replace(path + ".tmp", path)


def damage(folder: str) -> Optional[str]:
  """None when `folder` (one step's) matches its seal; else what is wrong, in a few words."""
  path = os.path.join(folder, CHECKSUMS)
  try:
    with open(path) as f:
      sealed = json.load(f)
  except (OSError, ValueError):
    return "no checksum record (the run stopped while writing it)"
  found = digests(folder)
  for rel, (size, digest) in sorted(sealed.items()):
    if rel not in found:
      return f"{rel} is missing"
    if found[rel][0] != size:
      return f"{rel} has {found[rel][0]} bytes, {size} were written"
    if found[rel][1] != digest:
      return f"{rel} differs from what was written (checksum)"
  return None


def _mib(n: float) -> str:
  return f"{n / 2**20:.0f} MiB"


def _room(manager: ocp.CheckpointManager, state: Any) -> Optional[str]:
  """None when the checkpoint folder's disk has room for `state`'s arrays, else what is short.
  Checked before writing: a write that runs out of space part-way fails deep in Orbax's threads."""
  needed = sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(state)) + 2**20
  free = shutil.disk_usage(str(manager.directory)).free
  return None if free >= needed else (f"it needs about {_mib(needed)} and the disk has "
                                      f"{_mib(free)} free")


@contextlib.contextmanager
def _quiet_orbax():
  """Orbax logs a failed write's tracebacks from its threads before it raises; the raised error
  says the same in one line, so they are kept off the console while saving."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    logger.setLevel(level)


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict) -> None:
  """Saves `state` (a pytree of arrays) and `meta` (JSON-serialisable) as checkpoint `step`,
  waits for the write and seals it (process 0 writes the seal).

  Raises:
    CheckpointError: the disk has no room for it, or the write failed (no permission); the
      steps saved before are untouched, and an unsealed remainder of this one is passed over on
      restore.
  """
  advice = ("; the checkpoints before it are intact: free space (or fix permissions) and run "
            "the same command to resume")
  head = f"could not write the checkpoint of step {step} in {manager.directory}"
  short = _room(manager, state)
  if distributed.any_process(short is not None):
    raise CheckpointError(f"{head}: {short or 'another process has no room'}{advice}")
  try:
    with _quiet_orbax():
      manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 meta=ocp.args.JsonSave(meta)), force=True)
      manager.wait_until_finished()
    if distributed.is_main():
      seal(_step_dir(manager, step))
  except (OSError, ValueError, RuntimeError) as e:
    raise CheckpointError(f"{head}: {_one_line(e)}{advice}") from e
  distributed.sync(f"checkpoint {step} sealed")


def _one_line(e: BaseException) -> str:
  text = " ".join(str(e).split())
  return f"{type(e).__name__}: {text[:300]}"


def _read(manager: ocp.CheckpointManager, step: int, like: Any) -> tuple[Any, dict]:
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
  return restored["state"], restored["meta"]


def _checked(manager: ocp.CheckpointManager, step: int) -> Optional[str]:
  """`damage` of the step as every process agrees on it (damaged if any process finds it so)."""
  found = damage(_step_dir(manager, step))
  if distributed.any_process(found is not None) and found is None:
    found = "damaged as another process reads it"
  return found


def restore(manager: ocp.CheckpointManager, step: int, like: Any) -> tuple[int, Any, dict]:
  """Restores checkpoint `step` into the structure, shapes and shardings of `like`.

  Returns:
    (step, state, meta).

  Raises:
    DamagedCheckpoint: the step's files are not those that were written.
    CheckpointError: they are, but they do not hold a state of `like`'s layout (a config that
      changes what the state holds: another curriculum, algorithm or LoRA setting).
  """
  found = _checked(manager, step)
  if found is not None:
    raise DamagedCheckpoint(f"checkpoint {step} in {manager.directory} is damaged: {found}")
  try:
    return (step, *_read(manager, step, like))
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointError(
        f"checkpoint {step} in {manager.directory} is intact but holds a state of another "
        f"layout than this run's ({_one_line(e)[:200]}): a config that changes what the state "
        "holds (curriculum, algorithm, LoRA) cannot resume it; use a fresh --workdir") from e


def _set_aside(manager: ocp.CheckpointManager, step: int) -> str:
  """Moves a damaged step's folder to `<folder>.damaged/<step>` (process 0); returns the path."""
  target = os.path.join(str(manager.directory) + ".damaged", str(step))
  if distributed.is_main():
    os.makedirs(os.path.dirname(target), exist_ok=True)
    n, free = 1, target
    while os.path.exists(free):
      free, n = f"{target}.{n}", n + 1
    shutil.move(_step_dir(manager, step), free)
    target = free
  distributed.sync(f"checkpoint {step} set aside")
  manager.reload()
  return target


def restore_latest(manager: ocp.CheckpointManager, like: Any,
                   log: Optional[Callable[[str], None]] = None,
                   set_aside: bool = True) -> Optional[tuple[int, Any, dict]]:
  """Restores the newest intact checkpoint into the structure, shapes and shardings of `like`.

  A damaged step is passed over with one line to `log` naming it and the damage, and, with
  `set_aside`, moved to `<folder>.damaged/` (readers of another run's workdir pass False: they
  change nothing). An intact step that does not fit `like` stops the restore (`restore`).

  Returns:
    (step, state, meta), or None when the directory holds no intact checkpoint.
  """
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      return restore(manager, step, like)
    except DamagedCheckpoint as e:
      where = f"; moved to {_set_aside(manager, step)}" if set_aside else ""
      if log is not None:
        log(f"warning: {e}: passed over{where}")
  return None


def metadata(manager: ocp.CheckpointManager) -> dict[int, dict]:
  """{step: meta} of every intact checkpoint the manager keeps (the JSON documents)."""
  out = {}
  for step in manager.all_steps():
    if _checked(manager, step) is None:
      try:
        out[step] = manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
      except Exception:  # pylint: disable=broad-except
        continue  # unreadable: not a rollback target
  return out
