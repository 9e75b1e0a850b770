"""Configuration of the decoder-only transformer (Llama / Qwen2 / Qwen3 family).

`ModelConfig` is a frozen, hashable dataclass: it lives in the module's static graph definition,
so two models with equal configs share compiled programs. Presets:

  ModelConfig.tiny(vocab_size=...)    ~3M parameters plus the embedding; the CPU quickstart model
  ModelConfig.smollm2_135m()          SmolLM2-135M (Llama architecture, tied embeddings)

Variants are `dataclasses.replace(config, ...)` or keyword overrides of a preset, e.g.
`ModelConfig.tiny(vocab_size=300, qkv_bias=True)` for a Qwen2-style block.
"""

import dataclasses
from typing import Optional

import jax.numpy as jnp

_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer.

  Raises:
    ValueError: from `__post_init__` when a field is out of range or fields disagree (heads not
      divisible by kv heads, odd head_dim, unknown dtype, ...); the message names the field.
  """
  vocab_size: int                   # V, rows of the token embedding
  d_model: int                      # residual stream width (logical axis `embed`)
  num_layers: int                   # decoder blocks
  num_heads: int                    # query heads (logical axis `heads`)
  num_kv_heads: int                 # key/value heads for grouped-query attention (`kv_heads`)
  mlp_dim: int                      # SwiGLU hidden width (logical axis `mlp`)
  head_dim: Optional[int] = None    # per-head width (`head_dim`); None means d_model // num_heads
  rope_theta: float = 10_000.0      # rotary base frequency
  rms_eps: float = 1e-6             # epsilon inside every RMSNorm
  tie_embeddings: bool = False      # output head reuses the token embedding (transposed)
  qkv_bias: bool = False            # bias on the q, k, v projections (Qwen2)
  qk_norm: bool = False             # RMSNorm over head_dim on q and k before rotary (Qwen3)
  dtype: str = "float32"            # activation / compute dtype; logits are always float32
  param_dtype: str = "float32"      # storage dtype of the parameters
  init_std: float = 0.02            # std of the normal initialiser of every weight matrix
  # Llama 3 rotary frequency scaling; None disables it (Llama 3.1 uses factor 8, low 1, high 4,
  # original length 8192).
  rope_scaling_factor: Optional[float] = None
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}.")
    if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
          f"({self.num_kv_heads}) for grouped-query attention.")
    if self.head_dim is None:
      if self.d_model % self.num_heads:
        raise ValueError(
            f"ModelConfig.d_model ({self.d_model}) is not divisible by num_heads "
            f"({self.num_heads}); set head_dim explicitly.")
      object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
    if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
      raise ValueError(
          f"ModelConfig.head_dim must be a positive even int (rotary embeddings rotate pairs), "
          f"got {self.head_dim!r}.")
    if self.rope_theta <= 0:
      raise ValueError(f"ModelConfig.rope_theta must be positive, got {self.rope_theta}.")
    if self.rms_eps <= 0:
      raise ValueError(f"ModelConfig.rms_eps must be positive, got {self.rms_eps}.")
    for name in ("dtype", "param_dtype"):
      value = getattr(self, name)
      canonical = jnp.dtype(value).name if _is_dtype_like(value) else None
      if canonical not in _DTYPES:
        raise ValueError(f"ModelConfig.{name} must be one of {_DTYPES}, got {value!r}.")
      object.__setattr__(self, name, canonical)
    if self.rope_scaling_factor is not None:
      if self.rope_scaling_factor < 1.0:
        raise ValueError(
            f"ModelConfig.rope_scaling_factor must be >= 1, got {self.rope_scaling_factor}.")
      if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
        raise ValueError(
            "ModelConfig needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
            f"{self.rope_low_freq_factor} and {self.rope_high_freq_factor}.")

  @property
  def num_params(self) -> int:
    """Parameter count of the base model (no adapters)."""
    d, h, kv, hd, m = self.d_model, self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_dim
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d
    if self.qkv_bias:
      attn += (h + 2 * kv) * hd
    if self.qk_norm:
      attn += 2 * hd
    block = attn + 3 * d * m + 2 * d
    head = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * block + d + head

  @classmethod
  def tiny(cls, vocab_size: int, **overrides) -> "ModelConfig":
    """A few-million-parameter Llama-style model that trains and samples fast on a 2-core CPU."""
    fields = dict(vocab_size=vocab_size, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2,
                  mlp_dim=768, rope_theta=10_000.0, rms_eps=1e-6, tie_embeddings=True)
    fields.update(overrides)
    return cls(**fields)

  @classmethod
  def smollm2_135m(cls, **overrides) -> "ModelConfig":
    """SmolLM2-135M (HuggingFaceTB), a Llama-architecture model with tied embeddings."""
    fields = dict(vocab_size=49152, d_model=576, num_layers=30, num_heads=9, num_kv_heads=3,
                  mlp_dim=1536, rope_theta=100_000.0, rms_eps=1e-5, tie_embeddings=True)
    fields.update(overrides)
    return cls(**fields)


def _is_dtype_like(value) -> bool:
  try:
    jnp.dtype(value)
  except TypeError:
    return False
  return True


# The one table of named presets (configs and entrypoints look names up here).
PRESETS = {
    "tiny": ModelConfig.tiny,
    "smollm2_135m": ModelConfig.smollm2_135m,
}
