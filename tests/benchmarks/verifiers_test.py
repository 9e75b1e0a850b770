"""benchmarks/verifiers.py: one row of sane timings per (task, template)."""

import math

import numpy as np

from benchmarks import verifiers as verifier_benchmark


def test_fuzzed_completions_are_deterministic_strings():
  first = verifier_benchmark.fuzzed_completions(np.random.default_rng(3), "42", 20)
  again = verifier_benchmark.fuzzed_completions(np.random.default_rng(3), "42", 20)
  assert first == again and len(first) == 20 and all(isinstance(t, str) for t in first)


def test_run_times_every_task_and_template():
  rows = verifier_benchmark.run(n=3, seed=0)
  pairs = [(r["task"], r["template"]) for r in rows]
  assert pairs == [(t, m) for t in ("arithmetic", "countdown", "zebra", "arc1d")
                   for m in ("plain", "chat")] + [("gsm8k", "chat"), ("math", "chat")]
  for row in rows:
    assert row["calls"] == 3
    assert 0 <= row["mean_us"] <= row["max_us"] and math.isfinite(row["p99_us"])
