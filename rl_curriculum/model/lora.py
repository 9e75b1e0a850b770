"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A targeted projection y = x . W becomes y = x . W + (alpha / r) (x . A) . B with A f32[*in, r]
drawn like PEFT's default (uniform in +-1/sqrt(fan_in)) and B f32[r, *out] = 0, so a freshly
attached model computes exactly the base function.

Adapters are `LoRAWeight` variables, their own parameter class, so one filtered split separates
them from the frozen base:

  model = transformer.Transformer(config, rngs=nnx.Rngs(0))
  lora.attach(model, lora.LoRAConfig(rank=8, alpha=16.0, targets=("q", "v")), rngs=nnx.Rngs(1))
  graphdef, lora_params, base_params = nnx.split(model, lora.LoRAWeight, ...)

  def loss_fn(lora_params):                      # differentiate w.r.t. the adapters only
    logits = transformer.forward(graphdef, (lora_params, base_params), tokens, mask)
    ...
  grads = jax.grad(loss_fn)(lora_params)         # same tree as lora_params; no base leaves
  opt_state = optimizer.init(lora_params)        # optimizer state for the adapters only

The base weights never enter `jax.grad`'s arguments, so they get no gradient and no optimizer
state; they are plain inputs of the jitted step. `trainable_mask` serves `optax.masked` when a
single full state is preferred.

The KL reference policy is the base model with adapters switched off: `disable(params)` zeroes
every B, which costs a forward pass and no second copy of the base weights (the base arrays are
shared, only the small B leaves are replaced).

`merge(params)` folds the adapters into the base kernels and zeroes B; `merge_and_reinit(params,
key)` does the same and redraws A, which keeps the function and restarts the adapters (as in
ReLoRA, Lialin et al. 2023). Both keep the tree structure, so the graphdef stays valid.

Scanned models (`config.scan_layers`): the adapters of the one stacked block carry the leading
layer axis too, A f32[L, *in, r] and B f32[L, r, *out] (logical names `layers` first), at paths
`blocks/attn/q/lora_a`, ...; layer l holds exactly the values the unrolled model's block l gets
from `attach` and `merge_and_reinit` with the same rngs / key, so
`layer_stacking.stack_layers` maps one onto the other.
"""

import collections.abc
import dataclasses
import math
from typing import Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl_curriculum.model.layer_stacking import LAYER_AXIS, is_stacked_path

# Projection of a decoder block that each target name adapts.
TARGETS = {
    "q": ("attn", "q"),
    "k": ("attn", "k"),
    "v": ("attn", "v"),
    "o": ("attn", "o"),
    "gate": ("mlp", "gate"),
    "up": ("mlp", "up"),
    "down": ("mlp", "down"),
}

_SCALE_KEY = "lora_scale"


class LoRAWeight(nnx.LoRAParam):
  """A LoRA adapter matrix (A or B); metadata `lora_scale` holds alpha / rank."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Which projections get adapters, and their rank and scale.

  Raises:
    ValueError: rank not a positive int, alpha not positive, no targets, or a target name not in
      TARGETS (the message names it).
  """
  rank: int                                   # r, inner width of A . B
  alpha: float                                # scale numerator: the update is (alpha / r) A . B
  targets: Tuple[str, ...] = tuple(TARGETS)   # names among q, k, v, o, gate, up, down
  param_dtype: str = "float32"                # adapters stay float32 under a bfloat16 base

  def __post_init__(self):
    if not isinstance(self.rank, int) or self.rank <= 0:
      raise ValueError(f"LoRAConfig.rank must be a positive int, got {self.rank!r}.")
    if not self.alpha > 0:
      raise ValueError(f"LoRAConfig.alpha must be positive, got {self.alpha!r}.")
    targets = self.targets
    if isinstance(targets, str):
      targets = [t.strip() for t in targets.split(",") if t.strip()]
    targets = tuple(targets)
    if not targets:
      raise ValueError("LoRAConfig.targets is empty; name at least one of "
                       f"{', '.join(TARGETS)}.")
    for target in targets:
      if target not in TARGETS:
        raise ValueError(f"Unknown LoRA target {target!r}; choose among {', '.join(TARGETS)}.")
    object.__setattr__(self, "targets", targets)

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _init_a(key: jax.Array, shape: Tuple[int, ...], dtype) -> jax.Array:
  """A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = prod(shape[:-1]) (PEFT's kaiming default)."""
  bound = 1.0 / math.sqrt(math.prod(shape[:-1]))
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)


def attach(model: nnx.Module, config: LoRAConfig, *, rngs: nnx.Rngs) -> nnx.Module:
  """Adds adapters in place to the targeted projections of every block of `model`; returns it.

  The model must have `blocks`: a sequence of blocks, or one block with stacked [L, ...]
  parameters (a scanned `transformer.Transformer`), each with the projections named in TARGETS.
  A is drawn layer by layer, target by target, in the same order for both layouts.

  Raises:
    ValueError: the model has no `blocks`, a block lacks a targeted projection (named in the
      message), or a projection already carries an adapter.
  """
  blocks = getattr(model, "blocks", None)
  if blocks is None:
    raise ValueError(f"{type(model).__name__} has no `blocks`; LoRA attaches to decoder blocks.")
  stacked = not isinstance(blocks, collections.abc.Sequence)
  layers = [blocks] if stacked else list(blocks)
  projections = [[_target_projection(block, target, index) for target in config.targets]
                 for index, block in enumerate(layers)]
  num_layers = projections[0][0].kernel.get_value().shape[0] if stacked else len(layers)
  # Draws in unrolled order (layer-major), stacked afterwards for a scanned model.
  a_values = [[_init_a(rngs.params(), _a_shape(proj, config.rank), config.param_dtype)
               for proj in projections[0 if stacked else layer]]
              for layer in range(num_layers)]
  for index, row in enumerate(projections):
    for i, proj in enumerate(row):
      a = (jnp.stack([a_values[layer][i] for layer in range(num_layers)]) if stacked
           else a_values[index][i])
      b = jnp.zeros(((num_layers,) if stacked else ()) + (config.rank,) + tuple(proj.out_shape),
                    config.param_dtype)
      lead = (LAYER_AXIS,) if stacked else ()
      proj.lora_a = LoRAWeight(a, out_sharding=lead + tuple(proj.in_axes) + (None,),
                               eager_sharding=False, **{_SCALE_KEY: config.scale})
      proj.lora_b = LoRAWeight(b, out_sharding=lead + (None,) + tuple(proj.out_axes),
                               eager_sharding=False, **{_SCALE_KEY: config.scale})
  return model


def _target_projection(block: nnx.Module, target: str, index: int) -> nnx.Module:
  proj = block
  for name in TARGETS[target]:
    proj = getattr(proj, name, None)
    if proj is None:
      raise ValueError(
          f"LoRA target {target!r}: block {index} has no projection "
          f"`{'.'.join(TARGETS[target])}`.")
  if getattr(proj, "lora_a", None) is not None:
    raise ValueError(f"LoRA target {target!r} of block {index} already has an adapter.")
  return proj


def _a_shape(proj: nnx.Module, rank: int) -> Tuple[int, ...]:
  return tuple(proj.in_shape) + (rank,)


def split(model: nnx.Module) -> Tuple[nnx.GraphDef, nnx.State, nnx.State]:
  """(graphdef, adapter state, base state) = nnx.split(model, LoRAWeight, ...)."""
  return nnx.split(model, LoRAWeight, ...)


def is_lora(variable) -> bool:
  return isinstance(variable, LoRAWeight)


def trainable_mask(params: nnx.State) -> nnx.State:
  """Tree of bools, True on adapter leaves: the mask for `optax.masked` on a full state."""
  return jax.tree.map(is_lora, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _paths(params: nnx.State) -> dict:
  return dict(nnx.to_flat_state(params))


def _adapter_parents(flat: dict) -> list:
  """Paths of the projections that carry adapters, in a fixed (sorted-path) order."""
  parents = [path[:-1] for path, var in flat.items()
             if path[-1] == "lora_b" and isinstance(var, LoRAWeight)]
  return sorted(parents, key=_path_key)


def _path_key(path) -> tuple:
  return tuple(str(part) for part in path)


def _is_stacked(path, var) -> bool:
  """An adapter or kernel of a scanned model: [L, ...] with `layers` as its first axis name."""
  axes = var.get_metadata().get("out_sharding") or ()
  return is_stacked_path(path) and tuple(axes)[:1] == (LAYER_AXIS,)


def _adapter_order(flat: dict) -> dict:
  """(projection path, layer or None) -> index in the sorted order of the unrolled layout's
  projection paths, where a stacked projection `blocks/...` stands for its L per-layer paths
  `blocks/{l}/...`; so both layouts draw layer l's A with the same key."""
  keys = []
  for parent in _adapter_parents(flat):
    a = flat[parent + ("lora_a",)]
    if _is_stacked(parent + ("lora_a",), a):
      keys += [(parent[:1] + (layer,) + parent[1:], parent, layer)
               for layer in range(a.get_value().shape[0])]
    else:
      keys.append((parent, parent, None))
  keys.sort(key=lambda k: _path_key(k[0]))
  return {(parent, layer): i for i, (_, parent, layer) in enumerate(keys)}


def disable(params: nnx.State) -> nnx.State:
  """Adapters off: every B set to zero, so the model computes the base function.

  Works on a full state, on the adapter subtree alone, or on a tuple of states (each is
  processed); jit-compatible. Use it for the KL reference policy:
  forward(graphdef, disable(params), ...) equals the base model's logits.
  """
  if isinstance(params, (tuple, list)):
    return tuple(disable(p) for p in params)
  flat = _paths(params)
  for path, var in flat.items():
    if path[-1] == "lora_b" and isinstance(var, LoRAWeight):
      flat[path] = var.replace(jnp.zeros_like(var[...]))
  return nnx.from_flat_state(flat)


def _low_rank_product(a: jax.Array, b: jax.Array) -> jax.Array:
  """A[*in, r] . B[r, *out] -> [*in, *out]."""
  return jnp.tensordot(a, b, axes=1)


def merge(params: nnx.State) -> nnx.State:
  """Folds every adapter into its kernel: W <- W + (alpha / r) A . B, then B <- 0.

  The result computes the same function with the adapters contributing nothing, keeps the tree
  structure (the graphdef stays valid), and stores W in its own dtype.

  Args:
    params: the full state (base and adapters); for split states use
      `nnx.merge_state(lora_params, base_params)` first.

  Raises:
    ValueError: an adapter's kernel is not in `params` (an adapter-only subtree was passed).
  """
  flat = _paths(params)
  for parent in _adapter_parents(flat):
    kernel_path = parent + ("kernel",)
    if kernel_path not in flat:
      raise ValueError(f"merge needs the base kernel {'/'.join(map(str, kernel_path))}; pass "
                       "the full state (nnx.merge_state(lora_params, base_params)).")
    a, b, kernel = flat[parent + ("lora_a",)], flat[parent + ("lora_b",)], flat[kernel_path]
    product = jax.vmap(_low_rank_product) if _is_stacked(parent + ("lora_a",), a) else (
        _low_rank_product)  # one A . B per layer when stacked
    delta = product(a[...].astype(jnp.float32), b[...].astype(jnp.float32))
    w = kernel[...].astype(jnp.float32) + b.get_metadata(_SCALE_KEY) * delta
    flat[kernel_path] = kernel.replace(w.astype(kernel[...].dtype))
    flat[parent + ("lora_b",)] = b.replace(jnp.zeros_like(b[...]))
  return nnx.from_flat_state(flat)


def merge_and_reinit(params: nnx.State, key: jax.Array) -> nnx.State:
  """`merge`, then A redrawn from its initial distribution (B stays 0): same function, fresh
  adapters. Adapter i (in sorted-path order of the unrolled layout) uses
  `jax.random.fold_in(key, i)`; layer l of a stacked adapter uses the i of `blocks/{l}/...`."""
  flat = _paths(merge(params))
  order = _adapter_order(flat)
  for parent in _adapter_parents(flat):
    a = flat[parent + ("lora_a",)]
    shape, dtype = a[...].shape, a[...].dtype
    if _is_stacked(parent + ("lora_a",), a):
      value = jnp.stack([
          _init_a(jax.random.fold_in(key, order[(parent, layer)]), shape[1:], dtype)
          for layer in range(shape[0])])
    else:
      value = _init_a(jax.random.fold_in(key, order[(parent, None)]), shape, dtype)
    flat[parent + ("lora_a",)] = a.replace(value)
  return nnx.from_flat_state(flat)
