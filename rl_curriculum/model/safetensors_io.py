"""safetensors files: the weight files of an HF folder listed, read and written.

Host-side file work with NumPy arrays, independent of the tensor names and layouts (`hf_io.py`
maps those to parameters): `safetensors_files` lists a folder's weight files (by the shard index
when there is one), `iter_safetensors` reads their tensors one at a time, and `write_safetensors`
writes tensors as one file or as shards with an index. `pretrained.py` reads and writes model
folders with them, `peft_io.py` adapter files.
"""

import glob
import json
import os
from typing import Iterator, Mapping, Tuple

import numpy as np


def safetensors_files(folder: str) -> list:
  """The weight files of an HF folder: those listed by model.safetensors.index.json, else every
  *.safetensors file except adapters.

  Raises:
    FileNotFoundError: no safetensors file (the message says what was found and what to do).
  """
  index = os.path.join(folder, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    missing = [n for n in files if not os.path.isfile(os.path.join(folder, n))]
    if missing:
      raise FileNotFoundError(f"{folder}: model.safetensors.index.json lists {missing}, which are "
                              "missing; copy every shard of the checkpoint into the folder.")
    return [os.path.join(folder, n) for n in files]
  files = sorted(p for p in glob.glob(os.path.join(folder, "*.safetensors"))
                 if not os.path.basename(p).startswith("adapter_model"))
  if not files:
    present = sorted(os.listdir(folder))
    hint = ("; it holds PyTorch .bin weights: convert them once with transformers "
            "(`AutoModelForCausalLM.from_pretrained(folder).save_pretrained(out)`)"
            if any(n.endswith(".bin") for n in present) else "")
    raise FileNotFoundError(f"{folder} has no *.safetensors weights (files: {present}){hint}.")
  return files


def iter_safetensors(folder: str) -> Iterator[Tuple[str, np.ndarray]]:
  """(HF name, NumPy array) for every tensor of an HF folder, one tensor in memory at a time.

  bfloat16 tensors come back as `ml_dtypes.bfloat16` arrays.
  """
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel
  for path in safetensors_files(folder):
    with safe_open(path, framework="numpy") as f:
      for name in f.keys():
        yield name, f.get_tensor(name)


def write_safetensors(tensors: Mapping[str, np.ndarray], folder: str, *,
                      max_shard_bytes: int = 4 << 30, prefix: str = "model") -> list:
  """Writes `{prefix}.safetensors`, or shards `{prefix}-0000i-of-0000n.safetensors` with a
  `{prefix}.safetensors.index.json` when the total exceeds max_shard_bytes. Returns the paths.

  The files carry metadata {"format": "pt"}, which transformers requires.
  """
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  os.makedirs(folder, exist_ok=True)
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    array = np.ascontiguousarray(tensors[name])
    if current and size + array.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = array
    size += array.nbytes
  shards.append(current)
  metadata = {"format": "pt"}
  if len(shards) == 1:
    path = os.path.join(folder, f"{prefix}.safetensors")
    save_file(shards[0], path, metadata=metadata)
    return [path]
  paths, weight_map = [], {}
  for i, shard in enumerate(shards):
    file = f"{prefix}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(folder, file), metadata=metadata)
    paths.append(os.path.join(folder, file))
    weight_map.update({name: file for name in shard})
  total = sum(a.nbytes for a in tensors.values())
  with open(os.path.join(folder, f"{prefix}.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  return paths
