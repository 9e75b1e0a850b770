"""Prints one SHA-256 over a run's saved state: two runs with equal digests ended bit for bit equal.

  python -m experiments.tools.state_digest --workdir workdirs/quickstart            # newest step
  python -m experiments.tools.state_digest --workdir workdirs/quickstart --step 10
  python -m experiments.tools.state_digest --workdir W --parts train,curriculum   # parts only

The digest covers every array of the checkpoint's state (train state, curriculum state, data
cursors, key), each by its path in the tree, dtype, shape and bytes, in path order; the host-side
metadata (timings, the config's fingerprint) is left out. Use it to check that a change meant to
leave a run's numbers alone did: run the same config before and after, compare the two lines.
`--parts` restricts it to some subtrees of the state, named by dotted paths (train,
curriculum, rollouts.engine, ...), when a change gave the state new parts but must leave these
alone.
"""

import hashlib
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
import jax
import numpy as np
import orbax.checkpoint as ocp

from rl_curriculum.train.durable import checkpointing

_WORKDIR = flags.DEFINE_string("workdir", None, "the run's workdir (holds checkpoints/)")
_STEP = flags.DEFINE_integer("step", None, "the checkpoint step (default: the newest)")
_PARTS = flags.DEFINE_list("parts", None, "dotted paths of the subtrees to digest (default: all)")


def tree_digest(tree: Any) -> str:
  """The SHA-256 (hex) of every array leaf of `tree`: its path, dtype, shape and bytes, in the
  order of the leaves' paths."""
  digest = hashlib.sha256()
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
    array = np.asarray(leaf)
    digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}|".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()


def state_digest(workdir: str, step: Optional[int] = None,
                 parts: Optional[Sequence[str]] = None) -> tuple[int, str]:
  """(step, digest) of checkpoint `step` of `workdir` (None: the newest), verified first; of the
  subtrees at the dotted paths `parts` only, when given.

  Raises:
    checkpointing.CheckpointError: no checkpoint, or the step's files are damaged.
    KeyError: a part the state does not have.
  """
  manager = checkpointing.make_manager(f"{workdir}/checkpoints")
  try:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise checkpointing.CheckpointError(f"no checkpoint in {workdir}/checkpoints")
    damage = checkpointing.damage(f"{workdir}/checkpoints/{step}")
    if damage:
      raise checkpointing.CheckpointError(f"checkpoint {step} of {workdir} is damaged: {damage}")
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  finally:
    manager.close()
  state = restored["state"]
  if parts:
    chosen = {}
    for part in parts:
      tree = state
      for key in part.split("."):
        tree = tree[key]
      chosen[part] = tree
    state = chosen
  return step, tree_digest(state)


def main(argv: Sequence[str]) -> None:
  del argv
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  try:
    step, digest = state_digest(_WORKDIR.value, _STEP.value, _PARTS.value)
  except (checkpointing.CheckpointError, KeyError) as e:
    raise SystemExit(f"state_digest: {e}") from None
  print(f"step {step} {digest}")


if __name__ == "__main__":
  app.run(main)
