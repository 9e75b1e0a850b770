"""benchmarks/partial.py on a small random model: both ways decode the same batches,
the partial one within its staleness bound, and the summary reads the steps it is given."""

import numpy as np
import pytest

from benchmarks import partial as benchmark_partial
from rl_curriculum.model import pretrained
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig

N, PROMPTS, TP, SLOTS, K = 16, 2, 6, 8, 2


def _policy():
  config = ModelConfig.tiny(vocab_size=64, d_model=32, num_layers=1, num_heads=2,
                            num_kv_heads=1, mlp_dim=64)
  graphdef, params = transformer.init_model(config, seed=0)
  return pretrained.Policy(config=config, graphdef=graphdef, params=params, tokenizer=None,
                           context_length=64)


def test_partial_steps_take_the_same_batches_out_within_the_bound():
  policy = _policy()
  batches = [benchmark_partial.batch(policy, j, PROMPTS, TP, N) for j in range(6)]
  whole = benchmark_partial.whole(policy, batches[K:], SLOTS, 2, N)
  partial = benchmark_partial.partial(policy, batches, SLOTS, K, N, N)
  assert len(whole) == len(partial) == 4
  kept = [int(lengths.sum()) for _, lengths in batches]
  assert [s["tokens"] for s in whole] == kept[K:]   # each batch to its end, nothing more
  # The measured steps draw no more than the six batches hold (the first K steps fill the
  # pipeline unmeasured).
  assert sum(s["tokens"] for s in partial) <= sum(kept)
  for s in partial:
    # Every step queues a batch, whose first tokens come from its prefill; the loop's draws
    # each take an occupied slot-step.
    assert 0 < s["tokens"] and 0 <= s["fed"] <= s["slot_steps"] == SLOTS * s["iterations"]
    assert 0 <= s["staleness"][0] <= s["staleness"][1] <= K
  assert max(s["staleness"][1] for s in partial) >= 1     # some tokens do lag
  summary = benchmark_partial.summarise(partial)
  assert summary["steps"] == 4 and summary["staleness_max"] <= K
  assert summary["step_s"] == pytest.approx(np.mean([s["seconds"] for s in partial]))
  text = benchmark_partial.markdown({"environment": {}, "models": {"tiny": {
      "rows": PROMPTS * 8, "slots": SLOTS, "budget": N,
      "lengths": {"median": 3.0, "p90": 9.0, "max": 16},
      "whole": benchmark_partial.summarise(whole), "fixed": benchmark_partial.summarise(whole),
      "partial_k2": {**summary, "speedup_over_whole": 1.5, "speedup_over_fixed": 2.0}}}})
  assert "| partial_k2 |" in text and "1.50x / 2.00x" in text
