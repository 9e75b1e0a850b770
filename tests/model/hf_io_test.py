"""Tests of rl_curriculum/model/hf_io.py (no torch needed)."""

import json

import numpy as np
import pytest

from rl_curriculum.model import hf_io
from rl_curriculum.model.checkpoint_errors import UnsupportedCheckpointError
from rl_curriculum.model.config import ModelConfig

LLAMA_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
    "tie_word_embeddings": True, "hidden_act": "silu",
}


# --- layouts --------------------------------------------------------------------------------------


def test_q_kernel_layout_against_index_loop():
  h, hd, d = 3, 4, 5
  w = np.random.default_rng(1).normal(size=(h * hd, d)).astype(np.float32)  # HF [out, in]
  path = ("blocks", 0, "attn", "q", "kernel")
  kernel = hf_io.to_param_layout(w, path, 1, (d, h, hd))
  for i in range(d):
    for head in range(h):
      for j in range(hd):
        assert kernel[i, head, j] == w[head * hd + j, i]
  np.testing.assert_array_equal(hf_io.from_param_layout(kernel, path, 1), w)


def test_o_kernel_layout_against_index_loop():
  h, hd, d = 3, 4, 5
  w = np.random.default_rng(2).normal(size=(d, h * hd)).astype(np.float32)  # HF [out, in]
  path = ("blocks", 1, "attn", "o", "kernel")
  kernel = hf_io.to_param_layout(w, path, 2, (h, hd, d))
  for head in range(h):
    for j in range(hd):
      for i in range(d):
        assert kernel[head, j, i] == w[i, head * hd + j]
  np.testing.assert_array_equal(hf_io.from_param_layout(kernel, path, 2), w)


def test_bias_head_and_vector_layouts_round_trip():
  rng = np.random.default_rng(3)
  bias = rng.normal(size=(12,)).astype(np.float32)
  path = ("blocks", 0, "attn", "k", "bias")
  ours = hf_io.to_param_layout(bias, path, None, (3, 4))
  assert ours[2, 1] == bias[2 * 4 + 1]
  np.testing.assert_array_equal(hf_io.from_param_layout(ours, path, None), bias)
  head = rng.normal(size=(7, 5)).astype(np.float32)  # lm_head [V, D]
  ours = hf_io.to_param_layout(head, ("head",), None, (5, 7))
  np.testing.assert_array_equal(ours, head.T)
  np.testing.assert_array_equal(hf_io.from_param_layout(ours, ("head",), None), head)


def test_shape_mismatch_names_the_parameter():
  with pytest.raises(ValueError, match="blocks/0/attn/q/kernel"):
    hf_io.to_param_layout(np.zeros((4, 4)), ("blocks", 0, "attn", "q", "kernel"), 1, (4, 2, 3))


def test_names_map_both_ways_for_every_parameter_of_each_family():
  from rl_curriculum.model import pretrained  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  config = ModelConfig.tiny(vocab_size=40, num_layers=2, qkv_bias=True, qk_norm=True,
                            tie_embeddings=False)
  _, state = pretrained.abstract_params(config)
  for path, _ in nnx.to_flat_state(state):
    name, n_in = hf_io.hf_name(path)
    assert hf_io.param_path(name) == (tuple(path), n_in)
  assert hf_io.param_path("model.layers.0.self_attn.rotary_emb.inv_freq") is None
  with pytest.raises(UnsupportedCheckpointError, match="unexpected tensor"):
    hf_io.param_path("model.layers.0.mlp.experts.0.w1.weight")


# --- configs --------------------------------------------------------------------------------------


def test_config_from_hf_reads_llama_fields():
  config, family = hf_io.config_from_hf(LLAMA_HF)
  assert family == "llama"
  assert (config.vocab_size, config.d_model, config.num_layers, config.num_heads,
          config.num_kv_heads, config.mlp_dim, config.head_dim) == (100, 32, 2, 4, 2, 48, 8)
  assert config.rope_theta == 5000.0 and config.rms_eps == 1e-5 and config.tie_embeddings
  assert not config.qkv_bias and not config.qk_norm and config.rope_scaling_factor is None


def test_config_from_hf_legacy_rope_keys_and_llama3_scaling():
  hf = {k: v for k, v in LLAMA_HF.items() if k != "rope_parameters"}
  hf.update(rope_theta=500000.0, rope_scaling={
      "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64})
  config, _ = hf_io.config_from_hf(hf)
  assert config.rope_theta == 500000.0
  assert (config.rope_scaling_factor, config.rope_low_freq_factor, config.rope_high_freq_factor,
          config.rope_original_max_len) == (8.0, 1.0, 4.0, 64)


def test_config_from_hf_families():
  qwen2, family = hf_io.config_from_hf(dict(LLAMA_HF, architectures=["Qwen2ForCausalLM"]))
  assert family == "qwen2" and qwen2.qkv_bias and not qwen2.qk_norm
  qwen3, family = hf_io.config_from_hf(
      dict(LLAMA_HF, architectures=["Qwen3ForCausalLM"], head_dim=16))
  assert family == "qwen3" and qwen3.qk_norm and not qwen3.qkv_bias and qwen3.head_dim == 16


def test_unknown_architecture_lists_supported_ones():
  with pytest.raises(UnsupportedCheckpointError) as info:
    hf_io.config_from_hf(dict(LLAMA_HF, architectures=["GPT2LMHeadModel"], model_type="gpt2"))
  message = str(info.value)
  assert "GPT2LMHeadModel" in message
  for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
    assert arch in message


@pytest.mark.parametrize("field,value", [
    ("attention_bias", True), ("mlp_bias", True), ("hidden_act", "gelu"),
    ("use_sliding_window", True), ("rope_parameters", {"rope_type": "yarn", "factor": 2.0}),
])
def test_unsupported_options_are_named(field, value):
  with pytest.raises(UnsupportedCheckpointError, match=field.split("_")[0]):
    hf_io.config_from_hf(dict(LLAMA_HF, **{field: value}))


@pytest.mark.parametrize("family,overrides", [
    ("llama", dict(tie_embeddings=True)),
    ("llama", dict(tie_embeddings=False, rope_scaling_factor=8.0, rope_original_max_len=32)),
    ("qwen2", dict(qkv_bias=True)),
    ("qwen3", dict(qk_norm=True, head_dim=16)),
])
def test_hf_config_round_trips(family, overrides):
  config = ModelConfig.tiny(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                            mlp_dim=48, rms_eps=1e-5, rope_theta=1234.0, **overrides)
  hf = json.loads(json.dumps(hf_io.hf_config(config, family, eos_id=3)))
  assert hf_io.config_from_hf(hf) == (config, family)
  assert hf_io.family_of(config) == family


def test_hf_config_refuses_a_block_of_another_family():
  with pytest.raises(UnsupportedCheckpointError, match="qwen2"):
    hf_io.hf_config(ModelConfig.tiny(vocab_size=8), "qwen2")
  with pytest.raises(UnsupportedCheckpointError, match="qkv_bias and qk_norm"):
    hf_io.family_of(ModelConfig.tiny(vocab_size=8, qkv_bias=True, qk_norm=True))


# --- assembling a state ---------------------------------------------------------------------------


def test_fill_state_reports_missing_and_skips_tied_head():
  abstract = {("embed",): np.zeros((4, 2)), ("final_norm", "scale"): np.zeros((2,))}
  place = lambda path, x: x  # pylint: disable=unnecessary-lambda-assignment
  tensors = [("model.embed_tokens.weight", np.ones((4, 2))), ("lm_head.weight", np.ones((4, 2))),
             ("model.norm.weight", np.ones(2))]
  out = hf_io.fill_state(abstract, tensors, place)
  assert sorted(out) == sorted(abstract)
  with pytest.raises(ValueError, match="model.norm.weight"):
    hf_io.fill_state(abstract, tensors[:1], place)
  with pytest.raises(ValueError, match="twice"):
    hf_io.fill_state(abstract, tensors + tensors[:1], place)


def test_stacked_parameters_give_the_per_layer_tensors():
  """A scanned model's [L, ...] parameters write the same HF tensors as the unrolled ones."""
  rng = np.random.default_rng(3)
  per_layer = {("embed",): rng.normal(size=(6, 4)),
               ("final_norm", "scale"): rng.normal(size=(4,))}
  for layer in range(3):
    per_layer[("blocks", layer, "attn", "o", "kernel")] = rng.normal(size=(2, 2, 4))
    per_layer[("blocks", layer, "attn_norm", "scale")] = rng.normal(size=(4,))
  stacked = {p: v for p, v in per_layer.items() if p[0] != "blocks"}
  for sub in (("attn", "o", "kernel"), ("attn_norm", "scale")):
    stacked[("blocks",) + sub] = np.stack([per_layer[("blocks", i) + sub] for i in range(3)])
  assert hf_io.is_stacked(("blocks", "attn", "o", "kernel"))
  assert not hf_io.is_stacked(("blocks", 0, "attn", "o", "kernel"))
  assert not hf_io.is_stacked(("embed",))
  split = hf_io.per_layer_arrays(stacked)
  assert sorted(split, key=str) == sorted(per_layer, key=str)
  for path, value in per_layer.items():
    np.testing.assert_array_equal(split[path], value)
  expected = hf_io.hf_tensors(per_layer)
  got = hf_io.hf_tensors(stacked)
  assert sorted(got) == sorted(expected) and "model.layers.2.self_attn.o_proj.weight" in got
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value)
