"""HF checkpoint folders: config.json, and the tensor-name table and layouts of their weights.

Everything here is host-side NumPy work; `pretrained.py` builds models from it, and `gguf_io.py`
renames GGUF tensors to the HF names used here. The safetensors files themselves are listed,
read and written by `safetensors_io.py`.

Layouts. HF stores a linear map as weight[out, in] (torch `nn.Linear`) with heads flattened into
the out (q, k, v) or in (o) axis; the transformer here stores kernel[*in, *out] with heads as
their own axes (`transformer.Projection`). The mapping of one tensor is therefore

  kernel = weight.T.reshape(in_shape + out_shape)        (q, k, v, o, gate, up, down)
  bias   = bias.reshape(out_shape)                       (Qwen2 q, k, v)
  head   = lm_head.weight.T                              (untied output head)

and the embedding, the norm scales and Qwen3's q/k norms are copied as they are.

Names. HF names (`model.layers.{i}.self_attn.q_proj.weight`, ...) are the same for the Llama,
Qwen2 and Qwen3 families, so there is one table from HF names to parameter paths (`_HF_LAYER`).

Layer layouts. Files always hold per-layer tensors. Paths here are per-layer,
("blocks", i, ...); a scanned model's stacked parameters ("blocks", ...) [L, ...] are split into
them by `per_layer_arrays` (which `hf_tensors` applies), and stacked on load by `placement.py`.
"""

import math
import re
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from rl_curriculum.model.checkpoint_errors import UnsupportedCheckpointError
from rl_curriculum.model.checkpoint_errors import unsupported_architecture
from rl_curriculum.model.config import ModelConfig

# HF `architectures[0]` -> family. The families differ only in config fields (Qwen2: q/k/v bias;
# Qwen3: q/k RMSNorm), not in tensor names.
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# Family -> (HF architecture, HF model_type) written by `hf_config`.
_FAMILY_TO_HF = {"llama": ("LlamaForCausalLM", "llama"),
                 "qwen2": ("Qwen2ForCausalLM", "qwen2"),
                 "qwen3": ("Qwen3ForCausalLM", "qwen3")}

# A parameter path in the model state, e.g. ("blocks", 0, "attn", "q", "kernel").
Path = Tuple[Any, ...]


# ---------------------------------------------------------------------------------------------
# Configs.


def config_from_hf(hf: Mapping[str, Any], *, dtype: str = "float32") -> Tuple[ModelConfig, str]:
  """(ModelConfig, family) from an HF config.json dict.

  Reads rotary settings from `rope_parameters` (transformers >= 5) or `rope_theta` /
  `rope_scaling` (older files); rope types "default" and "llama3" are supported.

  Raises:
    UnsupportedCheckpointError: an architecture outside HF_ARCHITECTURES (the message lists the
      supported ones) or an option the transformer lacks (attention/MLP bias in Llama, sliding
      windows, another rope type, an activation other than SiLU); the message names the field.
  """
  archs = hf.get("architectures") or []
  family = None
  for arch in archs:
    family = HF_ARCHITECTURES.get(arch, family)
  if family is None:
    by_type = {t: f for f, (_, t) in _FAMILY_TO_HF.items()}
    family = by_type.get(hf.get("model_type"))
  if family is None:
    raise unsupported_architecture(archs[0] if archs else hf.get("model_type"), HF_ARCHITECTURES)

  def unsupported(field, value):
    return UnsupportedCheckpointError(
        f"{family} checkpoint: config.json {field}={value!r} is not supported by the transformer "
        "here.")

  act = hf.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise unsupported("hidden_act", act)
  if hf.get("mlp_bias"):
    raise unsupported("mlp_bias", True)
  if family in ("llama", "qwen3") and hf.get("attention_bias"):
    raise unsupported("attention_bias", True)  # also biases the output projection
  if hf.get("use_sliding_window"):
    raise unsupported("use_sliding_window", True)
  layer_types = hf.get("layer_types")
  if layer_types and any(t != "full_attention" for t in layer_types):
    raise unsupported("layer_types", sorted(set(layer_types)))

  rope = dict(hf.get("rope_parameters") or {})
  if not rope:
    rope = dict(hf.get("rope_scaling") or {})
    rope.setdefault("rope_theta", hf.get("rope_theta", 10_000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
  scaling = {}
  if rope_type == "llama3":
    scaling = dict(rope_scaling_factor=float(rope["factor"]),
                   rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
                   rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
                   rope_original_max_len=int(rope.get("original_max_position_embeddings", 8192)))
  elif rope_type != "default":
    raise unsupported("rope type", rope_type)

  heads = int(hf["num_attention_heads"])
  config = ModelConfig(
      vocab_size=int(hf["vocab_size"]),
      d_model=int(hf["hidden_size"]),
      num_layers=int(hf["num_hidden_layers"]),
      num_heads=heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      mlp_dim=int(hf["intermediate_size"]),
      head_dim=hf.get("head_dim") or int(hf["hidden_size"]) // heads,
      rope_theta=float(rope.get("rope_theta", 10_000.0)),
      rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=family == "qwen2",
      qk_norm=family == "qwen3",
      dtype=dtype,
      param_dtype=dtype,
      **scaling)
  return config, family


def hf_config(config: ModelConfig, family: str, *, bos_id: Optional[int] = None,
              eos_id: Optional[int] = None, pad_id: Optional[int] = None,
              max_position_embeddings: int = 8192) -> Dict[str, Any]:
  """The config.json dict transformers reads for `config` as an HF `family` model.

  Rotary settings are written both as `rope_parameters` (transformers >= 5) and as `rope_theta`
  / `rope_scaling` (older readers).

  Raises:
    UnsupportedCheckpointError: family not in HF terms, or the config's block does not fit the
      family (Qwen2 needs q/k/v bias, Qwen3 needs q/k norm, Llama neither).
  """
  if family not in _FAMILY_TO_HF:
    raise unsupported_architecture(family, _FAMILY_TO_HF)
  wants = dict(llama=(False, False), qwen2=(True, False), qwen3=(False, True))[family]
  if (config.qkv_bias, config.qk_norm) != wants:
    raise UnsupportedCheckpointError(
        f"a {family} checkpoint has qkv_bias={wants[0]}, qk_norm={wants[1]}; the config has "
        f"{config.qkv_bias}, {config.qk_norm}.")
  arch, model_type = _FAMILY_TO_HF[family]
  rope = {"rope_type": "default", "rope_theta": float(config.rope_theta)}
  rope_scaling = None
  if config.rope_scaling_factor is not None:
    rope_scaling = {"rope_type": "llama3", "factor": float(config.rope_scaling_factor),
                    "low_freq_factor": float(config.rope_low_freq_factor),
                    "high_freq_factor": float(config.rope_high_freq_factor),
                    "original_max_position_embeddings": int(config.rope_original_max_len)}
    rope.update(rope_scaling)
  out = {
      "architectures": [arch],
      "model_type": model_type,
      "vocab_size": config.vocab_size,
      "hidden_size": config.d_model,
      "intermediate_size": config.mlp_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": max_position_embeddings,
      "rms_norm_eps": config.rms_eps,
      "rope_theta": float(config.rope_theta),
      "rope_scaling": rope_scaling,
      "rope_parameters": rope,
      "tie_word_embeddings": config.tie_embeddings,
      "attention_bias": False,
      "attention_dropout": 0.0,
      "mlp_bias": False,
      "use_cache": True,
      "torch_dtype": config.param_dtype,
      "dtype": config.param_dtype,
      "bos_token_id": bos_id,
      "eos_token_id": eos_id,
      "pad_token_id": pad_id,
  }
  if family == "qwen2":
    out.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers)
  if family == "qwen3":
    out.update(use_sliding_window=False, sliding_window=None,
               layer_types=["full_attention"] * config.num_layers)
  return out

def family_of(config: ModelConfig) -> str:
  """The family whose HF block `config` has: "qwen2" (q/k/v bias), "qwen3" (q/k norm), else
  "llama"; the family `hf_config` accepts for it.

  Raises:
    UnsupportedCheckpointError: both q/k/v bias and q/k norm (no family here has both).
  """
  if config.qkv_bias and config.qk_norm:
    raise UnsupportedCheckpointError("a config with both qkv_bias and qk_norm fits no HF "
                                     "family here (Qwen2 has the bias, Qwen3 the norm).")
  return "qwen2" if config.qkv_bias else "qwen3" if config.qk_norm else "llama"


# ---------------------------------------------------------------------------------------------
# Tensor names and layouts.

# Per-layer HF name suffix -> (path in the block, number of leading input axes of the kernel).
_HF_LAYER = {
    "input_layernorm.weight": (("attn_norm", "scale"), None),
    "post_attention_layernorm.weight": (("mlp_norm", "scale"), None),
    "self_attn.q_proj.weight": (("attn", "q", "kernel"), 1),
    "self_attn.k_proj.weight": (("attn", "k", "kernel"), 1),
    "self_attn.v_proj.weight": (("attn", "v", "kernel"), 1),
    "self_attn.o_proj.weight": (("attn", "o", "kernel"), 2),
    "self_attn.q_proj.bias": (("attn", "q", "bias"), None),
    "self_attn.k_proj.bias": (("attn", "k", "bias"), None),
    "self_attn.v_proj.bias": (("attn", "v", "bias"), None),
    "self_attn.q_norm.weight": (("attn", "q_norm", "scale"), None),
    "self_attn.k_norm.weight": (("attn", "k_norm", "scale"), None),
    "mlp.gate_proj.weight": (("mlp", "gate", "kernel"), 1),
    "mlp.up_proj.weight": (("mlp", "up", "kernel"), 1),
    "mlp.down_proj.weight": (("mlp", "down", "kernel"), 1),
}
_HF_TOP = {
    "model.embed_tokens.weight": ("embed",),
    "model.norm.weight": ("final_norm", "scale"),
    "lm_head.weight": ("head",),
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF names that carry no parameter (buffers some exporters save).
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


def param_path(hf_name: str) -> Optional[Tuple[Path, Optional[int]]]:
  """(parameter path, leading input axes of the kernel or None) of an HF tensor name; None for
  buffers that carry no parameter.

  Raises:
    UnsupportedCheckpointError: a name no family here has (the message names it).
  """
  if _IGNORED.search(hf_name):
    return None
  if hf_name in _HF_TOP:
    return _HF_TOP[hf_name], None
  match = _LAYER_RE.match(hf_name)
  if match and match.group(2) in _HF_LAYER:
    sub, n_in = _HF_LAYER[match.group(2)]
    return ("blocks", int(match.group(1))) + sub, n_in
  raise UnsupportedCheckpointError(f"unexpected tensor {hf_name!r}: no parameter of the "
                                   "Llama/Qwen2/Qwen3 block has this name.")


def hf_name(path: Path) -> Tuple[str, Optional[int]]:
  """Inverse of `param_path`: (HF tensor name, leading input axes or None) of a parameter path.

  Raises:
    KeyError: a path that is not a base parameter (e.g. a LoRA adapter).
  """
  for name, top in _HF_TOP.items():
    if tuple(path) == top:
      return name, None
  if len(path) > 2 and path[0] == "blocks":
    for suffix, (sub, n_in) in _HF_LAYER.items():
      if tuple(path[2:]) == sub:
        return f"model.layers.{int(path[1])}.{suffix}", n_in
  raise KeyError(f"no HF name for parameter {'/'.join(map(str, path))}")


def to_param_layout(hf_array: np.ndarray, path: Path, n_in: Optional[int],
                    shape: Tuple[int, ...]) -> np.ndarray:
  """An HF tensor in the parameter's layout (see the module docstring); `shape` is the
  parameter's shape.

  Raises:
    ValueError: the sizes disagree (the message gives both shapes and the path).
  """
  if math.prod(hf_array.shape) != math.prod(shape):
    raise ValueError(f"{'/'.join(map(str, path))}: checkpoint tensor of shape {hf_array.shape} "
                     f"does not fit the parameter shape {shape}; config.json and the weights "
                     "disagree.")
  if path == ("head",):
    return np.ascontiguousarray(hf_array.T).reshape(shape)
  if n_in is not None:
    return np.ascontiguousarray(hf_array.T).reshape(shape)
  return hf_array.reshape(shape)


def from_param_layout(array: np.ndarray, path: Path, n_in: Optional[int]) -> np.ndarray:
  """Inverse of `to_param_layout`: the HF tensor of a parameter array."""
  if path == ("head",):
    return np.ascontiguousarray(array.T)
  if n_in is not None:
    fan_in = math.prod(array.shape[:n_in])
    return np.ascontiguousarray(array.reshape(fan_in, -1).T)
  if path[-1] == "bias":
    return array.reshape(-1)
  return array



# ---------------------------------------------------------------------------------------------
# Assembling a state, and the tensors of one.


def fill_state(flat_abstract: Mapping[Path, Any], tensors: Iterable[Tuple[str, np.ndarray]],
               place: Callable[[Path, np.ndarray], Any]) -> Dict[Path, Any]:
  """Maps checkpoint tensors onto parameter paths, one tensor at a time.

  Args:
    flat_abstract: parameter path -> anything with `.shape` (the abstract state's values).
    tensors: (HF name, array in HF layout) pairs, e.g. `safetensors_io.iter_safetensors(folder)`.
    place: (path, host array in parameter layout, float32 or the storage dtype) -> device array;
      called once per tensor as it is read, so no full copy of the model is held on the host.

  Returns:
    path -> placed array for every path of `flat_abstract`.

  Raises:
    ValueError: a parameter the checkpoint lacks, a tensor twice, or a shape mismatch (the
      message names the tensors).
    UnsupportedCheckpointError: a tensor with no parameter in this config (e.g. a q/k norm in a
      config without them). A stored lm_head is skipped when the embeddings are tied.
  """
  out = {}
  for name, array in tensors:
    found = param_path(name)
    if found is None:
      continue
    path, n_in = found
    if path not in flat_abstract:
      if path == ("head",):
        continue  # tied embeddings: transformers ignores a stored lm_head too
      raise UnsupportedCheckpointError(
          f"tensor {name} maps to {'/'.join(map(str, path))}, which this config does not have.")
    if path in out:
      raise ValueError(f"tensor {name} appears twice in the checkpoint.")
    shape = tuple(flat_abstract[path].shape)
    out[path] = place(path, to_param_layout(array, path, n_in, shape))
  missing = [hf_name(p)[0] for p in flat_abstract if p not in out]
  if missing:
    raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:4]}; is it a "
                     "complete checkpoint of the architecture config.json names?")
  return out


def is_stacked(path: Path) -> bool:
  """True for a parameter path of the scanned layout, ("blocks", name, ...) with no layer index."""
  return len(path) > 1 and path[0] == "blocks" and not isinstance(path[1], (int, np.integer))


def per_layer_arrays(flat_params: Mapping[Path, np.ndarray]) -> Dict[Path, np.ndarray]:
  """Stacked ("blocks", *rest) arrays [L, ...] split into per-layer ("blocks", l, *rest) arrays
  (views, no copy); per-layer and top-level paths pass through."""
  out = {}
  for path, array in flat_params.items():
    path = tuple(path)
    if is_stacked(path):
      array = np.asarray(array)
      for layer in range(array.shape[0]):
        out[path[:1] + (layer,) + path[1:]] = array[layer]
    else:
      out[path] = array
  return out


def hf_tensors(flat_params: Mapping[Path, np.ndarray]) -> Dict[str, np.ndarray]:
  """HF name -> tensor in HF layout for every base parameter (the inverse of `fill_state`);
  stacked parameters of a scanned model give their L per-layer tensors.

  Raises:
    KeyError: a path that is not a base parameter (merge or drop adapters first).
  """
  out = {}
  for path, array in per_layer_arrays(flat_params).items():
    name, n_in = hf_name(path)
    out[name] = from_param_layout(np.asarray(array), path, n_in)
  return out
