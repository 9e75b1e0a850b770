"""GGUF files (llama.cpp): metadata to a ModelConfig, tensors to HF names and layouts.

GGUF tensor names (`blk.{i}.attn_q.weight`, ...) are renamed to HF names (`GGUF_TO_HF`), so a
GGUF file's tensors go through the same table and layouts as an HF folder's (`hf_io.py`).

llama.cpp's converter permutes the rows of the Llama q and k projections (per head, from the
rotate-half layout HF uses to interleaved pairs); `unpermute_qk` undoes it. Without it the logits
are wrong; with it float32 logits match transformers. Qwen2 and Qwen3 files are written without
the permutation. Quantised tensors are dequantised to float32 by the `gguf` package
(`gguf.quants.dequantize`).
"""

import dataclasses
import os
import re
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Tuple

import numpy as np

from rl_curriculum.model.checkpoint_errors import UnsupportedCheckpointError
from rl_curriculum.model.checkpoint_errors import unsupported_architecture
from rl_curriculum.model.config import ModelConfig

# GGUF `general.architecture` values read here (they are the family names).
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")


# ---------------------------------------------------------------------------------------------
# Config.


def config_from_gguf(metadata: Mapping[str, Any], tensor_names: Iterable[str], *,
                     dtype: str = "float32") -> Tuple[ModelConfig, str]:
  """(ModelConfig, family) from GGUF metadata (`{arch}.block_count`, ...).

  The output head is tied when the file has no `output.weight`.

  Raises:
    UnsupportedCheckpointError: `general.architecture` not in GGUF_ARCHITECTURES (listed in the
      message), or Llama 3 rope scaling stored as a `rope_freqs` tensor (use the HF folder).
  """
  arch = metadata.get("general.architecture")
  if arch not in GGUF_ARCHITECTURES:
    raise unsupported_architecture(arch, GGUF_ARCHITECTURES)
  names = set(tensor_names)
  if "rope_freqs.weight" in names:
    raise UnsupportedCheckpointError(
        "this GGUF stores rotary scaling as a rope_freqs tensor (Llama 3.1+), which is not read "
        "here; load the model's HF folder instead.")
  scaling_type = metadata.get(f"{arch}.rope.scaling.type", "none")
  if scaling_type not in ("none", None):
    raise UnsupportedCheckpointError(f"GGUF rope scaling {scaling_type!r} is not supported.")

  def get(key, default=None):
    value = metadata.get(f"{arch}.{key}", default)
    if value is None:
      raise UnsupportedCheckpointError(f"GGUF metadata lacks {arch}.{key}.")
    return value

  heads = int(get("attention.head_count"))
  d_model = int(get("embedding_length"))
  vocab = metadata.get(f"{arch}.vocab_size")
  if vocab is None:
    vocab = len(metadata["tokenizer.ggml.tokens"])
  head_dim = metadata.get(f"{arch}.attention.key_length") or d_model // heads
  config = ModelConfig(
      vocab_size=int(vocab),
      d_model=d_model,
      num_layers=int(get("block_count")),
      num_heads=heads,
      num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv") or heads),
      mlp_dim=int(get("feed_forward_length")),
      head_dim=int(head_dim),
      rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10_000.0)),
      # stored as float32: 1e-5 reads back as 9.99999974738e-06; round to the written value.
      rms_eps=float(np.format_float_positional(np.float32(get("attention.layer_norm_rms_epsilon")),
                                               unique=True)),
      tie_embeddings="output.weight" not in names,
      qkv_bias=arch == "qwen2",
      qk_norm=arch == "qwen3",
      dtype=dtype,
      param_dtype=dtype)
  return config, arch



# ---------------------------------------------------------------------------------------------
# Tensor names and layouts.

# GGUF per-layer suffix -> HF per-layer suffix, and top-level names.
GGUF_TO_HF = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
_GGUF_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def permute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
  """llama.cpp's Q/K row permutation (convert_hf_to_gguf.py, LlamaModel.permute): within each
  head, rows [first half; second half] (rotate-half) become interleaved pairs.

  w: [num_heads * head_dim, ...] -> same shape. Inverse: `unpermute_qk`.
  """
  head_dim = w.shape[0] // num_heads
  return (w.reshape(num_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes `permute_qk`: w[num_heads * head_dim, ...] from llama.cpp's interleaved rows back to
  HF's rotate-half rows. num_heads is the head count of that projection (kv heads for k)."""
  head_dim = w.shape[0] // num_heads
  return (w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def gguf_to_hf_name(name: str) -> Optional[str]:
  """HF name of a GGUF tensor name; None for tensors that carry no parameter (rope_freqs)."""
  if name == "rope_freqs.weight":
    return None
  if name in _GGUF_TOP:
    return _GGUF_TOP[name]
  match = _GGUF_LAYER_RE.match(name)
  if match and match.group(2) in GGUF_TO_HF:
    return f"model.layers.{match.group(1)}.{GGUF_TO_HF[match.group(2)]}"
  raise UnsupportedCheckpointError(f"unexpected GGUF tensor {name!r}.")



# ---------------------------------------------------------------------------------------------
# Reader.


@dataclasses.dataclass
class GGUFFile:
  """An opened GGUF file: metadata values and a tensor reader (the file is memory-mapped)."""
  path: str
  metadata: Dict[str, Any]         # every key-value field, decoded to Python values
  tensor_names: Tuple[str, ...]    # in file order
  _reader: Any = dataclasses.field(repr=False, default=None)

  def tensors(self, family: str, config: ModelConfig) -> Iterator[Tuple[str, np.ndarray]]:
    """(HF name, float32 array in HF layout) per tensor, dequantised, Q/K un-permuted for Llama."""
    from gguf import quants  # pylint: disable=import-outside-toplevel
    for tensor in self._reader.tensors:
      name = gguf_to_hf_name(tensor.name)
      if name is None:
        continue
      w = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
      if family == "llama" and name.endswith("self_attn.q_proj.weight"):
        w = unpermute_qk(w, config.num_heads)
      elif family == "llama" and name.endswith("self_attn.k_proj.weight"):
        w = unpermute_qk(w, config.num_kv_heads)
      yield name, w


def read_gguf(path: str) -> GGUFFile:
  """Opens a GGUF file with the `gguf` package and decodes its metadata.

  Raises:
    FileNotFoundError: no such file. ValueError: not a GGUF file.
  """
  import gguf  # pylint: disable=import-outside-toplevel
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no GGUF file at {path}.")
  try:
    reader = gguf.GGUFReader(path)
  except (ValueError, OSError) as e:
    raise ValueError(f"{path} is not a readable GGUF file: {e}") from e
  metadata = {}
  for key, field in reader.fields.items():
    if key.startswith("GGUF."):
      continue
    value = field.contents()
    metadata[key] = value
  return GGUFFile(path=path, metadata=metadata,
                  tensor_names=tuple(t.name for t in reader.tensors), _reader=reader)

