"""benchmarks/overlap.py: the sampler and the learner as two `jax.distributed`
processes train what the one-process pipeline with k = 1 trains (the same batches, each sampled
by the weights one update older than those that learn from it), and the summary reads them."""


import jax
import numpy as np
import pytest

from benchmarks import overlap as benchmark_overlap
from rl_curriculum.train.setup import prepare
import test_util

STEPS = 3


@pytest.mark.slow
def test_two_processes_train_as_the_one_process_pipeline_with_k1(tmp_path):
  config = benchmark_overlap.model_config("toy", STEPS)
  warm = test_util.shared_warm_start(config)
  overlapped = str(tmp_path / "overlap")
  test_util.copy_warm_start(warm, overlapped)
  times = benchmark_overlap.run_overlap("toy", STEPS, overlapped)
  assert len(times["step_s"]) == STEPS and min(times["sample_s"]) > 0
  piped = config.copy_and_resolve_references()
  piped.rl.max_staleness = 1
  piped.rl.off_policy_correction = "none"  # as the two processes train: the schedule is compared
  rows = test_util.run_rl(piped, str(tmp_path / "pipeline"))
  assert [r["staleness_max"] for r in rows] == [0, 1, 1]
  run = prepare.prepare(config, warm, log=lambda _: None)
  two = benchmark_overlap.final_policy(config, run, overlapped, True)
  one = benchmark_overlap.final_policy(piped, run, str(tmp_path / "pipeline"), False)
  start = jax.tree.leaves(run.model.trainable)
  moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(jax.tree.leaves(one), start))
  assert moved > 1e-6
  for a, b in zip(jax.tree.leaves(two), jax.tree.leaves(one), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_markdown_reports_both_ways_and_the_paired_difference():
  way = lambda s: {"step_s": s, "steps_per_s": 1 / s, "sample_s": 0.1, "heldout": 0.5}
  text = benchmark_overlap.markdown({"environment": {}, "models": {"tiny": {
      "rollouts": 1280, "sync": {**way(0.5), "learn_s": 0.3}, "overlap": way(0.4),
      "speedup": 1.25, "heldout_difference": {"mean": 0.01, "lo": -0.02, "hi": 0.04}}}})
  assert "| tiny | 1,280 | sync | 0.500 | 2.00 | 0.100 | 0.300 | 50.0 |" in text
  assert "| tiny | 1.25x | +1.0 [-2.0, +4.0] |" in text


def test_pod_estimate_by_hand():
  plan = {"devices": 8, "model": {"params": 1e9, "remat": "none"},
          "workload": {"rows": 100, "prompts": 10, "prompt_len": 20, "minibatches": 1},
          "programs": {"learn": {"peak_gib": 12.0}},
          "sampler_engines": {"continuous": {"cache_gib": 0.5}}}
  e = benchmark_overlap.pod_estimate(plan, 16, 50, learn_mfu=0.5, decode_mfu=0.2,
                                     mean_new_tokens=40)
  peak = benchmark_overlap.POD_CHIP["tflops"] * 1e12
  tokens = 100 * 40 + 10 * 20
  assert e["learn_s"] == pytest.approx(6 * 1e9 * tokens / (16 * peak * 0.5))
  iteration = max(2e9 * 50 / (16 * peak * 0.2),
                  (2e9 + 0.5 * 2 ** 30 * 8 / 2) / (16 * 819e9))
  prefill = 2e9 * 10 * 20 / (16 * peak * 0.5)
  assert e["sample_s"] == pytest.approx(100 * 40 / 50 * iteration + prefill)
  assert e["learner_chips"] == 6   # 12 GiB on 8 devices is 96 GiB: 6 chips of 16 GiB
  assert e["split_s"] == pytest.approx(max(e["split_sample_s"], e["split_learn_s"]))
  assert e["speedup"] == pytest.approx(e["sync_s"] / e["split_s"])
