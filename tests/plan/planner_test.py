"""The planner (rl_curriculum/plan/planner.py): its numbers against a real step, its verdict, its
command line. Runs in subprocesses with fake CPU devices."""

import json
import os
import subprocess
import sys

import pytest

from rl_curriculum.train.setup import validation
import test_util

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _run(args, devices, timeout=600):
  env = test_util.device_env(devices, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("plan") / "plan.json")
  result = _run([os.path.join(HERE, "planner_script.py"), out], devices=4)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(out) as f:
    return json.load(f)


@pytest.mark.slow
def test_planned_arguments_match_the_buffers_a_real_step_keeps(measured):
  """What the planner says the learn step takes per device (train state and batch) is within 2x
  of the bytes JAX holds on one device around a real step with the same shapes and shardings,
  and its peak is at least that."""
  assert measured["loss_finite"]
  live = max(measured["live_before"], measured["live_after"])
  assert live / 2 <= measured["argument_bytes"] <= 2 * live
  assert measured["peak_bytes"] >= live


@pytest.mark.slow
def test_both_engines_are_planned_with_their_caches(measured):
  """The static engine's cache holds R x (Tp + N) slots, the continuous one's P x Tp prompt slots
  and S x N completion slots (TP 12, 8 prompts x 4 rows, N 8, 8 slots): the ratio of their
  planned caches is that of the slots."""
  engines = measured["report"]["sampler_engines"]
  for engine in ("static", "continuous"):
    for part in ("prefill", "decode"):
      assert engines[engine][part]["peak_gib"] > 0, (engine, part)
  p, g, tp, n, slots = 8, 4, 12, 8, 8
  ratio = engines["continuous"]["cache_gib"] / engines["static"]["cache_gib"]
  assert abs(ratio - (p * tp + slots * n) / (p * g * (tp + n))) < 1e-6


@pytest.mark.slow
def test_rollouts_in_flight_are_planned_with_every_generations_prompt_slots(measured):
  """With rl.max_staleness = 2 the engine holds three batches' prompts: W x P x Tp prompt slots
  and S x N completion slots, and its programs (admit, a step's run) are the run's sampler."""
  report = measured["in_flight"]
  engines = report["sampler_engines"]
  p, tp, n, slots, w = 8, 12, 8, 8, 3
  ratio = engines["in_flight"]["cache_gib"] / engines["continuous"]["cache_gib"]
  assert abs(ratio - (w * p * tp + slots * n) / (p * tp + slots * n)) < 1e-6
  assert report["programs"]["prefill"] == engines["in_flight"]["prefill"]
  assert report["programs"]["decode"] == engines["in_flight"]["decode"]
  assert (report["programs"]["prefill"]["program"],
          report["programs"]["decode"]["program"]) == ("inflight.admit", "continuous.run")


@pytest.mark.slow
def test_the_verdict_flips_at_the_planned_peak(measured):
  assert measured["fits_above"] is True
  assert measured["fits_below"] is False
  report = measured["report"]
  assert report["devices"] == 4 and report["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert list(report["programs"]) == ["select", "prefill", "decode", "learn"]
  for name in report["programs"]:
    p = report["programs"][name]
    for key in ("argument_gib", "output_gib", "temp_gib", "peak_gib", "compile_s"):
      assert p[key] >= 0, (name, key)
    assert p["peak_gib"] > 0


@pytest.mark.slow
def test_command_line_writes_json_and_rejects_a_bad_config(tmp_path):
  out = tmp_path / "plan.json"
  args = ["-m", "experiments.plan", "--config", "configs/toy.py", "--target", "cpu:2",
          "--hbm_gib", "16", "--prompt_len", "8", "--programs", "learn", "--out", str(out)]
  result = _run(args, devices=2)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "FITS" in result.stdout
  report = json.loads(out.read_text())
  assert report["fits"] is True and report["hbm_gib"] == 16 and report["devices"] == 2
  assert set(report["programs"]) == {"learn"}
  bad = _run(args[:-2] + ["--config.rl.microbatches=3"], devices=2)
  assert bad.returncode == 2 and "config.rl.microbatches" in bad.stderr


@pytest.mark.slow
def test_train_entrypoint_plans_without_a_workdir():
  result = _run(["-m", "experiments.train", "--config", "configs/toy.py", "--plan_only",
                 "--hbm_gib", "4", "--prompt_len", "8"], devices=1)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "learn" in result.stdout and result.stdout.strip().endswith("FITS")


def test_model_shape_reads_an_hf_config_json_and_rejects_a_folder_without_one(tmp_path):
  from configs import scratch  # pylint: disable=import-outside-toplevel
  from rl_curriculum.model import hf_io  # pylint: disable=import-outside-toplevel
  from rl_curriculum.model.config import PRESETS  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import planner as plan  # pylint: disable=import-outside-toplevel
  config = scratch.get_config()
  config.model.source = str(tmp_path)
  config.model.dtype = "bfloat16"
  config.model.scan_layers = True
  with pytest.raises(validation.ConfigError, match="config.model.source"):
    plan.model_shape(config)
  expected = PRESETS["qwen2_5_0_5b"]()
  (tmp_path / "config.json").write_text(json.dumps(hf_io.hf_config(expected, "qwen2")))
  shape = plan.model_shape(config)
  assert shape.num_params == expected.num_params and shape.num_layers == 24
  assert (shape.dtype, shape.param_dtype, shape.scan_layers) == ("bfloat16", "float32", True)
