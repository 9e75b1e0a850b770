"""The continuous engine on 8 fake CPU devices equals it on one, with rows, prompts and decode
slots split over the batch axes (continuous_sharded_script.py, run in a subprocess so that this
process keeps one device), also with its slots halved as the rows run out, and on a paged cache
of too few pages (rows restart) whose pages are split over the batch shards too; and on the
engine's own copy of weights the learner splits by FSDP, resharded to each rollout layout."""

import json
import os
import subprocess
import sys

import pytest

import test_util

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHAPES = ("8,1,1", "2,2,2")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("continuous") / "continuous.json")
  env = test_util.device_env(8, PYTHONPATH=ROOT)
  done = subprocess.run([sys.executable, os.path.join(HERE, "continuous_sharded_script.py"), out,
                         *SHAPES], env=env, cwd=ROOT, capture_output=True, text=True,
                        timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out) as f:
    return json.load(f)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["greedy", "sampled", "shrunk", "paged"])
def test_sharded_engine_matches_one_device(results, shape, mode):
  r = results["meshes"][shape][mode]
  assert results["devices"] == 8
  assert r["tokens_equal"] and r["mask_equal"] and r["rows_sharded"]
  assert r["logprobs_diff"] <= 1e-5
  assert 0 < r["tokens_kept"] < 16 * 7  # skipped rows and short rows kept nothing past their end
  assert r["slot_steps"] >= r["tokens_kept"]


def test_caches_are_split_over_the_batch_shards(results):
  # Last mesh 2,2,2: data x fsdp = 4 batch shards of the 8 slots and 8 prompts (scanned layout
  # [L, rows, slots, Hkv, head_dim]).
  cache = results["cache"]
  assert cache["global"][1] == 8 and cache["per_device"][1] == 2
  assert cache["prompt_per_device"][1] == 2


def test_pages_are_split_over_the_batch_shards_and_their_heads_over_tensor(results):
  # A pool of pages [L, Pg, page_size, 2 Hkv, d] on mesh 2,2,2: each of the 4 batch shards holds
  # its block of pages, and each of the 2 tensor devices the keys and values of one of the 2 KV
  # heads (interleaved: k0 v0 | k1 v1).
  pages = results["pages"]
  assert pages["per_device"][1] * 4 == pages["global"][1]
  assert pages["per_device"][3] * 2 == pages["global"][3] == 4


@pytest.mark.parametrize("layout", ["replicated", "tensor"])
@pytest.mark.parametrize("mode", ["greedy", "paged"])
def test_engine_on_its_own_layout_matches_one_device(results, layout, mode):
  """FSDP over 8 devices for the learner; the engine's copy made once by the reshard program on
  the same devices: whole on each (8 rows shards) or split over a tensor axis of 2 (4 shards)."""
  r = results["layouts"][layout]
  assert r["same_devices"]
  assert r["mesh"] == ({"data": 8, "fsdp": 1, "tensor": 1} if layout == "replicated"
                       else {"data": 4, "fsdp": 1, "tensor": 2})
  assert r["weights_whole"] == (layout == "replicated")
  assert r[mode]["tokens_equal"] and r[mode]["mask_equal"]
  assert r[mode]["logprobs_diff"] <= 1e-5
