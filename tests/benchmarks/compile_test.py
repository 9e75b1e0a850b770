"""benchmarks/compile.py: the depth fit, the config it plans and its report."""

import math

import pytest

from benchmarks import compile as bench


def test_power_fit_recovers_a_power_law():
  depths = [2, 4, 8, 16]
  fit = bench.power_fit(depths, [3.0 * d ** 1.7 for d in depths])
  assert fit["a"] == pytest.approx(3.0) and fit["b"] == pytest.approx(1.7)
  with pytest.raises(ValueError, match="two depths"):
    bench.power_fit([4], [1.0])


def test_the_planned_config_is_the_run_config_with_the_presets_shape():
  config = bench.load_config("configs/quickstart.py", "smollm2_135m", scan=False)
  assert config.model.source == "" and config.model.preset == "smollm2_135m"
  assert config.model.scan_layers is False and config.model.lora_rank == 8


def test_markdown_states_the_extrapolation():
  prog = lambda s: {"compile_s": s, "peak_gib": 1.0}
  unrolled = {str(d): {"sampler": prog(1.0), "learn": prog(2.0 * d ** 2)} for d in (2, 4)}
  unrolled["1"] = {"sampler": prog(1.0), "learn": prog(7.0)}  # a fixed cost at small depth
  result = bench.summarise("c.py", "p", 8, 16, unrolled, {"sampler": prog(1.0), "learn": prog(8.0)})
  # Through the two deepest depths (2 and 4): t = 2 L^2, so 128 s at 8 layers.
  assert result["unrolled_fit"]["depths"] == [2, 4]
  assert math.isclose(result["unrolled_fit"]["learn"]["b"], 2.0)
  assert math.isclose(result["unrolled_extrapolated_s"]["learn"], 128.0)
  assert math.isclose(result["unrolled_over_scanned"]["learn"], 16.0)
  text = bench.markdown(result)
  assert "| unrolled | 4 | 1.0 | 32.0 | 1.00 |" in text and "| scanned | 8 |" in text
  assert "t = 2.00 L^2.00 s" in text and "about 128 s at 8 layers, 16x" in text
