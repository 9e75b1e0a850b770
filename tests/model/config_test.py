"""Tests of rl_curriculum/model/config.py."""

import dataclasses

import jax
import pytest
from flax import nnx

from rl_curriculum.model import hf_io
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.model.config import PRESETS


def test_smollm2_preset_matches_the_published_parameter_count():
  config = ModelConfig.smollm2_135m()
  assert (config.num_layers, config.d_model, config.num_heads, config.num_kv_heads) == (
      30, 576, 9, 3)
  assert (config.mlp_dim, config.vocab_size, config.head_dim) == (1536, 49152, 64)
  assert config.tie_embeddings and config.rope_theta == 100_000.0 and config.rms_eps == 1e-5
  # HF model card of SmolLM2-135M: 134,515,008 parameters (tied embeddings counted once).
  assert config.num_params == 134_515_008


# Published totals, tied embeddings counted once: the HF safetensors totals of Qwen2.5, Llama 3.2,
# Qwen3-4B and Qwen3-8B; transformers `num_parameters()` of Qwen/Qwen3-0.6B; the tensors of
# Qwen/Qwen3-1.7B-Base's model.safetensors (310 tensors, no lm_head).
PUBLISHED_PARAMS = {
    "qwen2_5_0_5b": 494_032_768,
    "qwen2_5_1_5b": 1_543_714_304,
    "qwen2_5_3b": 3_085_938_688,
    "qwen2_5_7b": 7_615_616_512,
    "qwen3_0_6b": 596_049_920,
    "qwen3_1_7b": 1_720_574_976,
    "qwen3_4b": 4_022_468_096,
    "qwen3_8b": 8_190_735_360,
    "llama3_2_1b": 1_235_814_400,
    "llama3_2_3b": 3_212_749_824,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_presets_match_the_published_parameter_counts(name):
  assert PRESETS[name]().num_params == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name, stored", [("qwen3_0_6b", 751_632_384),
                                          ("qwen3_1_7b", 2_031_739_904)])
def test_qwen3_checkpoints_that_store_the_tied_head_count_it_twice(name, stored):
  # The Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B safetensors files (and the GGUF files made from
  # them) hold lm_head.weight as a separate copy of the tied embedding; their totals are these.
  config = PRESETS[name]()
  assert config.tie_embeddings
  assert config.num_params + config.vocab_size * config.d_model == stored


# The published config.json of each model, the fields `config_from_hf` reads.
_QWEN2_5 = dict(architectures=["Qwen2ForCausalLM"], hidden_act="silu", rope_theta=1000000.0,
                rms_norm_eps=1e-06, use_sliding_window=False)
_QWEN3 = dict(architectures=["Qwen3ForCausalLM"], hidden_act="silu", attention_bias=False,
              head_dim=128, rope_scaling=None, rope_theta=1000000, rms_norm_eps=1e-06,
              use_sliding_window=False, vocab_size=151936)
_LLAMA3_2 = dict(architectures=["LlamaForCausalLM"], hidden_act="silu", attention_bias=False,
                 mlp_bias=False, intermediate_size=8192, num_key_value_heads=8,
                 rms_norm_eps=1e-05, rope_theta=500000.0, tie_word_embeddings=True,
                 vocab_size=128256,
                 rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192,
                               "rope_type": "llama3"})
HF_CONFIGS = {
    "qwen2_5_0_5b": dict(_QWEN2_5, hidden_size=896, intermediate_size=4864,
                         num_attention_heads=14, num_hidden_layers=24, num_key_value_heads=2,
                         tie_word_embeddings=True, vocab_size=151936),
    "qwen2_5_1_5b": dict(_QWEN2_5, hidden_size=1536, intermediate_size=8960,
                         num_attention_heads=12, num_hidden_layers=28, num_key_value_heads=2,
                         tie_word_embeddings=True, vocab_size=151936),
    "qwen2_5_3b": dict(_QWEN2_5, hidden_size=2048, intermediate_size=11008,
                       num_attention_heads=16, num_hidden_layers=36, num_key_value_heads=2,
                       tie_word_embeddings=True, vocab_size=151936),
    "qwen2_5_7b": dict(_QWEN2_5, hidden_size=3584, intermediate_size=18944,
                       num_attention_heads=28, num_hidden_layers=28, num_key_value_heads=4,
                       tie_word_embeddings=False, vocab_size=152064),
    "qwen3_0_6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                       num_hidden_layers=28, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3_1_7b": dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
                       num_hidden_layers=28, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3_4b": dict(_QWEN3, hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                     num_hidden_layers=36, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3_8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                     num_hidden_layers=36, num_key_value_heads=8, tie_word_embeddings=False),
    "llama3_2_1b": dict(_LLAMA3_2, head_dim=64, hidden_size=2048, num_attention_heads=32,
                        num_hidden_layers=16),
    "llama3_2_3b": dict(_LLAMA3_2, head_dim=128, hidden_size=3072, num_attention_heads=24,
                        num_hidden_layers=28),
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_presets_equal_the_published_hf_configs(name):
  config, family = hf_io.config_from_hf(HF_CONFIGS[name])
  assert family == name[:5]  # qwen2 (Qwen2.5), qwen3, llama
  assert PRESETS[name]() == config


def test_every_preset_builds_and_takes_overrides():
  assert set(PUBLISHED_PARAMS) <= set(PRESETS)
  for name, make in PRESETS.items():
    args = {"vocab_size": 64} if name == "tiny" else {}
    config = make(**args)
    assert isinstance(config, ModelConfig) and config.num_params > 0
    changed = make(**args, num_layers=2, dtype="bfloat16", rms_eps=1e-3)
    assert (changed.num_layers, changed.dtype, changed.rms_eps) == (2, "bfloat16", 1e-3)
    assert changed == dataclasses.replace(config, num_layers=2, dtype="bfloat16", rms_eps=1e-3)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_num_params_of_each_preset_counts_the_initialised_leaves(name):
  config = PRESETS[name](num_layers=1)
  abstract = nnx.eval_shape(lambda: transformer.Transformer(config, rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(abstract))) == config.num_params


@pytest.mark.parametrize("overrides", [
    {}, {"qkv_bias": True, "tie_embeddings": False}, {"qk_norm": True, "num_kv_heads": 1}])
def test_num_params_counts_the_initialised_leaves(overrides):
  fields = dict(vocab_size=40, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=24)
  config = ModelConfig.tiny(**{**fields, **overrides})
  abstract = nnx.eval_shape(lambda: transformer.Transformer(config, rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(abstract))) == config.num_params


def test_tiny_preset_is_a_few_million_parameters():
  config = PRESETS["tiny"](vocab_size=259)
  assert config.head_dim == 64 and config.num_kv_heads < config.num_heads
  assert 1_000_000 < config.num_params < 10_000_000


def test_replace_and_dtype_names():
  config = dataclasses.replace(ModelConfig.tiny(vocab_size=10), dtype="bfloat16")
  assert config.dtype == "bfloat16" and config.param_dtype == "float32"
  assert ModelConfig.tiny(vocab_size=10, param_dtype=jax.numpy.bfloat16).param_dtype == "bfloat16"
  assert hash(config) == hash(dataclasses.replace(config))


@pytest.mark.parametrize("overrides, field", [
    ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads"),
    ({"num_heads": 2, "num_kv_heads": 4}, "num_kv_heads"),
    ({"d_model": 30, "num_heads": 4}, "head_dim"),
    ({"head_dim": 7}, "head_dim"),
    ({"mlp_dim": 0}, "mlp_dim"),
    ({"num_layers": 2.5}, "num_layers"),
    ({"dtype": "int8"}, "dtype"),
    ({"param_dtype": "nonsense"}, "param_dtype"),
    ({"rope_theta": 0.0}, "rope_theta"),
    ({"rms_eps": -1.0}, "rms_eps"),
    ({"rope_scaling_factor": 0.5}, "rope_scaling_factor"),
])
def test_invalid_configs_raise_with_the_field_name(overrides, field):
  with pytest.raises(ValueError, match=field):
    ModelConfig.tiny(vocab_size=16, **overrides)
