"""The two layouts of a model's decoder blocks, and the maps between them.

  per layer  an unrolled model (`config.scan_layers=False`) holds one variable per layer,
             `blocks/{l}/attn/q/kernel` [D, H, head_dim], ...
  stacked    a scanned model holds ONE variable per block parameter with the L layers on a
             leading axis, `blocks/attn/q/kernel` [L, D, H, head_dim], ..., whose logical name
             `LAYER_AXIS` ("layers") comes first in `out_sharding`.

Parameters outside the blocks (embedding, final norm, head) are the same in both. Checkpoint
files name one tensor per layer, so a scanned model's checkpoints are read and written through
these maps and the path helpers below. The maps work on one state or a tuple of states (e.g.
`(lora_state, base_state)`), with arrays or `jax.ShapeDtypeStruct`s as values, and a randomly
initialised scanned model equals `stack_layers` of the unrolled model of the same seed:

  _, per_layer = transformer.init_model(config)          # blocks/0/..., blocks/1/..., ...
  stacked = stack_layers(per_layer)                      # blocks/... with [L, ...] values
  unstack_layers(stacked)                                # per_layer again

Paths are the tuples of `nnx.to_flat_state`: ("blocks", l, "attn", "q", "kernel") per layer,
("blocks", "attn", "q", "kernel") stacked.
"""

from typing import Dict, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# One state, or a tuple of states from a filtered split.
Params = Union[nnx.State, Tuple[nnx.State, ...]]
# Logical name of the leading layer axis of stacked (scanned) parameters and caches.
LAYER_AXIS = "layers"


def layer_of(path: Sequence) -> Optional[int]:
  """The layer index of a per-layer parameter path ("blocks", l, ...), else None."""
  if len(path) > 1 and path[0] == "blocks" and isinstance(path[1], (int, np.integer)):
    return int(path[1])
  return None


def is_stacked_path(path: Sequence) -> bool:
  """True for a parameter path of the stacked layout: ("blocks", name, ...), no layer index."""
  return len(path) > 1 and path[0] == "blocks" and layer_of(path) is None


def stacked_path(path: Sequence) -> Tuple:
  """("blocks", l, *rest) -> ("blocks", *rest); other paths unchanged."""
  path = tuple(path)
  return path[:1] + path[2:] if layer_of(path) is not None else path


def stack_layers(params: Params) -> Params:
  """Per-layer parameters (`blocks/{l}/...`, from an unrolled model) in the scanned layout:
  each `blocks/...` variable is the stack [L, ...] of its L layers, with `layers` prepended to
  its logical axis names. Other paths, and a state already stacked, pass through.

  Works on a state or a tuple of states (e.g. (lora_state, base_state)); values may be arrays
  or `jax.ShapeDtypeStruct`s.

  Raises:
    ValueError: the layer indices of a parameter are not 0 .. L-1 (the message names it).
  """
  if isinstance(params, (tuple, list)):
    return tuple(stack_layers(p) for p in params)
  out: Dict[Tuple, nnx.Variable] = {}
  layers: Dict[Tuple, Dict[int, nnx.Variable]] = {}
  for path, var in nnx.to_flat_state(params):
    layer = layer_of(path)
    if layer is None:
      out[tuple(path)] = var
    else:
      layers.setdefault(stacked_path(path), {})[layer] = var
  for path, by_layer in layers.items():
    if sorted(by_layer) != list(range(len(by_layer))):
      raise ValueError(f"{'/'.join(map(str, path))}: layers {sorted(by_layer)} are not "
                       f"0 .. {len(by_layer) - 1}.")
    out[path] = stack_variables([by_layer[i] for i in range(len(by_layer))])
  return nnx.from_flat_state(out)


def unstack_layers(params: Params) -> Params:
  """Inverse of `stack_layers`: stacked `blocks/...` variables [L, ...] split into per-layer
  `blocks/{l}/...` variables (leading `layers` axis name removed). A per-layer state passes
  through; a tuple of states is processed state by state."""
  if isinstance(params, (tuple, list)):
    return tuple(unstack_layers(p) for p in params)
  out: Dict[Tuple, nnx.Variable] = {}
  for path, var in nnx.to_flat_state(params):
    path = tuple(path)
    if not is_stacked_path(path):
      out[path] = var
      continue
    for layer in range(var.get_value().shape[0]):
      out[path[:1] + (layer,) + path[1:]] = _layer_slice(var, layer)
  return nnx.from_flat_state(out)


def stack_variables(variables: Sequence[nnx.Variable]) -> nnx.Variable:
  """L variables of equal shape -> one [L, ...] variable; `layers` prepended to its axis names."""
  first = variables[0]
  value = _stack_values([v.get_value() for v in variables])
  axes = first.get_metadata().get("out_sharding")
  if axes is None:
    return first.replace(value)
  return first.replace(value, out_sharding=(LAYER_AXIS,) + tuple(axes))


def stack_modules(modules: Sequence[nnx.Module]) -> nnx.Module:
  """L modules of equal structure -> one module of that structure whose every variable is the
  [L, ...] stack of theirs (`stack_variables`); module l is layer l."""
  graphdef = nnx.graphdef(modules[0])
  flats = [dict(nnx.to_flat_state(nnx.state(m))) for m in modules]
  stacked = {path: stack_variables([f[path] for f in flats]) for path in flats[0]}
  return nnx.merge(graphdef, nnx.from_flat_state(stacked))


def _stack_values(values: Sequence) -> object:
  """The [L, ...] stack of L values of equal shape, of the kind they are: `ShapeDtypeStruct`s,
  NumPy arrays (kept on the host) or JAX arrays."""
  if all(isinstance(v, jax.ShapeDtypeStruct) for v in values):
    return jax.ShapeDtypeStruct((len(values),) + tuple(values[0].shape), values[0].dtype)
  if all(isinstance(v, np.ndarray) for v in values):
    return np.stack(values)
  return jnp.stack(values)


def _layer_slice(variable: nnx.Variable, layer: int) -> nnx.Variable:
  """Layer `layer` of a stacked [L, ...] variable, `layers` removed from its axis names."""
  value = variable.get_value()
  if isinstance(value, jax.ShapeDtypeStruct):
    value = jax.ShapeDtypeStruct(tuple(value.shape[1:]), value.dtype)
  else:
    value = value[layer]
  axes = variable.get_metadata().get("out_sharding")
  if axes is None:
    return variable.replace(value)
  axes = tuple(axes)
  return variable.replace(value, out_sharding=axes[1:] if axes[:1] == (LAYER_AXIS,) else axes)
