"""Tests of rl_curriculum/model/config.py."""

import dataclasses

import jax
import pytest
from flax import nnx

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
