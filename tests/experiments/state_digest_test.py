"""Tests of experiments/tools/state_digest.py: one SHA-256 over a saved state."""

import numpy as np
import pytest

from experiments.tools import state_digest
from rl_curriculum.train.durable import checkpointing


def _tree():
  return {"train": {"params": np.arange(6, dtype=np.float32).reshape(2, 3),
                    "step": np.int32(4)},
          "curriculum": {"q": np.zeros(3, np.float32)}}


def test_equal_trees_have_equal_digests_and_any_change_shows():
  digest = state_digest.tree_digest(_tree())
  assert digest == state_digest.tree_digest(_tree())
  changed = _tree()
  changed["train"]["params"][1, 2] = np.nextafter(np.float32(5), np.float32(6))  # one ulp
  assert state_digest.tree_digest(changed) != digest
  retyped = _tree()
  retyped["curriculum"]["q"] = np.zeros(3, np.float64)
  assert state_digest.tree_digest(retyped) != digest
  moved = _tree()
  moved["curriculum"] = {"r": moved["curriculum"]["q"]}  # the same bytes under another path
  assert state_digest.tree_digest(moved) != digest


def test_a_saved_state_is_digested_whole_or_by_parts(tmp_path):
  manager = checkpointing.make_manager(str(tmp_path / "checkpoints"), writer=True)
  checkpointing.save(manager, 3, _tree(), {})
  manager.close()
  step, digest = state_digest.state_digest(str(tmp_path))
  assert step == 3 and digest == state_digest.tree_digest(_tree())
  _, train = state_digest.state_digest(str(tmp_path), parts=["train"])
  assert train == state_digest.tree_digest({"train": _tree()["train"]})
  with pytest.raises(KeyError):
    state_digest.state_digest(str(tmp_path), parts=["rollouts.engine"])
  with pytest.raises(checkpointing.CheckpointError, match="no checkpoint"):
    state_digest.state_digest(str(tmp_path / "elsewhere"))
