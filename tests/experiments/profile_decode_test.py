"""experiments/profile_decode.py on the tiny model: its parts add up and its FLOP count is the
model's."""

import jax
import numpy as np
import pytest

from experiments import benchmark_rollout
from experiments import profile_decode


def test_flops_per_token_count_every_weight_of_the_blocks_and_the_head():
  policy = benchmark_rollout.load("tiny")
  sizes = {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): x.size
           for path, x in jax.tree_util.tree_flatten_with_path(policy.params)[0]}
  block_weights = sum(n for path, n in sizes.items()
                      if path.startswith("blocks") and "kernel" in path)
  flops = profile_decode.flops_per_token(policy.config)
  assert flops["blocks"] == 2 * block_weights
  assert flops["head"] == 2 * sizes["embed/value"]


def test_parts_add_up_to_the_iteration():
  policy = benchmark_rollout.load("tiny")
  r = profile_decode.profile(policy, slots=8, prompts=2, tp=8, n=8, repeats=1)
  parts = ("blocks", "attention", "head", "draw", "bookkeeping")
  assert sum(r[p + "_s"] for p in parts) == pytest.approx(r["loop_iteration_s"])
  assert sum(r["shares"].values()) == pytest.approx(1.0)
  assert r["decode_over_prefill"] == pytest.approx(r["decode_tok_s"] / r["prefill_tok_s"])
  assert 0 < r["decode_over_prefill_at_equal_flop_rate"] <= 1
  assert len(r["forward_s_by_keys"]) == 3 and np.isfinite(r["attention_s_per_key"])
  assert "| attention |" in profile_decode.markdown({"environment": {}, "model": "tiny",
                                                     "profile": r})
