"""`python -m benchmarks.speed --quick` on the tiny model, no peers: sane values."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_quick_benchmark_writes_sane_results(tmp_path):
  subprocess.run([sys.executable, "-m", "benchmarks.speed", "--quick", "--peers=",
                  f"--out_dir={tmp_path}", f"--weights_dir={tmp_path / 'weights'}"],
                 cwd=ROOT, check=True, capture_output=True, text=True)
  results = json.load(open(tmp_path / "speed_cpu.json"))
  assert (tmp_path / "speed_cpu.md").read_text().startswith("# Speed on CPU")
  assert (tmp_path / "weights" / "tiny" / "config.json").exists()
  env = results["environment"]
  assert env["affinity"] and set(env["affinity"]) <= set(range(os.cpu_count()))
  peak = results["matmul_peak_gflops"]["jax_best"]
  assert 0.1 < peak < 1e5  # GFLOP/s of a CPU
  tiny = results["models"]["tiny"]
  settings = results["settings"]
  for b in map(str, settings["batches"]):
    row = tiny["sampler"]["ours"][b]
    for key in ("prefill_tok_s", "decode_tok_s", "new_tok_s"):
      assert row[key] > 0 and math.isfinite(row[key])
    # new tokens over the whole call: slower than decode alone, consistent with the seconds.
    assert row["new_tok_s"] < row["decode_tok_s"]
    assert math.isclose(row["new_tok_s"] * row["seconds"], int(b) * settings["new_tokens"],
                        rel_tol=1e-6)
  p, g = settings["learn_prompts"], settings["learn_group"]
  for mode in ("full", "lora"):
    learn = tiny["learn"][mode]
    assert learn["tokens"] == p * g * (settings["prompt_len"] + settings["new_tokens"])
    assert learn["tok_s"] > 0 and learn["loss_finite"]
    assert 0.0 < learn["mfu"] <= 1.0
    assert tiny["ratios"][f"learn_{mode}_mfu"] == learn["mfu"]
  # Full fine-tuning counts 3 forward passes of model FLOPs, LoRA 2.
  assert math.isclose(tiny["learn"]["full"]["model_flops"] / tiny["learn"]["lora"]["model_flops"],
                       1.5)
  step = tiny["rl_step"]
  assert step["seconds"] > 0 and step["sample_s"] > 0 and step["learn_s"] > 0
  # No peer ran: no ratio against one, and no target claims to be met against one.
  assert not [k for k in tiny["ratios"] if "_vs_" in k]
  for target in results["targets"]:
    if "_vs_" in target["key"]:
      assert target["value"] is None and target["met"] is None
  e2e = results["end_to_end"]
  assert math.isclose(e2e["sample_frac"] + e2e["score_frac"] + e2e["learn_frac"], 1.0)
  overhead = results["curriculum"][0]
  assert overhead["arms"] == 6 and 0 < overhead["fraction_of_step"] < 1
