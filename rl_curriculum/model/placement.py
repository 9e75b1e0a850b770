"""Placement of checkpoint tensors on devices as they are read.

Every tensor is converted on the host and put on its device(s) as soon as it is read
(`jax.device_put` with the parameter's sharding), so the host holds one tensor at a time and no
device receives more than its shard.

Where a parameter goes is given by a `Shardings` value (the `shardings` argument of
`pretrained.load_pretrained`): None (the default device), one `jax.sharding.Sharding` for every
array, a callable (path, logical axes) -> Sharding, or a pytree of Shardings shaped like the base
parameters (paths outside it, such as adapters, are replicated on its mesh).

Checkpoint files hold per-layer tensors. For a scanned model, each layer's tensor is placed with
the sharding of its stacked parameter minus the leading layer axis (`read_placer`), and the L
layers of a parameter are stacked on device once all are read (`stack_layers_placed`), one
parameter at a time, so a device holds at most its shard of the model plus one stacked parameter.
Paths are the tuples of `nnx.to_flat_state`.
"""

import functools
from typing import Any, Callable, Mapping, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_curriculum.model import layer_stacking

# None (default device), one Sharding for every array, a callable
# (path, logical axes) -> Sharding, or a pytree of Shardings shaped like the base parameters.
Shardings = Union[None, jax.sharding.Sharding, Callable[..., jax.sharding.Sharding], Any]


def sharding_by_path(shardings: Shardings, flat_vars: Mapping) -> Callable:
  """(path, ndim) -> the Sharding `shardings` gives that parameter, or None for the default
  device; `flat_vars` ({path: variable}) supplies the logical axes a callable is given."""
  if shardings is None:
    return lambda path, ndim: None
  if isinstance(shardings, jax.sharding.Sharding):
    return lambda path, ndim: shardings
  if callable(shardings):
    def by_axes(path, ndim):
      axes = flat_vars[path].get_metadata().get("out_sharding") if path in flat_vars else None
      return shardings(path, tuple(axes) if axes else (None,) * ndim)
    return by_axes
  tree = shardings if isinstance(shardings, nnx.State) else nnx.State(shardings)
  table = {path: (v.get_value() if isinstance(v, nnx.Variable) else v)
           for path, v in nnx.to_flat_state(tree)}
  # Paths outside the tree (adapters) are replicated over the mesh of the base parameters.
  replicated = jax.sharding.NamedSharding(next(iter(table.values())).mesh,
                                          jax.sharding.PartitionSpec())
  return lambda path, ndim: table.get(path, replicated)


def _put(x, sharding):
  """x on the default device (sharding None) or placed with `sharding`."""
  return jax.device_put(x) if sharding is None else jax.device_put(x, sharding)


def placer(shardings: Shardings, flat_vars: Mapping) -> Callable:
  """(path, host array) -> device array, per `shardings` (see `sharding_by_path`)."""
  sharding_of = sharding_by_path(shardings, flat_vars)
  return lambda path, x: _put(x, sharding_of(path, np.ndim(x)))


def read_placer(sharding_of: Callable, storage: np.dtype, scan_layers: bool) -> Callable:
  """(path, host tensor) -> device array for a per-layer tensor as read from a checkpoint.

  The tensor is cast on the host to `storage`, then placed with `sharding_of(path, ndim)`; in a
  scanned model (`scan_layers`) a layer ("blocks", l, ...) is placed with the sharding of its
  stacked parameter ("blocks", ...) minus the layer axis.
  """
  def place(p, host):
    host = np.asarray(host).astype(storage, copy=False)
    if layer_stacking.layer_of(p) is None or not scan_layers:
      return _put(host, sharding_of(p, host.ndim))
    stacked = sharding_of(layer_stacking.stacked_path(p), host.ndim + 1)
    return _put(host, _layer_sharding(stacked))
  return place


def _layer_sharding(sharding):
  """The sharding of one layer [...] of a stacked [L, ...] array with `sharding`."""
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh,
                                      jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:]))
  return sharding


@functools.lru_cache(maxsize=None)
def _stacker(sharding) -> Callable:
  return jax.jit(jnp.stack, out_shardings=sharding)


def stack_layers_placed(arrays: dict, sharding_of: Callable) -> dict:
  """Per-layer device arrays {("blocks", l, *rest): x} -> stacked {("blocks", *rest): [L, ...]}
  placed with `sharding_of`; empties `arrays`, so each parameter's per-layer arrays are freed
  once it is stacked."""
  out, by_path = {}, {}
  while arrays:
    path, x = arrays.popitem()
    layer = layer_stacking.layer_of(path)
    if layer is None:
      out[path] = x
    else:
      by_path.setdefault(layer_stacking.stacked_path(path), {})[layer] = x
  while by_path:
    path, layers = by_path.popitem()
    xs = [layers.pop(layer) for layer in range(len(layers))]
    sharding = sharding_of(path, xs[0].ndim + 1)
    out[path] = jnp.stack(xs) if sharding is None else _stacker(sharding)(xs)
    del xs
  return out
