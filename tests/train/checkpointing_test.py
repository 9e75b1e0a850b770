"""Orbax round trip of a mixed pytree (arrays of several dtypes, a PRNG key, nested tuples)."""

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.train import checkpointing


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
