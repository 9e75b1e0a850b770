"""The engine's own layout of the weights (rl_curriculum/parallel/rollout_layout.py): which layout
`auto` picks, the copy's dtype, and that a copy in the compute dtype draws the same tokens. (On 8
fake devices, the engine on each layout against one device: continuous_sharded_test.py; the
planner's counts of it: tests/plan/tpu_test.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.parallel import rollout_layout
from rl_curriculum.sampling import sampler

GIB = 2 ** 30


def test_auto_takes_the_first_layout_whose_copy_fits_a_quarter_of_a_device():
  assert rollout_layout.tensor_sizes(8) == (2, 4, 8)
  assert rollout_layout.tensor_sizes(6) == (2,)
  assert rollout_layout.tensor_sizes(1) == ()
  choose = rollout_layout.choose
  assert choose(4 * GIB, 16 * GIB, 8) == ("replicated", 1)
  assert choose(4 * GIB + 1, 16 * GIB, 8) == ("tensor", 2)
  assert choose(6 * GIB, 16 * GIB, 8) == ("tensor", 2)       # the 3B model in bfloat16
  assert choose(15 * GIB, 16 * GIB, 8) == ("tensor", 4)      # the 7B model in bfloat16
  assert choose(40 * GIB, 16 * GIB, 8) == ("learner", 1)     # no split of 8 brings it to 4 GiB
  assert choose(40 * GIB, None, 8) == ("replicated", 1)      # a CPU reports no memory
  assert choose(1, 16 * GIB, 8, learner_whole=True) == ("learner", 1)  # data parallel already


def test_layout_meshes_keep_the_learners_devices_in_order():
  mesh = mesh_lib.make_mesh((1, 1, 1))
  assert rollout_layout.layout_mesh(mesh, "learner") is mesh
  same = rollout_layout.layout_mesh(mesh, "replicated")
  assert dict(same.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
  assert list(same.devices.flat) == list(mesh.devices.flat)
  with pytest.raises(ValueError, match="does not divide 1 devices"):
    rollout_layout.layout_mesh(mesh, "tensor", 2)
  with pytest.raises(ValueError, match="resolve 'auto' first"):
    rollout_layout.layout_mesh(mesh, "auto")


def _model(dtype):
  config = ModelConfig.tiny(vocab_size=64, d_model=64, num_layers=2, num_heads=4,
                            num_kv_heads=2, mlp_dim=128, scan_layers=True, dtype=dtype,
                            param_dtype="float32")
  return transformer.init_model(config, seed=0)


def _variables(params):
  return jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def test_the_copy_holds_matrices_in_the_compute_dtype_and_vectors_as_they_are():
  _, params = _model("bfloat16")
  copy = rollout_layout.cast(params, jnp.bfloat16)
  kinds = set()
  for before, after in zip(_variables(params), _variables(copy)):
    logical = tuple(nnx.get_partition_spec(before).get_value() or ())
    matrix = len([n for n in logical if n != "layers"]) >= 2
    assert after.get_value().dtype == (jnp.bfloat16 if matrix else jnp.float32), logical
    kinds.add(matrix)
  assert kinds == {True, False}  # the model has both (norm scales stacked over layers: [L, D])
  shapes = rollout_layout.cast_shapes(params, jnp.bfloat16)
  assert [x.get_value().dtype for x in _variables(shapes)] == [
      x.get_value().dtype for x in _variables(copy)]
  moved = rollout_layout.reshard(mesh_lib.param_shardings(params, mesh_lib.make_mesh()),
                                 jnp.bfloat16)(params)
  for a, b in zip(_variables(moved), _variables(copy)):
    assert a.get_value().dtype == b.get_value().dtype
    np.testing.assert_array_equal(np.asarray(a.get_value(), np.float32),
                                  np.asarray(b.get_value(), np.float32))
  total = sum(x.get_value().size * x.get_value().dtype.itemsize for x in _variables(copy))
  assert rollout_layout.copy_bytes(params, jnp.bfloat16) == total
  assert rollout_layout.copy_bytes(params, jnp.float32) == sum(
      x.get_value().nbytes for x in _variables(params))


def test_a_copy_in_the_compute_dtype_draws_the_same_tokens():
  """bfloat16 compute on float32 parameters: the model casts each matrix where it reads it, so a
  copy cast beforehand samples the same tokens with the same log-probs."""
  graphdef, params = _model("bfloat16")
  prompts = np.random.default_rng(0).integers(1, 64, size=(4, 5)).astype(np.int32)
  mask = np.ones_like(prompts, bool)
  draw = lambda p: jax.device_get(sampler.sample(
      graphdef, p, prompts, mask, jax.random.PRNGKey(3), max_new_tokens=6, eos_id=64,
      temperature=1.0))
  ref, copy = draw(params), draw(rollout_layout.cast(params, jnp.bfloat16))
  np.testing.assert_array_equal(copy.tokens, ref.tokens)
  np.testing.assert_array_equal(copy.logprobs, ref.logprobs)
