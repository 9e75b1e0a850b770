"""How long the real-model path takes to compile, per block-stack layout and depth.

  python -m benchmarks.compile           # SmolLM2-135M shapes, ~5 min on 2 cores
  python -m benchmarks.compile --quick   # 1-2 layers, a smoke test

Compiles the run's programs (the sampler and the learn step, `rl_curriculum.plan.planner`: ahead
of time, from abstract shapes, no weights) for `--config` (default configs/quickstart.py,
SmolLM2-135M with LoRA on every projection) with the model's shape taken from its preset, in both
layouts of the block stack: scanned (one block with stacked [L, ...] weights under `lax.scan`)
at the model's full depth, and unrolled (L blocks in the program) at a ladder of depths. XLA's
compile time of an unrolled stack grows faster than linearly with depth (every forward and
backward pass of the learn step repeats every block), so the unrolled programs are fitted as
a * L^b through the two deepest depths of the ladder and extrapolated to the full depth; the
scanned ones are measured there. "sampler" is the configured engine's larger-peak program.

Writes benchmarks/results/compile_<name>.json and .md (`--out_dir`): per layout and depth, each
program's compile seconds and peak memory, the fit, and the ratio unrolled (extrapolated) /
scanned at full depth.
"""

import math
import time

from absl import app
from absl import flags
import numpy as np

FLAGS = flags.FLAGS

LADDER = (2, 4, 8, 16)
QUICK_LADDER = (1, 2)


def power_fit(depths, seconds) -> dict:
  """Least-squares fit of log t = log a + b log L: {"a", "b"} (b > 1: faster than linear)."""
  x, y = np.log(np.asarray(depths, np.float64)), np.log(np.asarray(seconds, np.float64))
  if x.size < 2:
    raise ValueError("power_fit needs at least two depths")
  b, log_a = np.polyfit(x, y, 1)
  return {"a": float(math.exp(log_a)), "b": float(b)}


def load_config(path: str, preset: str, scan: bool):
  """The run config at `path` with the model built from `preset`'s shape (no weights) and the
  block stack scanned or unrolled."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.model.source = ""
  config.model.preset = preset
  config.model.scan_layers = scan
  return config


def measure(config, layers: int, prompt_len: int) -> dict:
  """Compile seconds and peak GiB of each program at `layers` layers (`plan.plan`)."""
  from rl_curriculum.plan import planner as plan  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  report = plan.plan(config, hbm_gib=1e3, prompt_len=prompt_len, num_layers=layers)
  out = {name: {"compile_s": p["compile_s"], "peak_gib": p["peak_gib"]}
         for name, p in report["programs"].items()}
  out["wall_s"] = time.perf_counter() - t0
  return out


def run(config_path: str, preset: str, ladder, full_layers, prompt_len: int) -> dict:
  """Both layouts: unrolled at every depth of `ladder`, scanned at `full_layers`."""
  unrolled = {}
  for layers in ladder:
    unrolled[str(layers)] = measure(load_config(config_path, preset, False), layers, prompt_len)
    print(f"unrolled, {layers} layers: learn {unrolled[str(layers)]['learn']['compile_s']:.1f} s",
          flush=True)
  scanned = measure(load_config(config_path, preset, True), full_layers, prompt_len)
  print(f"scanned, {full_layers} layers: learn {scanned['learn']['compile_s']:.1f} s", flush=True)
  return summarise(config_path, preset, full_layers, prompt_len, unrolled, scanned)


def summarise(config_path, preset, full_layers, prompt_len, unrolled: dict, scanned: dict) -> dict:
  """The result record: the measurements, and the unrolled programs' compile time extrapolated
  to `full_layers` by `power_fit` over the two deepest measured depths (at small depths a fixed
  cost of some seconds hides the growth, so a fit over every depth would understate it)."""
  depths = sorted(int(l) for l in unrolled)[-2:]
  fits, extrapolated = {}, {}
  for program in ("sampler", "learn"):
    fits[program] = power_fit(depths, [unrolled[str(l)][program]["compile_s"] for l in depths])
    extrapolated[program] = fits[program]["a"] * full_layers ** fits[program]["b"]
  return {
      "config": config_path, "preset": preset, "full_layers": full_layers,
      "prompt_len": prompt_len, "unrolled": unrolled, "scanned": {str(full_layers): scanned},
      "unrolled_fit": {**fits, "depths": depths}, "unrolled_extrapolated_s": extrapolated,
      "unrolled_over_scanned": {p: extrapolated[p] / scanned[p]["compile_s"]
                                for p in ("sampler", "learn")},
  }


def markdown(result: dict) -> str:
  full = result["full_layers"]
  lines = [f"# Compile time of the real-model path: {result['preset']} ({result['config']})", "",
           f"Programs compiled ahead of time from abstract shapes (`rl_curriculum.plan.planner`), "
           f"prompt length {result['prompt_len']}; seconds of XLA compile, peak GiB from its "
           "memory analysis.", "",
           "| layout | layers | sampler compile s | learn compile s | learn peak GiB |",
           "|---|---|---|---|---|"]
  for layers, r in result["unrolled"].items():
    lines.append(f"| unrolled | {layers} | {r['sampler']['compile_s']:.1f} | "
                 f"{r['learn']['compile_s']:.1f} | {r['learn']['peak_gib']:.2f} |")
  s = result["scanned"][str(full)]
  lines.append(f"| scanned | {full} | {s['sampler']['compile_s']:.1f} | "
               f"{s['learn']['compile_s']:.1f} | {s['learn']['peak_gib']:.2f} |")
  fit, ext = result["unrolled_fit"]["learn"], result["unrolled_extrapolated_s"]["learn"]
  lines += ["", f"Unrolled learn step: t = {fit['a']:.2f} L^{fit['b']:.2f} s through its two "
            f"deepest measured depths, so about {ext:.0f} s at {full} layers, "
            f"{result['unrolled_over_scanned']['learn']:.0f}x the scanned one's "
            f"{s['learn']['compile_s']:.1f} s (sampler: "
            f"{result['unrolled_over_scanned']['sampler']:.1f}x)."]
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_bool("quick", False, "1 and 2 layers only (a smoke test)")
  flags.DEFINE_string("out_dir", "benchmarks/results", "where the results go")
  flags.DEFINE_string("config", "configs/quickstart.py", "run config file")
  flags.DEFINE_string("preset", "smollm2_135m", "the model preset whose shape is planned")
  flags.DEFINE_integer("prompt_len", 64, "prompt tokens per row (chat prompts: ~50)")


def main(argv):
  del argv
  from benchmarks.speed import timing  # pylint: disable=import-outside-toplevel
  from rl_curriculum.model.config import PRESETS  # pylint: disable=import-outside-toplevel
  full = 2 if FLAGS.quick else PRESETS[FLAGS.preset]().num_layers
  ladder = QUICK_LADDER if FLAGS.quick else LADDER
  result = run(FLAGS.config, FLAGS.preset, ladder, full, FLAGS.prompt_len)
  timing.write_results(FLAGS.out_dir, f"compile_{FLAGS.preset}", result, markdown(result))


if __name__ == "__main__":
  define_flags()
  app.run(main)
