"""benchmarks/rollout.py at its --quick sizes: the numbers it writes are consistent."""

import json

import numpy as np
import pytest

from benchmarks import rollout as bench


def test_long_tail_lengths_have_the_tail_the_issue_asks_for():
  lengths = bench.long_tail_lengths(4096, 128)
  assert lengths.min() >= 1 and lengths.max() <= 128
  assert np.percentile(lengths, 90) >= 4 * np.median(lengths)


def test_static_rows_per_call_spend_the_same_cache():
  per_call = bench.static_rows_per_call(prompts=32, tp=32, n=128, slots=64)
  budget = 32 * 32 + 64 * 128
  assert per_call % bench.GROUP == 0
  assert per_call * (32 + 128) <= budget < (per_call + bench.GROUP) * (32 + 128)


@pytest.fixture(scope="module")
def quick():
  return bench.run_model("tiny", quick=True, slots=8, shrink=2, repeats=1)


def test_quick_run_reports_both_engines(quick, tmp_path):
  for workload in ("long_tail", "tasks"):
    r = quick[workload]
    for engine in ("static", "continuous", "continuous_fixed"):
      e = r[engine]
      assert 0 < e["slot_utilisation"] <= 1
      assert e["tokens_per_s"] > 0 and e["decode_over_prefill"] > 0
      assert e["tokens_kept"] == r["static"]["tokens_kept"]  # the same rows, the same tokens
    assert r["speedup"] == pytest.approx(r["continuous"]["tokens_per_s"]
                                         / r["static"]["tokens_per_s"])
  tail = quick["long_tail"]
  assert (tail["continuous"]["slot_utilisation"] > tail["continuous_fixed"]["slot_utilisation"]
          > tail["static"]["slot_utilisation"])
  assert tail["continuous"]["stage_slots"] == [8, 4, 2]
  assert tail["continuous"]["tokens_kept"] == sum_lengths(tail)
  skipped = quick["skipped"]
  assert 0 < skipped["continuous"]["slot_steps_saved_frac"] <= 1
  text = bench.markdown({"environment": {}, "slots": 8, "shrink": 2, "models": {"tiny": quick}})
  assert "| tiny | long_tail | continuous |" in text
  assert "| tiny | long_tail | continuous_fixed |" in text
  json.dumps(quick)  # what main writes


def sum_lengths(tail):
  """The long-tailed rows keep exactly their drawn lengths."""
  return float(bench.long_tail_lengths(tail["rows"], tail["max_new_tokens"]).sum())
