"""LoRA adapter folders in the PEFT layout: adapter_config.json and adapter_model.safetensors.

PEFT stores, per layer and adapted projection, lora_A.weight f32[r, in] and lora_B.weight
f32[out, r] under `base_model.model.model.layers.{l}.{module}` (module `self_attn.q_proj`, ...,
`mlp.down_proj`); the adapters here are A f32[*in, r] and B f32[r, *out] (`lora.LoRAWeight`,
with a leading layer axis [L, ...] in a scanned model). So

  lora_A.weight = A.reshape(-1, r).T        lora_B.weight = B.reshape(r, -1).T

and the reverse on load. Only plain LoRA is read (no rsLoRA, no DoRA); the files written load in
PEFT's `PeftModel.from_pretrained` on the base model named in adapter_config.json.

Paths are the tuples of `nnx.to_flat_state`: ("blocks", l, "attn"|"mlp", proj, "lora_a"|"lora_b")
per layer, ("blocks", "attn"|"mlp", proj, ...) stacked.
"""

import json
import os
from typing import Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_curriculum.model import hf_io
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import safetensors_io

# The PEFT module of each LoRA target.
_PEFT_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                "down": "mlp.down_proj"}
_PEFT_PREFIX = "base_model.model.model.layers"


def read_adapter_folder(folder: str) -> Tuple[lora_lib.LoRAConfig, Mapping[str, np.ndarray]]:
  """(the adapters' LoRAConfig, {PEFT tensor name: array}) of a PEFT adapter folder.

  Raises:
    FileNotFoundError: adapter_config.json or adapter_model.safetensors is missing.
    ValueError: rsLoRA / DoRA adapters, or a target module other than q_proj, k_proj, v_proj,
      o_proj, gate_proj, up_proj and down_proj.
  """
  config_path = os.path.join(folder, "adapter_config.json")
  weights_path = os.path.join(folder, "adapter_model.safetensors")
  for p in (config_path, weights_path):
    if not os.path.isfile(p):
      raise FileNotFoundError(f"{folder} is not an adapter folder: {os.path.basename(p)} is "
                              "missing (save_pretrained(..., merge_lora=False) writes both).")
  with open(config_path) as f:
    cfg = json.load(f)
  if cfg.get("use_rslora") or cfg.get("use_dora"):
    raise ValueError(f"{folder}: rsLoRA / DoRA adapters are not supported.")
  modules = cfg.get("target_modules")
  known = {v.split(".")[-1]: k for k, v in _PEFT_MODULES.items()}
  if not isinstance(modules, list) or any(m not in known for m in modules):
    raise ValueError(f"{folder}: target_modules {modules!r} must be a list of names among "
                     f"{sorted(known)}.")
  targets = tuple(t for t in lora_lib.TARGETS if _PEFT_MODULES[t].split(".")[-1] in modules)
  config = lora_lib.LoRAConfig(rank=int(cfg["r"]), alpha=float(cfg["lora_alpha"]),
                               targets=targets)
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  return config, load_file(weights_path)


def _adapter_name(layer: int, path: tuple) -> str:
  """PEFT tensor name of an adapter path ("blocks", [l,] "attn"|"mlp", proj, "lora_a"|"lora_b")
  at layer `layer`."""
  module_of = {v: k for k, v in lora_lib.TARGETS.items()}
  sub = path[1:3] if hf_io.is_stacked(path) else path[2:4]
  which = "lora_A" if path[-1] == "lora_a" else "lora_B"
  return f"{_PEFT_PREFIX}.{layer}.{_PEFT_MODULES[module_of[tuple(sub)]]}.{which}.weight"


def load_adapters(flat: dict, tensors: Mapping[str, np.ndarray]) -> dict:
  """The adapter variables {path: LoRAWeight} of `flat` with their values read from `tensors`
  (PEFT names), in each variable's dtype.

  Raises:
    ValueError: a tensor an adapter needs is missing, or `tensors` has one no adapter uses.
  """
  out = dict(flat)
  used = set()
  for path, var in flat.items():
    shape = var.get_value().shape
    stacked = hf_io.is_stacked(path)  # [L, ...] in a scanned model
    layers = range(shape[0]) if stacked else [int(path[1])]
    values = []
    for layer in layers:
      name = _adapter_name(layer, path)
      if name not in tensors:
        raise ValueError(f"adapter tensor {name} is missing.")
      values.append(np.ascontiguousarray(np.asarray(tensors[name], np.float32).T)
                    .reshape(shape[1:] if stacked else shape))
      used.add(name)
    value = np.stack(values) if stacked else values[0]
    out[path] = var.replace(jnp.asarray(value, var.get_value().dtype))
  extra = sorted(set(tensors) - used)
  if extra:
    raise ValueError(f"adapter folder has tensors no adapter uses, e.g. {extra[:3]}.")
  return out


def save_adapters(params: nnx.State, lora_config: lora_lib.LoRAConfig,
                  base_model: Optional[str], folder: str) -> None:
  """Writes the adapters of `params` (a full state; other variables are skipped) as a PEFT
  adapter folder whose adapter_config.json names `base_model` as its base."""
  tensors = {}
  for path, var in nnx.to_flat_state(params):
    if not lora_lib.is_lora(var):
      continue
    value = np.asarray(jax.device_get(var.get_value()), np.float32)
    stacked = hf_io.is_stacked(path)  # [L, ...] in a scanned model
    for layer in range(value.shape[0]) if stacked else [int(path[1])]:
      layer_value = value[layer] if stacked else value
      if path[-1] == "lora_a":   # [*in, r] -> [r, in]
        matrix = layer_value.reshape(-1, layer_value.shape[-1]).T
      else:                      # [r, *out] -> [out, r]
        matrix = layer_value.reshape(layer_value.shape[0], -1).T
      tensors[_adapter_name(layer, path)] = matrix
  safetensors_io.write_safetensors(tensors, folder, prefix="adapter_model")
  with open(os.path.join(folder, "adapter_config.json"), "w") as f:
    json.dump({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora_config.rank,
        "lora_alpha": lora_config.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(_PEFT_MODULES[t].split(".")[-1] for t in lora_config.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }, f, indent=2)
