"""Configuration of the decoder-only transformer (Llama / Qwen2 / Qwen3 family).

`ModelConfig` is a frozen, hashable dataclass: it lives in the module's static graph definition,
so two models with equal configs share compiled programs. Presets:

  ModelConfig.tiny(vocab_size=...)    ~3M parameters plus the embedding; the from-scratch CPU model
  ModelConfig.smollm2_135m()          SmolLM2-135M (Llama architecture, tied embeddings)
  PRESETS["qwen2_5_0_5b"]() ... qwen2_5_7b
                                      Qwen2.5 0.5B / 1.5B / 3B / 7B (Qwen Team 2024; q/k/v bias;
                                      tied embeddings except 7B)
  PRESETS["qwen3_0_6b"]() ... qwen3_8b
                                      Qwen3 0.6B / 1.7B / 4B / 8B (Qwen Team 2025; q/k RMSNorm,
                                      head_dim 128; tied embeddings except 8B)
  PRESETS["llama3_2_1b"](), llama3_2_3b
                                      Llama 3.2 1B / 3B (Meta 2024; Llama 3 rotary scaling with
                                      factor 32; tied embeddings)

Variants are `dataclasses.replace(config, ...)` or keyword overrides of a preset, e.g.
`ModelConfig.tiny(vocab_size=300, qkv_bias=True)` for a Qwen2-style block. `PRESETS` maps each
preset name to its constructor.
"""

import dataclasses
from typing import Callable, Optional

import jax.numpy as jnp

_DTYPES = ("float32", "bfloat16", "float16")
# none: keep every activation for the backward pass; block: keep only each block's input and
# recompute the block; dots: keep the block's matmul outputs, recompute the rest (elementwise).
REMAT_POLICIES = ("none", "block", "dots")
ATTENTION_BACKENDS = ("reference", "tpu", "auto")


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
  # Memory and compile time (they change no value, see transformer.py):
  scan_layers: bool = False         # the block stack as one scanned block with [L, ...] parameters
  remat: str = "none"               # recompute each block in the backward pass: none | block | dots
  # Attention kernels (float rounding aside they change no value either): `reference` is pure
  # JAX (CPU, GPU, tests); `tpu` is JAX's TPU kernels (splash attention for many queries, ragged
  # paged attention for a paged decode; a dense cache decodes with XLA's attention, which has no
  # kernel); `auto` is `tpu` on a TPU and `reference` elsewhere.
  attention: str = "reference"
  # Many-query attention of the reference (prefill, learn step): 0 holds each layer's [T, S]
  # scores whole; k > 0 walks the keys in blocks of k slots with an online softmax, memory
  # linear in T (forward and backward).
  attention_block: int = 0
  kv_dtype: str = ""                # the KV cache's dtype: "" = `dtype` (bfloat16 for a bfloat16
                                    # model), or float32 on request

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
    if self.attention not in ATTENTION_BACKENDS:
      raise ValueError(f"ModelConfig.attention must be one of {ATTENTION_BACKENDS}, got "
                       f"{self.attention!r}.")
    if not isinstance(self.attention_block, int) or self.attention_block < 0:
      raise ValueError("ModelConfig.attention_block must be an int >= 0 (0 = scores whole), got "
                       f"{self.attention_block!r}.")
    if self.kv_dtype not in ("",) + _DTYPES:
      raise ValueError(f"ModelConfig.kv_dtype must be '' (the compute dtype) or one of "
                       f"{_DTYPES}, got {self.kv_dtype!r}.")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"ModelConfig.remat must be one of {REMAT_POLICIES}, got {self.remat!r}.")
    if self.rope_scaling_factor is not None:
      if self.rope_scaling_factor < 1.0:
        raise ValueError(
            f"ModelConfig.rope_scaling_factor must be >= 1, got {self.rope_scaling_factor}.")
      if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
        raise ValueError(
            "ModelConfig needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
            f"{self.rope_low_freq_factor} and {self.rope_high_freq_factor}.")

  @property
  def cache_dtype(self) -> str:
    """The KV cache's dtype: `kv_dtype`, or the compute dtype when it is empty."""
    return self.kv_dtype or self.dtype

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



def _family(**shared):
  return lambda **shape: {**shared, **shape}


# Published config.json values of the families users bring (base models).
_QWEN2_5 = _family(vocab_size=151936, rope_theta=1_000_000.0, rms_eps=1e-6, qkv_bias=True,
                   tie_embeddings=True)
_QWEN3 = _family(vocab_size=151936, head_dim=128, rope_theta=1_000_000.0, rms_eps=1e-6,
                 qk_norm=True, tie_embeddings=True)
_LLAMA3_2 = _family(vocab_size=128256, rope_theta=500_000.0, rms_eps=1e-5, tie_embeddings=True,
                    rope_scaling_factor=32.0, rope_low_freq_factor=1.0,
                    rope_high_freq_factor=4.0, rope_original_max_len=8192)
_FAMILY_PRESETS = {
    # Qwen Team 2024, "Qwen2.5 Technical Report" (arXiv:2412.15115).
    "qwen2_5_0_5b": _QWEN2_5(d_model=896, num_layers=24, num_heads=14, num_kv_heads=2,
                             mlp_dim=4864),
    "qwen2_5_1_5b": _QWEN2_5(d_model=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                             mlp_dim=8960),
    "qwen2_5_3b": _QWEN2_5(d_model=2048, num_layers=36, num_heads=16, num_kv_heads=2,
                           mlp_dim=11008),
    "qwen2_5_7b": _QWEN2_5(d_model=3584, num_layers=28, num_heads=28, num_kv_heads=4,
                           mlp_dim=18944, vocab_size=152064, tie_embeddings=False),
    # Qwen Team 2025, "Qwen3 Technical Report" (arXiv:2505.09388).
    "qwen3_0_6b": _QWEN3(d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8, mlp_dim=3072),
    "qwen3_1_7b": _QWEN3(d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8, mlp_dim=6144),
    "qwen3_4b": _QWEN3(d_model=2560, num_layers=36, num_heads=32, num_kv_heads=8, mlp_dim=9728),
    "qwen3_8b": _QWEN3(d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8, mlp_dim=12288,
                       tie_embeddings=False),
    # Meta 2024, Llama 3.2 1B and 3B (Llama 3 architecture, "The Llama 3 Herd of Models",
    # arXiv:2407.21783).
    "llama3_2_1b": _LLAMA3_2(d_model=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                             mlp_dim=8192),
    "llama3_2_3b": _LLAMA3_2(d_model=3072, num_layers=28, num_heads=24, num_kv_heads=8,
                             mlp_dim=8192),
}


def _preset(name: str) -> Callable[..., ModelConfig]:
  def build(**overrides) -> ModelConfig:
    return ModelConfig(**{**_FAMILY_PRESETS[name], **overrides})
  build.__name__ = name
  build.__doc__ = f"The {name} preset (`_FAMILY_PRESETS`), with keyword overrides."
  return build


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
    **{name: _preset(name) for name in _FAMILY_PRESETS},
}
