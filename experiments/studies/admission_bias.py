"""Which arms a run trains on, against which it selected: the bias of dropping late groups.

  python -m experiments.studies.admission_bias --runs=workdirs/compare_async/scratch \
      --methods=uniform+k1+b6,uniform+k1+b6+drop \
      --arms=add_1d_1d,add_2d_1d,add_2d_2d,sub_2d_2d,mul_1d_1d,mul_2d_1d

Reads the run folders of a comparison (`experiments.studies.compare_curricula`, one per method and
seed) and, per method, each arm's share of the groups selected (the batches' `curriculum/arm_frac`,
every batch's S groups) against its share of the groups trained (`curriculum/arm_trained`, the
groups that entered the loss), over every step and seed. With `wait` admission every selected
group is trained, so the two shares agree; with `drop` a group whose rows have not all stopped
when its step comes is discarded, and arms with long completions lose share to arms with short
ones. Writes benchmarks/results/admission_bias.{json,md} (`--out_dir`).
"""

import glob
import os

from absl import app
from absl import flags
import numpy as np

from benchmarks.speed import timing

FLAGS = flags.FLAGS


def arm_counts(rows: list, name: str) -> np.ndarray:
  """f64[steps, K] of the metric `name`/<arm> over the rows (steps) of a run."""
  arms = sorted(int(k.rsplit("/", 1)[1]) for k in rows[0] if k.startswith(name + "/"))
  return np.asarray([[row[f"{name}/{k}"] for k in arms] for row in rows], np.float64)


def shares(folders: list) -> dict:
  """Per-arm shares selected and trained (%) over the runs in `folders`, and the groups."""
  from rl_curriculum.train.report.metrics import read_jsonl  # pylint: disable=import-outside-toplevel
  selected = trained = None
  dropped = groups = 0.0
  for folder in folders:
    rows = [r for r in read_jsonl(os.path.join(folder, "metrics.jsonl")) if r["step"] >= 1]
    chosen = arm_counts(rows, "curriculum/arm_frac").sum(axis=0)  # every batch: S groups
    kept = arm_counts(rows, "curriculum/arm_trained").sum(axis=0)
    selected = chosen if selected is None else selected + chosen
    trained = kept if trained is None else trained + kept
    dropped += sum(r.get("rollout/groups_dropped", 0.0) for r in rows)
    groups += sum(r.get("rollout/groups_dropped", 0.0) + r["groups_trained"] for r in rows)
  return {"selected_pct": (100 * selected / selected.sum()).tolist(),
          "trained_pct": (100 * trained / max(trained.sum(), 1)).tolist(),
          "difference_pct": (100 * trained / max(trained.sum(), 1)
                             - 100 * selected / selected.sum()).tolist(),
          "dropped_frac": dropped / max(groups, 1), "runs": len(folders)}


def markdown(results: dict) -> str:
  names = results["arms"]
  lines = ["# Admission of late groups: share of groups trained against share selected, per arm",
           "", f"Runs: `{results['runs']}`; written by "
           "`python -m experiments.studies.admission_bias`. "
           "Percent of the groups; trained - selected in points.", "",
           "| method | runs | dropped | " + " | ".join(names) + " |",
           "|---|---|---|" + "---|" * len(names)]
  for method, r in results["methods"].items():
    cells = [f"{s:.1f} -> {t:.1f} ({d:+.1f})" for s, t, d in
             zip(r["selected_pct"], r["trained_pct"], r["difference_pct"])]
    lines.append(f"| {method} | {r['runs']} | {100 * r['dropped_frac']:.1f}% | "
                 + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_string("runs", "workdirs/compare_async/scratch", "a comparison's run folders")
  flags.DEFINE_list("methods", ["uniform+k1+b6", "uniform+k1+b6+drop"], "methods to read")
  flags.DEFINE_list("arms", [], "the arms' names, in arm order (default: their indices)")
  flags.DEFINE_string("out_dir", "benchmarks/results", "where the results go")


def main(argv):
  del argv
  methods = {}
  for method in FLAGS.methods:
    folders = sorted(glob.glob(os.path.join(FLAGS.runs, f"{method}_lr*_s*")))
    folders = [f for f in folders if os.path.exists(os.path.join(f, "compare.json"))]
    if not folders:
      raise app.UsageError(f"no finished run of {method!r} in {FLAGS.runs}")
    methods[method] = shares(folders)
  arms = len(next(iter(methods.values()))["selected_pct"])
  results = {"runs": FLAGS.runs, "arms": list(FLAGS.arms) or [str(k) for k in range(arms)],
             "methods": methods}
  timing.write_results(FLAGS.out_dir, "admission_bias", results, markdown(results))


if __name__ == "__main__":
  define_flags()
  app.run(main)
