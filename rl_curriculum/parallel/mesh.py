"""The device mesh and every sharding of the run: the one place that knows the mesh axes.

Mesh axes (`MESH_AXES`):
  data     pure data parallelism: each slice holds whole parameters and its own prompts
  fsdp     data parallelism that also splits parameters and optimizer state (ZeRO-3 / FSDP):
           the parameter dimension named `embed` is sharded over it, gathered for each use
  tensor   tensor (Megatron) parallelism: `heads`, `kv_heads`, `mlp` and `vocab` are split

Batches (prompts, rollouts, KV caches) put their row dimension over ("data", "fsdp"); the
curriculum state and everything small (rewards [P, G], selections, scalars) is replicated.
A scanned model's stacked parameters and KV cache lead with a `layers` axis, which is never
split (rule `layers`: None): every device holds all layers of its shard of the other axes.

`LOGICAL_AXIS_RULES` is the single table from the model's logical axis names (see
`model/transformer.py`, and `model/layer_stacking.py` for `layers`) to mesh axes; pass
`rules=axis_rules({...})` to override entries. A dimension keeps only the mesh axes that divide
it and that no earlier dimension of the same array already uses, so e.g. two key/value heads
stay replicated on a `tensor` axis of 4 (rule order is dimension order; dropped axes mean
replicated, never an error).

  mesh = make_mesh((-1, 1, 1))                      # all devices on `data`
  shardings = tree_shardings(train_state, mesh)     # params/opt state from logical names
  train_state = jax.device_put(train_state, shardings)   # or distributed.place for multi-host

`jax.make_mesh` in the installed JAX defaults to Explicit axes; meshes here are built with Auto
axes so `jax.jit` partitions by GSPMD from the input shardings, with no sharding in types.
"""

import math
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

MeshAxes = Union[None, str, Tuple[str, ...]]

# logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).
LOGICAL_AXIS_RULES: dict[str, MeshAxes] = {
    "batch": BATCH_AXES,   # rows of prompts, rollouts, KV caches
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "length": None,        # sequence / cache slots
    "layers": None,        # leading layer axis of a scanned model's stacked parameters / cache
}


def axis_rules(overrides: Optional[Mapping[str, MeshAxes]] = None) -> dict[str, MeshAxes]:
  """`LOGICAL_AXIS_RULES` with `overrides` applied (a new dict; the table is never mutated).

  Raises:
    ValueError: an override names a mesh axis outside `MESH_AXES`.
  """
  rules = dict(LOGICAL_AXIS_RULES)
  for name, axes in (overrides or {}).items():
    for axis in _as_tuple(axes):
      if axis not in MESH_AXES:
        raise ValueError(f"axis rule {name!r} -> {axes!r}: mesh axes are {MESH_AXES}")
    rules[name] = axes
  return rules


def _as_tuple(axes: MeshAxes) -> Tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> Tuple[int, ...]:
  """The mesh shape with at most one -1 replaced so that the product is `num_devices`.

  Raises:
    ValueError: more than one -1, a size < 1 other than -1, or a product that does not match
      (e.g. (2, 2, 2) on 4 devices, (-1, 3, 1) on 8).
  """
  shape = tuple(int(s) for s in shape)
  if len(shape) != len(MESH_AXES):
    raise ValueError(f"mesh shape {shape} needs {len(MESH_AXES)} sizes for axes {MESH_AXES}")
  if shape.count(-1) > 1 or any(s < 1 and s != -1 for s in shape):
    raise ValueError(f"mesh shape {shape}: sizes must be >= 1, with at most one -1")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ValueError(f"mesh shape {shape}: {num_devices} devices do not divide by {known}")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != num_devices:
    raise ValueError(f"mesh shape {shape} holds {math.prod(shape)} devices, but there are "
                     f"{num_devices}; use -1 for one axis to take the rest")
  return shape


def make_mesh(shape: Sequence[int] = (-1, 1, 1),
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A mesh over `devices` (default: all devices of all processes) with axes `MESH_AXES`.

  Args:
    shape: sizes of (data, fsdp, tensor); one may be -1 (the remaining devices).
    devices: the devices to use (e.g. `jax.devices()[:4]`); their count fixes the -1.

  Axes are `AxisType.Auto`: `jax.jit` propagates shardings from its inputs (GSPMD).
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(shape, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def batch_size_of(mesh: Mesh) -> int:
  """Number of batch shards: the product of the sizes of `BATCH_AXES`."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def logical_to_mesh(logical: Sequence[Optional[str]], shape: Sequence[int], mesh: Mesh,
                    rules: Optional[Mapping[str, MeshAxes]] = None) -> PartitionSpec:
  """The mesh PartitionSpec of an array with logical axis names `logical` and shape `shape`.

  Each dimension gets the mesh axes its name maps to, keeping an axis only if the dimension
  stays divisible by the product of the axes kept so far and no earlier dimension took it; an
  unnamed (None) dimension, or one whose name is not in the table, is replicated.

  Raises:
    ValueError: `logical` and `shape` differ in length.
  """
  rules = LOGICAL_AXIS_RULES if rules is None else rules
  if len(logical) != len(shape):
    raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
  used, out = set(), []
  for name, size in zip(logical, shape):
    kept = []
    for axis in _as_tuple(rules.get(name)) if name is not None else ():
      n = mesh.shape[axis]
      if axis in used or size % (math.prod(mesh.shape[a] for a in kept) * n):
        continue
      kept.append(axis)
    used.update(kept)
    out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  while out and out[-1] is None:
    out.pop()
  return PartitionSpec(*out)


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding of an array every device holds whole (curriculum state, scalars, rewards)."""
  return NamedSharding(mesh, PartitionSpec())


def _shape(x) -> Optional[Tuple[int, ...]]:
  return tuple(x.shape) if hasattr(x, "shape") else None


def tree_shardings(tree: Any, mesh: Mesh, rules: Optional[Mapping[str, MeshAxes]] = None,
                   like: Any = None, like_shardings: Any = None) -> Any:
  """NamedShardings for every array of `tree`, with the tree's structure (nnx Variables kept).

  - an `nnx.Variable` (parameters, and the optax moments of nnx parameters, which keep the
    Variable and its metadata) is sharded by its logical names (`out_sharding` metadata);
  - a subtree with the structure of `like` (e.g. optimizer moments of plain-array parameters)
    gets `like_shardings`, where the leaf shapes match;
  - every other array (step counters, whitening statistics, curriculum state) is replicated.

  Works for parameters, optimizer state, a whole `TrainState`, or `(train_state, frozen)`.
  """
  rules = LOGICAL_AXIS_RULES if rules is None else rules
  rep = replicated(mesh)
  like_def = None if like is None else jax.tree.structure(like)

  def matches_like(x) -> bool:
    if like_def is None or isinstance(x, nnx.Variable) or x is None:
      return False
    try:
      return jax.tree.structure(x) == like_def and all(
          _shape(a) == _shape(b) for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(like)))
    except (TypeError, ValueError):
      return False

  def one(x):
    if matches_like(x):
      return like_shardings
    if isinstance(x, nnx.Variable):
      value = x.get_value() if hasattr(x, "get_value") else x.value
      if value is None or not hasattr(value, "shape"):
        return x.replace(None)
      logical = nnx.get_partition_spec(x).get_value()
      if len(logical) == 0:
        return x.replace(rep)
      return x.replace(NamedSharding(mesh, logical_to_mesh(tuple(logical), value.shape, mesh,
                                                           rules)))
    return rep if hasattr(x, "shape") else None

  return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable) or matches_like(x))


def param_shardings(params: Any, mesh: Mesh,
                    rules: Optional[Mapping[str, MeshAxes]] = None) -> Any:
  """Shardings of model parameters (an `nnx.State`, or a tuple of states) from their logical
  axis names."""
  return tree_shardings(params, mesh, rules)


def _vocab_weights(params: Any, recast: Any) -> Any:
  """`params` with `recast(value, logical)` applied to each weight that has a `vocab` axis (the
  embedding, an untied head); other leaves unchanged."""

  def one(x):
    if not isinstance(x, nnx.Variable):
      return x
    value = x.get_value() if hasattr(x, "get_value") else x.value
    logical = tuple(nnx.get_partition_spec(x).get_value() or ())
    if value is None or "vocab" not in logical:
      return x
    return x.replace(recast(value, logical))

  return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def gathered_vocab_weights(params: Any, mesh: Optional[Mesh], dtype: Any,
                           rules: Optional[Mapping[str, MeshAxes]] = None) -> Any:
  """`params` with each weight that has a `vocab` axis (the embedding, an untied head) in the
  compute `dtype` and, under `mesh`, gathered over every axis but `vocab` (a sharding
  constraint). A decode loop reads these weights every step: gathered once before the loop, in
  the dtype the model computes in, they are one copy at half the bytes of float32 rather than a
  float32 copy per loop (XLA hoists a loop-invariant gather out of each loop). The values the
  model computes with are unchanged (it casts them to `dtype` where it reads them)."""
  rules = LOGICAL_AXIS_RULES if rules is None else rules

  def recast(value, logical):
    value = value.astype(dtype)
    if mesh is None:
      return value
    kept = tuple(name if name == "vocab" else None for name in logical)
    return jax.lax.with_sharding_constraint(
        value, NamedSharding(mesh, logical_to_mesh(kept, value.shape, mesh, rules)))

  return _vocab_weights(params, recast)


def vocab_axes(size: int, mesh: Mesh) -> Tuple[str, ...]:
  """The mesh axes (in `MESH_AXES` order, those of size > 1) over which a vocabulary of `size`
  entries is split by `vocab_sharded_weights`: each one kept if its size times that of the axes
  kept before it divides `size`."""
  kept = []
  for axis in MESH_AXES:
    n = mesh.shape[axis]
    if n > 1 and size % (math.prod(mesh.shape[a] for a in kept) * n) == 0:
      kept.append(axis)
  return tuple(kept)


def _vocab_spec(ndim: int, vocab_dim: int, axes: Tuple[str, ...]) -> PartitionSpec:
  spec = [None] * ndim
  spec[vocab_dim] = axes if len(axes) > 1 else (axes[0] if axes else None)
  return PartitionSpec(*spec)


def vocab_sharded_weights(params: Any, mesh: Optional[Mesh]) -> Any:
  """`params` with each weight that has a `vocab` axis split over that axis on every mesh axis
  that divides it (`vocab_axes`) and whole along its other axes (a sharding constraint; dtype
  unchanged; None: unchanged). The layout of a vocabulary-parallel output head: each device
  computes the logits of its share of the vocabulary for every row, and the gradient of the
  weights stays split the same way (`vocab_sharded`), so no device holds the whole head or its
  whole gradient."""
  if mesh is None:
    return params

  def recast(value, logical):
    spec = _vocab_spec(value.ndim, logical.index("vocab"), vocab_axes(value.shape[logical.index(
        "vocab")], mesh))
    return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec))

  return _vocab_weights(params, recast)


def vocab_sharded(x: jax.Array, mesh: Optional[Mesh]) -> jax.Array:
  """`x` [..., V] (logits of a vocabulary-parallel head) with its last dimension over
  `vocab_axes(V, mesh)` and its other dimensions whole (a sharding constraint; None: unchanged)."""
  if mesh is None:
    return x
  spec = _vocab_spec(x.ndim, x.ndim - 1, vocab_axes(x.shape[-1], mesh))
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def opt_state_shardings(opt_state: Any, params: Any, mesh: Mesh,
                        rules: Optional[Mapping[str, MeshAxes]] = None,
                        params_shardings: Any = None) -> Any:
  """Shardings of an optax state: moments shaped like `params` are sharded like the parameters
  (from the Variable metadata they carry, or, for plain-array parameters, by structure with
  `params_shardings`, default `param_shardings(params)`); counters are replicated."""
  if params_shardings is None:
    params_shardings = param_shardings(params, mesh, rules)
  return tree_shardings(opt_state, mesh, rules, like=params, like_shardings=params_shardings)


def batch_sharding(mesh: Mesh, ndim: int, rules: Optional[Mapping[str, MeshAxes]] = None,
                   axis: int = 0) -> NamedSharding:
  """Rows (dimension `axis`, 0 by default) over the batch axes, the other dimensions whole."""
  rules = LOGICAL_AXIS_RULES if rules is None else rules
  axes = _as_tuple(rules["batch"])
  spec = [None] * ndim
  spec[axis] = axes if axes else None
  return NamedSharding(mesh, PartitionSpec(*spec))


def constrain_rows(tree: Any, mesh: Optional[Mesh], axis: int = 0) -> Any:
  """Every array of `tree` with its rows (dimension `axis`) over the batch axes of `mesh` (a
  sharding constraint; None: unchanged). Minibatches, microbatches and a group's shared prompt
  cache are gathered, reshaped or repeated from the row-sharded batch, and without the constraint
  GSPMD may keep such rows whole on every device. Arrays whose rows do not divide over the batch
  axes are left to GSPMD."""
  if mesh is None:
    return tree
  shards = batch_size_of(mesh)

  def one(x):
    if x.shape[axis] % shards:
      return x
    return jax.lax.with_sharding_constraint(
        x, batch_sharding(mesh, x.ndim, axis=axis))

  return jax.tree.map(one, tree)


def batch_shardings(tree: Any, mesh: Mesh, rows: int,
                    rules: Optional[Mapping[str, MeshAxes]] = None) -> Any:
  """Shardings of a batch pytree (e.g. `rl_types.Batch`, `types.Rollout`): every array whose
  leading dimension is `rows` is split by rows over the batch axes; the rest (rewards [P, G],
  prompt ids [P], ...) is replicated.

  Raises:
    ValueError: `rows` is not divisible by the number of batch shards.
  """
  rules = LOGICAL_AXIS_RULES if rules is None else rules
  shards = math.prod(mesh.shape[a] for a in _as_tuple(rules["batch"]))
  if rows % shards:
    raise ValueError(f"{rows} batch rows do not split over {shards} batch shards "
                     f"(mesh {dict(mesh.shape)}); choose a batch divisible by {shards}")
  rep = replicated(mesh)
  return jax.tree.map(
      lambda x: batch_sharding(mesh, x.ndim, rules) if x.ndim and x.shape[0] == rows else rep,
      tree)


def kv_cache_sharding(mesh: Mesh, shape: Sequence[int],
                      rules: Optional[Mapping[str, MeshAxes]] = None) -> NamedSharding:
  """The sharding of one layer's keys or values [B, S, Hkv, head_dim], or of a scanned model's
  stacked ones [L, B, S, Hkv, head_dim]: the layer axis per the `layers` rule (replicated), rows
  over the batch axes, key/value heads over `tensor` when they divide."""
  logical = ("batch", "length", "kv_heads", "head_dim")
  if len(shape) == len(logical) + 1:
    logical = ("layers",) + logical
  return NamedSharding(mesh, logical_to_mesh(logical, shape, mesh, rules))


def kv_cache_shardings(cache: Any, mesh: Mesh,
                       rules: Optional[Mapping[str, MeshAxes]] = None) -> Any:
  """Shardings of a `kv_cache.KVCache`: L x [B, S, Hkv, head_dim] keys and values (unrolled)
  or one [L, B, S, Hkv, head_dim] each (scanned)."""
  return jax.tree.map(lambda x: kv_cache_sharding(mesh, x.shape, rules), cache)


def shard_bytes(tree: Any) -> int:
  """Bytes one device holds of `tree`'s arrays (or `jax.ShapeDtypeStruct`s), each leaf's shard
  shape from its sharding (a leaf without one counts whole). The memory planner's and the loop's
  measure of what a program's inputs occupy per device. A Python number counts as the scalar jit
  makes of it."""
  total = 0
  for x in jax.tree.leaves(tree):
    if not hasattr(x, "shape"):
      x = jax.ShapeDtypeStruct((), jnp.result_type(x))
    sharding = getattr(x, "sharding", None)
    shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
    total += int(np.prod(shape, dtype=np.int64)) * x.dtype.itemsize
  return total


def describe(mesh: Mesh) -> str:
  """One line for logs: 'mesh data=8 fsdp=1 tensor=1 over 8 devices in 1 process(es)'."""
  sizes = " ".join(f"{a}={mesh.shape[a]}" for a in mesh.axis_names)
  procs = len({d.process_index for d in np.asarray(mesh.devices).flat})
  return f"mesh {sizes} over {mesh.size} devices in {procs} process(es)"


def per_shard(mesh: Optional[Mesh]) -> Optional[Callable]:
  """None without a mesh; else `run(fn, args, in_axes, out_axes, heads_in=None, heads_out=None)`:
  fn on each device's block of every argument (`jax.shard_map`), split over the batch axes at
  `in_axes` (outputs: `out_axes`) and over `tensor` at `heads_in` / `heads_out` where they name
  an axis (heads fn treats each on its own, dividing by `run.tensor`; `run.shards`: the batch
  shards). For kernels XLA cannot partition (Pallas TPU calls): GSPMD would refuse them."""
  if mesh is None:
    return None
  axes, tensor, shards = _as_tuple(LOGICAL_AXIS_RULES["batch"]), mesh.shape["tensor"], \
      batch_size_of(mesh)

  def spec(ndim, axis, head):
    return PartitionSpec(*(axes if i == axis else "tensor" if i == head and tensor > 1 else None
                           for i in range(ndim)))

  def local(x, axis, head):  # one device's block of x
    shape = [n // (shards if i == axis else tensor if i == head else 1)
             for i, n in enumerate(x.shape)]
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)

  def run(fn, args, in_axes, out_axes, heads_in=None, heads_out=None):
    heads_in = (None,) * len(args) if heads_in is None else heads_in
    shapes = jax.eval_shape(fn, *(local(x, a, h) for x, a, h in zip(args, in_axes, heads_in)))
    heads_out = jax.tree.map(lambda _: None, out_axes) if heads_out is None else heads_out
    out_specs = jax.tree.map(lambda s, a, h: spec(len(s.shape), a, h), shapes, out_axes,
                             heads_out, is_leaf=lambda x: x is None)
    return jax.shard_map(fn, mesh=mesh, in_specs=tuple(spec(x.ndim, a, h) for x, a, h in
                                                        zip(args, in_axes, heads_in)),
                         out_specs=out_specs, check_vma=False)(*args)
  run.shards, run.tensor = shards, tensor  # the arguments' split axes must divide by them
  return run


def pool_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
  """The sharding of a paged KV pool [L, Pg, page_size, 2 Hkv, d] (keys and values interleaved
  by head): pages over the batch axes, KV heads over `tensor` when Hkv divides by it."""
  tensor = mesh.shape["tensor"]
  heads = "tensor" if tensor > 1 and (shape[3] // 2) % tensor == 0 else None
  pages = _as_tuple(LOGICAL_AXIS_RULES["batch"]) if shape[1] % batch_size_of(mesh) == 0 else None
  return NamedSharding(mesh, PartitionSpec(None, pages, None, heads, None))


class RowLayout:
  """The `constrain(tree, axis=0)` argument of the model's functions for a run on `mesh`: rows
  over its batch axes (`constrain_rows`); its `per_shard` runs a kernel XLA cannot partition
  on each device's rows (`per_shard`)."""

  def __init__(self, mesh: Mesh):
    self.mesh = mesh
    self.per_shard = per_shard(mesh)

  def __call__(self, tree: Any, axis: int = 0) -> Any:
    return constrain_rows(tree, self.mesh, axis)


def row_layout(mesh: Optional[Mesh]) -> Optional[RowLayout]:
  """`RowLayout(mesh)`, or None without a mesh."""
  return None if mesh is None else RowLayout(mesh)
