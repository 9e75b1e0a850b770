"""What a run reports: held-out accuracy while it trains, and its summary at the end.

  accuracy = evaluate(config, run, params)            # {bin name: greedy accuracy}
  metrics = eval_metrics(config, run, accuracy, before)
  summary = final_report(config, run, workdir, before, log)

The end of a run (process 0) writes the before/after table, report.png and report.html
(`report.write_report`) and summary.json.
"""

import json
import os

import ml_collections

from rl_curriculum import tasks as tasks_lib
from rl_curriculum.train import evaluation, report
from rl_curriculum.train.metrics import read_jsonl
from rl_curriculum.train.prepare import Prepared

__all__ = ["evaluate", "eval_metrics", "task_accuracy", "final_report"]


def evaluate(config: ml_collections.ConfigDict, run: Prepared, params) -> dict:
  """{bin name: greedy accuracy} over every held-out set."""
  tok = run.tokenizer
  return evaluation.accuracy_by_bin(run.model.graphdef, params, run.eval_sets, run.task,
                                    tok.decode, batch_size=config.eval.batch_size,
                                    max_new_tokens=config.rl.max_new_tokens, eos_id=tok.eos_id,
                                    pad_id=tok.pad_id, stop_ids=run.stop_ids)


def eval_metrics(config: ml_collections.ConfigDict, run: Prepared, accuracy: dict,
                 before: dict) -> dict:
  """`eval/acc/<bin>` of every held-out set; on several tasks (`MixtureTask`) also
  `eval/<task>/accuracy` and the skill balance `eval/skill/min_gain` and `eval/skill/spread`
  (`evaluation.skill_balance`, gains against `before`, the accuracies before RL)."""
  metrics = {f"eval/acc/{k}": v for k, v in accuracy.items()}
  if isinstance(run.task, tasks_lib.MixtureTask):
    now, start = task_accuracy(config, run, accuracy), task_accuracy(config, run, before)
    metrics.update({f"eval/{t}/accuracy": v for t, v in now.items()})
    metrics.update({f"eval/skill/{k}": v
                    for k, v in evaluation.skill_balance(now, start).items()})
  return metrics


def task_accuracy(config: ml_collections.ConfigDict, run: Prepared, accuracy: dict) -> dict:
  """{task: accuracy} of a mixture's training tasks from per-bin accuracies (weighted by the bins'
  held-out sizes, `evaluation.task_accuracy`)."""
  return evaluation.task_accuracy(accuracy, run.held_out_sizes,
                                  [run.task.bin_names[b] for b in config.task.train_bins])


def final_report(config: ml_collections.ConfigDict, run: Prepared, workdir: str, before: dict,
                 log) -> dict:
  """Before/after table, report.png/html and summary.json of a finished run (process 0)."""
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  after = {k[len("eval/acc/"):]: v for k, v in rows[-1].items() if k.startswith("eval/acc/")}
  # A bin is too small when its problem space, not the request, limits its held-out set.
  small = [name for name, n in run.held_out_sizes.items()
           if n < min(config.eval.min_held_out, config.task.eval_per_bin)]
  table = report.accuracy_table(before, after, ood=run.ood, sizes=run.held_out_sizes,
                                small=small)
  summary = {"before": before, "after": after, "ood_bins": run.ood, "steps": config.rl.steps,
             "held_out_sizes": run.held_out_sizes, "small_bins": small,
             "final_metrics": {k: v for k, v in rows[-1].items()
                               if isinstance(v, (int, float))}}
  if isinstance(run.task, tasks_lib.MixtureTask):
    tasks_before, tasks_after = (task_accuracy(config, run, before),
                                 task_accuracy(config, run, after))
    summary["tasks"] = {t: {"before": tasks_before[t], "after": tasks_after[t]}
                        for t in tasks_after}
    summary["skill_balance"] = evaluation.skill_balance(tasks_after, tasks_before)
  report.write_report(workdir, rows, bin_names=list(run.eval_sets),
                      arm_names=list(run.arm_names),
                      title=f"{config.task.name}: {config.rl.algorithm} + "
                            f"{config.curriculum.name}", table=table,
                      tasks=getattr(run.task, "task_names", ()))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  log("\nHeld-out greedy accuracy per bin (%):\n" + table)
  log(f"report: {os.path.join(workdir, 'report.png')}")
  return summary
