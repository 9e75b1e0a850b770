"""Mesh shapes, the logical-axis table and the shardings built from it (one device suffices:
specs are checked on abstract meshes of the real sizes)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from rl_curriculum import curriculum as cur
from rl_curriculum.model import kv_cache, transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.train.setup import builders
from rl_curriculum.train.state import init_train_state


def abstract(data, fsdp, tensor):
  return AbstractMesh((data, fsdp, tensor), mesh_lib.MESH_AXES)


@pytest.mark.parametrize("shape,devices,expected", [
    ((-1, 1, 1), 8, (8, 1, 1)), ((2, -1, 1), 8, (2, 4, 1)), ((1, 2, -1), 8, (1, 2, 4)),
    ((2, 2, 2), 8, (2, 2, 2)), ((-1, 1, 1), 1, (1, 1, 1)), ((1, -1, 1), 6, (1, 6, 1))])
def test_resolve_mesh_shape(shape, devices, expected):
  assert mesh_lib.resolve_mesh_shape(shape, devices) == expected


@pytest.mark.parametrize("shape,devices", [
    ((2, 2, 2), 4), ((-1, -1, 1), 8), ((-1, 3, 1), 8), ((0, 1, 1), 8), ((8, 1), 8),
    ((3, 1, 1), 8)])
def test_resolve_mesh_shape_rejects(shape, devices):
  with pytest.raises(ValueError, match="mesh shape"):
    mesh_lib.resolve_mesh_shape(shape, devices)


def test_make_mesh_has_auto_axes_over_all_devices():
  mesh = mesh_lib.make_mesh((-1, 1, 1))
  assert mesh.axis_names == mesh_lib.MESH_AXES
  assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "tensor": 1}
  assert all(t == AxisType.Auto for t in mesh.axis_types)


@pytest.mark.parametrize("logical,shape,expected", [
    (("embed", "heads", "head_dim"), (32, 4, 8), P("fsdp", "tensor")),
    (("heads", "head_dim", "embed"), (4, 8, 32), P("tensor", None, "fsdp")),
    (("embed", "kv_heads", "head_dim"), (32, 1, 8), P("fsdp")),   # one kv head: replicated
    (("vocab", "embed"), (63, 32), P(None, "fsdp")),              # odd vocab stays whole
    (("embed",), (6,), P()),                                      # 6 % 4: replicated
    (("batch", "length"), (8, 5), P(("data", "fsdp"))),
    (("batch", "length"), (4, 5), P("data")),                     # 4 % (2 * 4): data only
    ((None, "mlp"), (3, 64), P(None, "tensor")),
    (("unknown", "mlp"), (3, 64), P(None, "tensor")),
])
def test_logical_to_mesh(logical, shape, expected):
  assert mesh_lib.logical_to_mesh(logical, shape, abstract(2, 4, 2)) == expected


def test_a_mesh_axis_is_used_once_per_array():
  rules = mesh_lib.axis_rules({"heads": "fsdp"})
  spec = mesh_lib.logical_to_mesh(("embed", "heads"), (32, 4), abstract(1, 4, 1), rules)
  assert spec == P("fsdp")
  assert mesh_lib.LOGICAL_AXIS_RULES["heads"] == "tensor"  # overrides never touch the table


def test_axis_rules_reject_unknown_mesh_axes():
  with pytest.raises(ValueError, match="mesh axes"):
    mesh_lib.axis_rules({"embed": "model"})
  with pytest.raises(ValueError, match="do not match"):
    mesh_lib.logical_to_mesh(("embed",), (4, 4), abstract(1, 1, 1))


def _state():
  config = ModelConfig.tiny(vocab_size=16, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1,
                            mlp_dim=16)
  _, params = transformer.init_model(config)
  optimizer = builders.build_optimizer(1e-3, max_grad_norm=1.0)
  return params, init_train_state(params, optimizer)


def test_train_state_shardings_follow_logical_names():
  params, state = _state()
  mesh = mesh_lib.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  shardings = mesh_lib.tree_shardings(state, mesh)
  assert jax.tree.structure(shardings) == jax.tree.structure(state)
  assert shardings.step.spec == P() and shardings.skipped.spec == P()
  q = shardings.params["blocks"][0]["attn"]["q"]["kernel"].get_value()
  assert q.spec == P("fsdp", "tensor")  # size-1 axes divide everything
  mu = shardings.opt_state[1][0].mu["blocks"][0]["attn"]["q"]["kernel"].get_value()
  assert mu.spec == q.spec          # Adam moments sharded like their parameters
  assert shardings.opt_state[1][0].count.spec == P()
  placed = jax.device_put(state, shardings)
  for x, y in zip(jax.tree.leaves(placed), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_opt_state_of_plain_arrays_matched_by_structure():
  params = {"w": jnp.ones((4, 2)), "b": jnp.zeros((2,))}
  optimizer = builders.build_optimizer(1e-3, max_grad_norm=1.0)
  mesh = mesh_lib.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  wanted = {"w": jax.sharding.NamedSharding(mesh, P("fsdp")),
            "b": mesh_lib.replicated(mesh)}
  shardings = mesh_lib.opt_state_shardings(optimizer.init(params), params, mesh,
                                           params_shardings=wanted)
  assert shardings[1][0].mu["w"].spec == P("fsdp")
  assert shardings[1][0].nu["b"].spec == P()
  assert shardings[1][0].count.spec == P()


def test_batch_shardings_split_rows_and_replicate_the_rest():
  mesh = mesh_lib.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  batch = {"tokens": np.zeros((8, 3), np.int32), "rewards": np.zeros((4, 2), np.float32),
           "ids": np.zeros((4,), np.int32)}
  shardings = mesh_lib.batch_shardings(batch, mesh, rows=8)
  assert shardings["tokens"].spec == P(("data", "fsdp"), None)
  assert shardings["rewards"].spec == P() and shardings["ids"].spec == P()
  with pytest.raises(ValueError, match="batch shards"):
    mesh_lib.batch_shardings(batch, abstract(2, 4, 1), rows=12)


def test_kv_cache_and_curriculum_shardings():
  cache = kv_cache.KVCache(k=(np.zeros((8, 10, 2, 4)),), v=(np.zeros((8, 10, 2, 4)),))
  specs = mesh_lib.kv_cache_shardings(cache, abstract(2, 2, 2))
  assert specs.k[0].spec == P(("data", "fsdp"), None, "tensor")
  # Two kv heads do not split over tensor = 4; the rows still split over the batch axes.
  assert mesh_lib.kv_cache_sharding(abstract(1, 1, 4), (8, 10, 2, 4)).spec == P(("data", "fsdp"))
  state = cur.sec(3, batch_size=4).init(cur.PromptPool.from_arms([0, 1, 2]),
                                        jax.random.PRNGKey(0))
  mesh = mesh_lib.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  assert all(s.spec == P() for s in jax.tree.leaves(mesh_lib.tree_shardings(state, mesh)))


def test_stacked_params_and_cache_of_a_scanned_model():
  """The leading `layers` axis is replicated; the other axes shard as in the unrolled model."""
  config = ModelConfig.tiny(vocab_size=16, d_model=8, num_layers=3, num_heads=2, num_kv_heads=2,
                            mlp_dim=16, scan_layers=True)
  _, params = transformer.init_model(config)
  assert mesh_lib.LOGICAL_AXIS_RULES["layers"] is None
  q_axes = params["blocks"]["attn"]["q"]["kernel"].get_metadata("out_sharding")
  assert mesh_lib.logical_to_mesh(q_axes, (3, 8, 2, 4), abstract(2, 2, 2)) == P(
      None, "fsdp", "tensor")
  mesh = mesh_lib.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  shardings = mesh_lib.param_shardings(params, mesh)
  assert jax.tree.structure(shardings) == jax.tree.structure(params)
  assert shardings["blocks"]["mlp"]["down"]["kernel"].get_value().spec == P(None, "tensor",
                                                                            "fsdp")
  assert shardings["embed"].get_value().spec == P("tensor", "fsdp")
  placed = jax.device_put(params, shardings)
  for x, y in zip(jax.tree.leaves(placed), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  cache = kv_cache.init_cache(config, 8, 10)
  specs = mesh_lib.kv_cache_shardings(cache, abstract(2, 2, 2))
  assert specs.k.spec == specs.v.spec == P(None, ("data", "fsdp"), None, "tensor")
  assert mesh_lib.kv_cache_sharding(abstract(1, 1, 4), (3, 8, 10, 2, 4)).spec == P(
      None, ("data", "fsdp"))


def _constraint_specs(fn, *args) -> list:
  """The PartitionSpecs of the sharding constraints `fn` traces to."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return [eqn.params["sharding"].spec for eqn in jaxpr.eqns
          if eqn.primitive.name == "sharding_constraint"]


def test_constrain_rows_puts_the_row_axis_over_the_batch_axes():
  mesh = mesh_lib.make_mesh((1, 1, 1))
  tree = {"a": jnp.zeros((2, 3, 4)), "b": jnp.zeros((5, 3))}
  assert _constraint_specs(lambda t: mesh_lib.constrain_rows(t, mesh, 1), tree) == [
      P(None, ("data", "fsdp"), None), P(None, ("data", "fsdp"))]
  assert _constraint_specs(lambda t: mesh_lib.constrain_rows(t, mesh), tree) == [
      P(("data", "fsdp"), None, None), P(("data", "fsdp"), None)]
  assert mesh_lib.constrain_rows(tree, None) is tree                # no mesh: unchanged


def test_constrain_rows_leaves_rows_that_do_not_divide_to_gspmd(monkeypatch):
  mesh = mesh_lib.make_mesh((1, 1, 1))
  monkeypatch.setattr(mesh_lib, "batch_size_of", lambda _: 4)   # as on 4 batch devices
  constrained = lambda n: _constraint_specs(lambda x: mesh_lib.constrain_rows(x, mesh),
                                            jnp.zeros((n, 2)))
  assert len(constrained(8)) == 1
  assert constrained(6) == []


def test_gathered_vocab_weights_casts_only_the_vocabulary_weights():
  config = ModelConfig.tiny(vocab_size=64, dtype="bfloat16", param_dtype="float32")
  _, params = transformer.init_model(config, seed=0)
  gathered = mesh_lib.gathered_vocab_weights(params, None, jnp.bfloat16)
  flat = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  out = dict(jax.tree_util.tree_flatten_with_path(gathered)[0])
  assert flat.keys() == out.keys()
  for path, x in flat.items():
    names = jax.tree_util.keystr(path)
    if "embed" in names and x.shape[0] == 64:   # the tied embedding: [vocab, d_model]
      assert out[path].dtype == jnp.bfloat16
      np.testing.assert_array_equal(np.asarray(out[path]), np.asarray(x.astype(jnp.bfloat16)))
    else:
      assert out[path].dtype == x.dtype
      np.testing.assert_array_equal(np.asarray(out[path]), np.asarray(x))
  assert any(out[p].dtype == jnp.bfloat16 for p in out)


@pytest.mark.parametrize("size,expected", [(16, ("data", "fsdp", "tensor")),
                                           (12, ("data", "tensor")), (6, ("data",)), (7, ())])
def test_vocab_axes_keep_the_mesh_axes_whose_product_divides_the_vocabulary(size, expected):
  mesh = AbstractMesh((2, 4, 2), mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  assert mesh_lib.vocab_axes(size, mesh) == expected
  # Axes of size 1 are never listed.
  flat = AbstractMesh((1, 8, 1), mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  assert mesh_lib.vocab_axes(64, flat) == ("fsdp",)


def test_vocab_sharded_layout_is_identity_without_a_mesh():
  _, params = transformer.init_model(ModelConfig.tiny(vocab_size=64), seed=0)
  assert mesh_lib.vocab_sharded_weights(params, None) is params
  x = jnp.ones((2, 3, 64))
  assert mesh_lib.vocab_sharded(x, None) is x
