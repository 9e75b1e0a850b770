"""benchmarks/profile_decode.py on the tiny model: what it times and its FLOP count."""

import jax
import numpy as np
import pytest

from benchmarks import profile_decode
from benchmarks import rollout as benchmark_rollout


def test_flops_per_token_count_every_weight_of_the_blocks_and_the_head():
  policy = benchmark_rollout.load("tiny")
  sizes = {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): x.size
           for path, x in jax.tree_util.tree_flatten_with_path(policy.params)[0]}
  block_weights = sum(n for path, n in sizes.items()
                      if path.startswith("blocks") and "kernel" in path)
  flops = profile_decode.flops_per_token(policy.config)
  assert flops["blocks"] == 2 * block_weights
  assert flops["head"] == 2 * sizes["embed/value"]


def test_profile_measures_each_part_and_reads_the_keys_it_says():
  policy = benchmark_rollout.load("tiny")
  r = profile_decode.profile(policy, slots=8, prompts=2, tp=8, n=8, repeats=1)
  for part in ("loop_iteration", "forward", "head", "draw", "prefill"):
    assert r[part + "_s"] > 0, part
  # Keys read at completion lengths 2, n, 4n: the prompt's 8, half the completion, the new token.
  assert list(r["forward_s_by_keys"]) == ["10", "13", "25"]
  assert np.isfinite(r["attention_s_per_key"])
  assert r["decode_tok_s"] == pytest.approx(8 / r["loop_iteration_s"])
  assert r["prefill_tok_s"] == pytest.approx(2 * 8 / r["prefill_s"])
  assert 0 < r["decode_over_prefill_at_equal_flop_rate"] <= 1
  text = profile_decode.markdown({"environment": {}, "model": "tiny", "profile": r})
  for part in ("blocks", "attention", "head", "draw", "bookkeeping"):
    assert f"| {part} |" in text
