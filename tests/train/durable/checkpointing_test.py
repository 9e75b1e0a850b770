"""Orbax round trip of a mixed pytree (arrays of several dtypes, a PRNG key, nested tuples);
sealed steps, and restores that pass over every kind of damage."""

import errno
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.train.durable import checkpointing


def test_round_trip_and_latest(tmp_path):
  state = {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)},
           "step": jnp.asarray(7, jnp.int32), "key": jax.random.PRNGKey(3),
           "cursor": (jnp.asarray([1, 2], jnp.int32), jnp.asarray(True))}
  manager = checkpointing.make_manager(str(tmp_path / "ckpt"), max_to_keep=2)
  assert checkpointing.restore_latest(manager, state) is None
  for step in (1, 2, 3):
    bumped = jax.tree.map(lambda x, s=step: x + s if x.dtype != jnp.bool_ else x, state)
    checkpointing.save(manager, step, bumped, {"note": f"s{step}"})
  manager.wait_until_finished()
  assert manager.all_steps() == [2, 3]
  step, restored, meta = checkpointing.restore_latest(manager, state)
  assert step == 3 and meta == {"note": "s3"}
  expected = jax.tree.map(lambda x: x + 3 if x.dtype != jnp.bool_ else x, state)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))
  manager.close()


# --- verified restores ----------------------------------------------------------------------------

_STATE = {"w": jnp.arange(2048.0).reshape(32, 64), "step": jnp.asarray(0, jnp.int32)}


def _saved(tmp_path, steps=(1, 2, 3)):
  """A manager holding checkpoints `steps` of _STATE + step."""
  manager = checkpointing.make_manager(str(tmp_path / "ckpt"), max_to_keep=5)
  for step in steps:
    checkpointing.save(manager, step, jax.tree.map(lambda x, s=step: x + s, _STATE), {"s": step})
  return manager


def _data_file(step_dir):
  """The largest file of a step's arrays (the one holding `w`)."""
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "state"))
           for f in fs]
  return max(files, key=os.path.getsize)


def _flip(path):
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    for i in range(0, len(data), 7):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(data)


def _truncate(path):
  os.truncate(path, os.path.getsize(path) // 2)


def _remove(name):
  return lambda step_dir: os.remove(os.path.join(step_dir, name))


DAMAGE = {
    "flipped bytes": (lambda d: _flip(_data_file(d)), "differs from what was written"),
    "a truncated data file": (lambda d: _truncate(_data_file(d)), "bytes, "),
    "no manifest": (_remove("state/manifest.ocdbt"), "state/manifest.ocdbt is missing"),
    "no array metadata": (_remove("state/_METADATA"), "state/_METADATA is missing"),
    "no checkpoint metadata": (_remove("_CHECKPOINT_METADATA"), "_CHECKPOINT_METADATA is missing"),
    "no seal": (_remove(checkpointing.CHECKSUMS), "no checksum record"),
}


def test_a_sealed_step_is_intact_and_records_every_file(tmp_path):
  manager = _saved(tmp_path, steps=(1,))
  step_dir = str(tmp_path / "ckpt" / "1")
  assert checkpointing.damage(step_dir) is None
  with open(os.path.join(step_dir, checkpointing.CHECKSUMS)) as f:
    sealed = json.load(f)
  files = {os.path.relpath(os.path.join(r, f), step_dir) for r, _, fs in os.walk(step_dir)
           for f in fs} - {checkpointing.CHECKSUMS}
  assert set(sealed) == files and "state/manifest.ocdbt" in files
  manager.close()


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_latest_step_falls_back_to_the_newest_intact_one(kind, tmp_path):
  manager = _saved(tmp_path)
  damage_fn, message = DAMAGE[kind]
  damage_fn(str(tmp_path / "ckpt" / "3"))
  with pytest.raises(checkpointing.CheckpointError, match=f"checkpoint 3 in .* is damaged: .*"
                     f"{message}"):
    checkpointing.restore(manager, 3, _STATE)  # asked for by number: refused
  lines = []
  step, restored, meta = checkpointing.restore_latest(manager, _STATE, lines.append)
  assert (step, meta) == (2, {"s": 2})
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(_STATE["w"]) + 2)
  assert len(lines) == 1 and lines[0].startswith("warning: checkpoint 3 in ")
  assert message in lines[0]
  assert f"moved to {tmp_path / 'ckpt.damaged' / '3'}" in lines[0]
  assert manager.all_steps() == [1, 2] and os.path.isdir(tmp_path / "ckpt.damaged" / "3")
  manager.close()


def test_damaged_steps_are_no_rollback_targets_and_readers_move_nothing(tmp_path):
  manager = _saved(tmp_path)
  _flip(_data_file(str(tmp_path / "ckpt" / "2")))
  assert sorted(checkpointing.metadata(manager)) == [1, 3]
  _remove(checkpointing.CHECKSUMS)(str(tmp_path / "ckpt" / "3"))
  lines = []
  step, _, _ = checkpointing.restore_latest(manager, _STATE, lines.append, set_aside=False)
  assert step == 1 and len(lines) == 2 and "passed over" in lines[0]
  assert manager.all_steps() == [1, 2, 3]  # as they were
  manager.close()


def test_no_intact_step_restores_nothing(tmp_path):
  manager = _saved(tmp_path, steps=(1,))
  _truncate(_data_file(str(tmp_path / "ckpt" / "1")))
  assert checkpointing.restore_latest(manager, _STATE, lambda _: None) is None
  manager.close()


def test_a_failed_write_is_one_error_naming_the_step(tmp_path, monkeypatch):
  manager = _saved(tmp_path, steps=(1,))

  def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(manager, "save", full_disk)
  with pytest.raises(checkpointing.CheckpointError, match=r"could not write the checkpoint of "
                     r"step 2 in .*ckpt: OSError: \[Errno 28\] No space left on device"):
    checkpointing.save(manager, 2, _STATE, {})
  monkeypatch.undo()
  assert checkpointing.restore_latest(manager, _STATE)[0] == 1
  manager.close()


def test_a_disk_without_room_stops_the_save_before_it_writes(tmp_path, monkeypatch):
  """The arrays of _STATE take 8 KiB; the check asks for them plus 1 MiB."""
  manager = _saved(tmp_path, steps=(1,))
  real = checkpointing.shutil.disk_usage
  room = {"free": 2**20 + 8 * 1024 + 4}
  monkeypatch.setattr(checkpointing.shutil, "disk_usage",
                      lambda path: real(path)._replace(free=room["free"]))
  room["free"] -= 8  # 4 bytes short
  with pytest.raises(checkpointing.CheckpointError, match=r"could not write the checkpoint of "
                     r"step 2 in .*ckpt: it needs about 1 MiB and the disk has 1 MiB free; the "
                     r"checkpoints before it are intact"):
    checkpointing.save(manager, 2, _STATE, {})
  assert manager.all_steps() == [1] and not [n for n in os.listdir(tmp_path / "ckpt")
                                              if n.startswith("2")]
  room["free"] += 8  # exactly enough: it saves
  checkpointing.save(manager, 2, _STATE, {})
  assert manager.all_steps() == [1, 2]
  manager.close()


def test_an_intact_step_of_another_layout_is_not_damage_and_stays(tmp_path):
  manager = _saved(tmp_path, steps=(1, 2))
  other = {**_STATE, "extra": jnp.zeros(3)}  # e.g. a curriculum with more state
  with pytest.raises(checkpointing.CheckpointError, match="checkpoint 2 in .* is intact but "
                     "holds a state of another layout") as error:
    checkpointing.restore_latest(manager, other, lambda _: None)
  assert not isinstance(error.value, checkpointing.DamagedCheckpoint)
  assert manager.all_steps() == [1, 2]  # nothing moved aside
  manager.close()
