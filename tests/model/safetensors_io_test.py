"""Tests of rl_curriculum/model/safetensors_io.py."""

import json
import os

import numpy as np
import pytest

from rl_curriculum.model import safetensors_io


def test_write_and_read_safetensors_sharded_and_bfloat16(tmp_path):
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(4)
  tensors = {f"model.layers.{i}.mlp.up_proj.weight": rng.normal(size=(16, 8)).astype(np.float32)
             for i in range(5)}
  tensors["model.norm.weight"] = rng.normal(size=(8,)).astype(ml_dtypes.bfloat16)
  paths = safetensors_io.write_safetensors(tensors, str(tmp_path), max_shard_bytes=1100)
  assert len(paths) > 1
  assert os.path.isfile(tmp_path / "model.safetensors.index.json")
  read = dict(safetensors_io.iter_safetensors(str(tmp_path)))
  assert sorted(read) == sorted(tensors)
  for name, value in tensors.items():
    assert read[name].dtype == value.dtype
    np.testing.assert_array_equal(read[name], value)
  one = tmp_path / "one"
  assert safetensors_io.write_safetensors(tensors, str(one)) == [str(one / "model.safetensors")]


def test_missing_weights_say_what_to_do(tmp_path):
  with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
    safetensors_io.safetensors_files(str(tmp_path))
  (tmp_path / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(FileNotFoundError, match="convert them"):
    safetensors_io.safetensors_files(str(tmp_path))
  (tmp_path / "model.safetensors.index.json").write_text(
      json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
  with pytest.raises(FileNotFoundError, match="every shard"):
    safetensors_io.safetensors_files(str(tmp_path))
