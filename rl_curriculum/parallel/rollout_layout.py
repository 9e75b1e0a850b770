"""The rollout engine's own layout of the policy's weights, on the learner's devices.

The learner keeps its parameters split as the mesh's logical rules say (under FSDP every
weight's `embed` dimension over `fsdp`). A decode loop that reads weights in that layout
all-gathers every layer's weights again at each of its iterations: the learner's layout paid
once per generated token. Here the engine gets a copy of its own for the whole rollout call,
made once a step by jitted programs, one per array (`reshard`), over the same devices arranged as
a mesh of their own (`layout_mesh`):

  learner      the learner's mesh and layout (no copy; the decode loop gathers what it reads)
  replicated   every device holds the whole policy; rows split over all devices (data parallel)
  tensor       heads, key/value heads, MLP and vocabulary over a `tensor` axis of
               `parallel.rollout_tensor` devices (as far as the head counts divide), rows over
               the rest; the paged KV pool keeps each device's KV heads (`mesh.pool_sharding`)
  auto         the learner's layout when it already holds every weight whole (no fsdp or
               tensor axis); else the first of replicated, tensor 2, 4, ... whose copy takes at
               most `COPY_SHARE` of a device's memory (`choose`); the learner's if none does

The copy holds each matrix in the model's compute dtype (the model casts every matrix to it where
it reads it, so the tokens drawn are the same), and every vector (norm scales, which the model
multiplies in its parameter dtype) unchanged: half the bytes of float32 master weights under
bfloat16 compute.
"""

import functools
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh

from rl_curriculum.parallel import mesh as mesh_lib

LAYOUTS = ("learner", "replicated", "tensor", "auto")
# The largest share of one device's memory the engine's copy may take under `auto`: the learner's
# own shard of the run state, the KV cache and the decode's temporaries need the rest.
COPY_SHARE = 0.25


def layout_mesh(mesh: Mesh, layout: str, tensor: int = 1) -> Mesh:
  """The mesh the engine decodes on for `layout` ("learner", "replicated" or "tensor"; resolve
  "auto" with `choose` first): `mesh` itself, or the same devices in the same order as a mesh
  (devices / tensor, 1, tensor) over (data, fsdp, tensor).

  Raises:
    ValueError: an unknown layout, or a tensor size that does not divide the devices.
  """
  if layout == "learner":
    return mesh
  if layout not in ("replicated", "tensor"):
    raise ValueError(f"rollout layout {layout!r}: resolve 'auto' first; layouts are {LAYOUTS}")
  tensor = 1 if layout == "replicated" else int(tensor)
  devices = list(mesh.devices.flat)
  if tensor < 1 or len(devices) % tensor:
    raise ValueError(f"a rollout tensor axis of {tensor} does not divide {len(devices)} devices")
  # The learner's device order, reshaped (not `jax.make_mesh`, which may reorder a TPU slice's
  # devices): both meshes then have one device assignment, so one program may take arrays of
  # both, and a tensor group is a run of devices the learner's mesh keeps together.
  grid = np.asarray(devices, dtype=object).reshape(len(devices) // tensor, 1, tensor)
  return Mesh(grid, mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * len(mesh_lib.MESH_AXES))


def copy_bytes(params: Any, dtype: Any) -> int:
  """Bytes of the whole engine copy of `params` (arrays or shapes) in compute `dtype` (`cast`),
  before any split."""
  total = 0
  for x in jax.tree.leaves(cast_shapes(params, dtype)):
    total += int(math.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
  return total


def tensor_sizes(devices: int) -> tuple[int, ...]:
  """The tensor sizes `choose` tries: 2, 4, ... up to `devices`, each dividing `devices`."""
  sizes, t = [], 2
  while t <= devices:
    if devices % t == 0:
      sizes.append(t)
    t *= 2
  return tuple(sizes)


def choose(copy: int, device_bytes: Optional[int], devices: int,
           learner_whole: bool = False) -> tuple[str, int]:
  """(layout, tensor size) for `auto`: "learner" when the learner's mesh already holds every
  weight whole on each device (`learner_whole`: no copy to make); else "replicated" when the
  whole copy (`copy` bytes) fits in `COPY_SHARE` of `device_bytes` (or when the device memory is
  unknown, as on a CPU), else "tensor" with the smallest size in `tensor_sizes(devices)` whose
  share fits, else "learner"."""
  if learner_whole:
    return "learner", 1
  if device_bytes is None or copy <= COPY_SHARE * device_bytes:
    return "replicated", 1
  for t in tensor_sizes(devices):
    if copy / t <= COPY_SHARE * device_bytes:
      return "tensor", t
  return "learner", 1


def device_memory(devices: Sequence[jax.Device]) -> Optional[int]:
  """Bytes of memory of the first of `devices` as its runtime reports it, or None (a CPU)."""
  stats = devices[0].memory_stats() if hasattr(devices[0], "memory_stats") else None
  return None if not stats else stats.get("bytes_limit")


def _is_matrix(x: Any) -> bool:
  """Whether a parameter is cast for the engine: one with two or more dimensions besides a
  scanned model's `layers` axis."""
  value = x.get_value() if hasattr(x, "get_value") else x.value
  if value is None or not hasattr(value, "shape"):
    return False
  logical = tuple(nnx.get_partition_spec(x).get_value() or ())
  own = [name for name in logical if name != "layers"] if logical else list(value.shape)
  return len(own) >= 2


def _cast_to(x: Any, dtype: Any) -> Optional[Any]:
  """The dtype the engine's copy holds parameter `x` (an nnx.Variable) in: `dtype` for a
  floating matrix wider than it, None (as it is) for anything else."""
  dtype = jnp.dtype(dtype)
  if not _is_matrix(x):
    return None
  value = x.get_value() if hasattr(x, "get_value") else x.value
  wider = jnp.issubdtype(value.dtype, jnp.floating) and value.dtype.itemsize > dtype.itemsize
  return dtype if wider else None


def _cast(params: Any, dtype: Any, to: Any) -> Any:
  def one(x):
    target = _cast_to(x, dtype) if isinstance(x, nnx.Variable) else None
    if target is None:
      return x
    return x.replace(to(x.get_value() if hasattr(x, "get_value") else x.value, target))

  return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def cast(params: Any, dtype: Any) -> Any:
  """`params` (an nnx.State, or a tuple of them) with every floating matrix wider than `dtype`
  in `dtype`; vectors, narrower and integer leaves unchanged."""
  return _cast(params, dtype, lambda value, d: value.astype(d))


def cast_shapes(params: Any, dtype: Any) -> Any:
  """`cast` on shapes: `jax.ShapeDtypeStruct`s of `params`' arrays (or shapes) after it, with
  their shardings where they have them."""
  shapes = jax.tree.map(
      lambda x: None if x is None else jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      params, is_leaf=lambda x: x is None)
  return _cast(shapes, dtype, lambda value, d: jax.ShapeDtypeStruct(
      value.shape, d, sharding=getattr(value, "sharding", None)))


@functools.lru_cache(maxsize=None)
def _leaf_program(sharding: Any, dtype: Optional[str]):
  """The jitted program that lays out one array as `sharding`, cast to `dtype` (None: as is)."""
  if dtype is None:
    return jax.jit(lambda x: x, out_shardings=sharding)
  return jax.jit(lambda x: x.astype(dtype), out_shardings=sharding)


class Reshard:
  """The move of the policy from the learner's layout to the engine's: `cast` to `dtype`, laid
  out as `shardings` (the engine mesh's parameter shardings, `mesh.param_shardings`), one jitted
  program per array (`programs`) so that the move's temporaries are those of one array, not of
  the whole copy (a single program staged the whole gathered copy in temporaries: 5.75 GiB
  beside the 5.75 GiB output for Qwen2.5-3B on a v5e-8). Runs once a step (under LoRA: the
  adapters every step, the frozen base when it changed)."""

  def __init__(self, shardings: Any, dtype: Any):
    self.shardings = shardings
    self.dtype = jnp.dtype(dtype)

  def programs(self, params: Any) -> list:
    """[(program, array or shape, the shape it makes)] for every array of `params`, in tree
    order (the made shapes as `jax.ShapeDtypeStruct`s with their shardings)."""
    out = []

    def one(x, s):
      value = x.get_value() if hasattr(x, "get_value") else x.value
      if value is None:
        return x
      target = _cast_to(x, self.dtype)
      cast_to = None if target is None else target.name
      sharding = s.get_value() if hasattr(s, "get_value") else s.value
      made = jax.ShapeDtypeStruct(value.shape, cast_to or value.dtype, sharding=sharding)
      out.append((_leaf_program(sharding, cast_to), value, made))
      return x

    jax.tree.map(one, params, self.shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return out

  def __call__(self, params: Any) -> Any:
    moved = iter([program(value) for program, value, _ in self.programs(params)])
    return jax.tree.map(
        lambda x: x if (x.get_value() if hasattr(x, "get_value") else x.value) is None
        else x.replace(next(moved)),
        params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def reshard(shardings: Any, dtype: Any) -> Reshard:
  """The program(s) that make the engine's copy of a policy laid out as `shardings`, matrices
  in `dtype` (`Reshard`)."""
  return Reshard(shardings, dtype)
