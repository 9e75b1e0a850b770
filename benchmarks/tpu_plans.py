"""The SEC paper setting planned by XLA:TPU for the slices docs/scaling.md tabulates, each program's
bound beside its physical limit.

  python -m benchmarks.tpu_plans                              # v5e-8, v6e-8, v5p-8; 7B on v5p-32
  python -m benchmarks.tpu_plans --targets=v5e-8 --seven=     # one slice, no 7B
  python -m benchmarks.tpu_plans --recount                    # the saved plans' figures again

Compiles every program of a step of configs/sec_paper_countdown_qwen3b.py (Qwen2.5-3B) for each
`--targets` slice, and of the same config with `--config.model.preset=qwen2_5_7b` for each
`--seven` slice, on this CPU host (`planner.plan`, about 5 min a slice on 2 cores), and writes
each plan as JSON (qwen3b_T.json, qwen7b_T.json) and a table (README section, `markdown`): per
program the peak memory a chip and its roofline bound over its physical limit (the model's own
FLOPs and bytes at the chip's peaks, `report.physical`), the step's bound, limit and ratio, the
engine's layout, and the two efficiency ratios. Writes to --out_dir.
"""

import json
import os

from absl import app
from absl import flags

from benchmarks.speed import timing

FLAGS = flags.FLAGS
_PROGRAMS = ("select", "reshard", "prefill", "decode", "learn")


def plan_one(preset: str, target: str) -> dict:
  from configs import sec_paper_countdown_qwen3b as paper  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import planner  # pylint: disable=import-outside-toplevel
  config = paper.get_config()
  with config.unlocked():
    config.model.preset = preset
  return planner.plan(config, target=target)


def _cell(plan: dict, name: str) -> str:
  p = plan["programs"].get(name)
  if p is None:
    return "-"
  if "error" in p:
    return "does not fit"
  limit = plan["roofline"]["physical_s"].get(name)
  bound = p.get("bound_s", 0.0)
  ratio = f" ({bound / limit:.1f}x)" if limit else ""
  return f"{p['peak_gib']:.2f} / {bound:.3g} s{ratio}"


def row(label: str, plan: dict) -> str:
  r = plan["roofline"]
  layout = plan.get("rollout_mesh") or "learner's"
  if isinstance(layout, dict):
    layout = "x".join(str(v) for v in layout.values())
  num = lambda x, fmt: "-" if x is None else format(x, fmt)
  cells = [label, plan["target"], layout] + [_cell(plan, n) for n in _PROGRAMS] + [
      "yes" if plan["fits"] else "no", num(r["step_s"], ".1f"), num(r["step_limit_s"], ".1f"),
      num(r["step_ratio"], ".2f") + "x", num(r["decode_bytes_ratio"], ".2f") + "x",
      num(r["learn_flops_ratio"], ".2f") + "x"]
  return "| " + " | ".join(cells) + " |"


def markdown(plans: list) -> str:
  """The table of (model label, plan) pairs."""
  lines = ["| model | target | engine mesh (data x fsdp x tensor) | select | reshard | prefill | "
           "decode | learn | fits | step >= s | physical limit s | bound / limit | "
           "decode bytes / must | learn FLOPs / model |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | "
           "---: | ---: |"]
  lines += [row(label, plan) for label, plan in plans]
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  flags.DEFINE_list("targets", ["v5e-8", "v6e-8", "v5p-8"], "slices for Qwen2.5-3B")
  flags.DEFINE_list("seven", ["v5p-32"], "slices for Qwen2.5-7B")
  flags.DEFINE_string("out_dir", "benchmarks/results/tpu_plans/step", "where the results go")
  flags.DEFINE_bool("recount", False, "compile nothing: recompute each saved plan's bounds, "
                    "limits and ratios from its programs' rows (`report.roofline`)")


def main(argv):
  del argv
  from rl_curriculum.plan import report  # pylint: disable=import-outside-toplevel
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  plans = []
  for preset, label, names in (("qwen2_5_3b", "Qwen2.5-3B", FLAGS.targets),
                               ("qwen2_5_7b", "Qwen2.5-7B", FLAGS.seven)):
    for target in names:
      short = label.split("-")[1].lower()
      path = os.path.join(FLAGS.out_dir, f"qwen{short}_{target}.json")
      if FLAGS.recount:
        with open(path) as f:
          plan = json.load(f)
        plan["roofline"] = report.roofline(plan)
      else:
        timing.log(f"{label} on {target}")
        plan = plan_one(preset, target)
      with open(path, "w") as f:
        json.dump(plan, f, indent=1)
      plans.append((label, plan))
      timing.log(row(label, plan))
  with open(os.path.join(FLAGS.out_dir, "table.md"), "w") as f:
    f.write(markdown(plans))


if __name__ == "__main__":
  define_flags()
  app.run(main)
