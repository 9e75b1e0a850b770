"""What a run reports: held-out accuracy while it trains, and its summary at the end.

  accuracy = evaluate(config, run, params, record=outcomes_path(workdir, step))
  metrics = eval_metrics(config, run, accuracy, before)
  summary = final_report(config, run, workdir, before, log)

Every evaluation of a run also keeps each held-out problem's outcome (right, and whether the
answer parsed) in workdir/heldout/step_<N>.npz, so that runs on the same problems are compared
problem by problem (`paired`), the first few episodes of each set written out (question, each
turn, the reply after it, rewards) in step_<N>_transcripts.json, and for episodes of several
turns each set's episode statistics in step_<N>_episodes.json. The end of a run (process 0) writes the before/after table with
paired 95% intervals, report.png and report.html (`figures.write_report`) and summary.json.
"""

import json
import os
from typing import Mapping, Optional

import ml_collections
import numpy as np

from rl_curriculum import tasks as tasks_lib
from rl_curriculum.train.durable import checkpointing
from rl_curriculum.train.report import evaluation, paired, figures
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.train.rollout import episode_steps, episodes
from rl_curriculum.train.setup.prepare import Prepared

__all__ = ["evaluate", "eval_metrics", "eval_line", "task_accuracy", "final_report", "finished",
           "outcomes_path", "write_outcomes", "read_outcomes"]


TRANSCRIPTS = 4  # episodes of each held-out set an evaluation writes out


def held_out_options(config: ml_collections.ConfigDict, run: Prepared) -> dict:
  """`evaluation.held_out`'s keyword arguments for the run: its episodes' framing, bounds (the
  largest horizon) and turn width, the evaluation batch, the engine's slots and pages."""
  tok = run.tokenizer
  return dict(framing=run.framing, limits=episode_steps.limits(config, config.rl.max_turns),
              width=episode_steps.turn_width(config, run.task),
              batch_size=config.eval.batch_size, slots=config.rl.decode_slots,
              page_size=config.rl.page_size,
              stop_ids=tuple(dict.fromkeys((tok.eos_id, *run.stop_ids))), pad_id=tok.pad_id)


def evaluate(config: ml_collections.ConfigDict, run: Prepared, params,
             record: Optional[str] = None) -> dict:
  """{bin name: greedy accuracy} over every held-out set (`evaluation.held_out`: each problem's
  greedy episode); with `record` (a path, given on the main process) each problem's outcome is
  also written there (`write_outcomes`), with transcripts of the first few episodes of each set
  and, for episodes of several turns, their statistics beside it."""
  held = evaluation.held_out(run.model.graphdef, params, run.eval_sets, run.task, run.tokenizer,
                             transcripts=TRANSCRIPTS if record is not None else 0,
                             **held_out_options(config, run))
  if record is not None:
    write_outcomes(record, held.outcomes)
    _write_json(record, "transcripts", held.transcripts)
    if episode_steps.turn_width(config, run.task) > 1:
      _write_json(record, "episodes", {name: episodes.episode_stats(p, np.ones(len(p.turns), bool))
                                       for name, p in held.played.items()})
  return evaluation.accuracy(held.outcomes)


def _write_json(record: str, kind: str, value) -> None:
  """`value` as JSON beside an evaluation's outcomes (`record`, .npz): `<record>_<kind>.json`."""
  os.makedirs(os.path.dirname(record), exist_ok=True)
  with open(record[:-len(".npz")] + f"_{kind}.json", "w") as f:
    json.dump(value, f, indent=1, sort_keys=True)


def outcomes_path(workdir: str, step: int) -> str:
  """Where the evaluation after RL step `step` (0: before RL) keeps its per-problem outcomes."""
  return os.path.join(workdir, "heldout", f"step_{step}.npz")


def write_outcomes(path: str, outcomes: Mapping[str, tuple]) -> None:
  """Writes {bin name: (correct bool[n], formatted bool[n])} to `path` (.npz), whole or not at
  all (a temporary file renamed into place): bin names, their sizes and the outcomes end to
  end."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  names = list(outcomes)
  tmp = path + ".tmp.npz"
  np.savez(tmp, bins=np.array(names, dtype=str),
           sizes=np.array([len(outcomes[n][0]) for n in names], np.int64),
           correct=np.concatenate([outcomes[n][0] for n in names]).astype(bool),
           formatted=np.concatenate([outcomes[n][1] for n in names]).astype(bool))
  os.replace(tmp, path)


def read_outcomes(path: str) -> Optional[dict]:
  """`write_outcomes`' {bin name: (correct, formatted)}, or None when `path` does not exist."""
  if not os.path.exists(path):
    return None
  with np.load(path) as f:
    ends = np.cumsum(f["sizes"])
    starts = ends - f["sizes"]
    return {str(name): (f["correct"][a:b], f["formatted"][a:b])
            for name, a, b in zip(f["bins"], starts, ends)}


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


def eval_line(step: int, accuracy: Mapping[str, float], before: Mapping[str, float],
              ood=()) -> str:
  """One console line of an evaluation during training: each bin's held-out greedy accuracy and
  its change since before RL, out-of-distribution bins tagged."""
  parts = [f"{name}{' (ood)' if name in ood else ''} {100 * a:.1f}% "
           f"({100 * (a - before.get(name, a)):+.1f})" for name, a in accuracy.items()]
  return f"step {step} held-out greedy accuracy (change since step 0): " + ", ".join(parts)


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
  trained = [run.task.bin_names[b] for b in config.task.train_bins]
  changes, sources = paired_changes(read_outcomes(outcomes_path(workdir, 0)),
                                    read_outcomes(outcomes_path(workdir, config.rl.steps)), trained)
  table = figures.accuracy_table(before, after, ood=run.ood, sizes=run.held_out_sizes,
                                small=small, changes=changes)
  if sources is not None:
    table += "\n" + figures.gain_sources_line(sources)
  summary = {"before": before, "after": after, "ood_bins": run.ood, "steps": config.rl.steps,
             "held_out_sizes": run.held_out_sizes, "small_bins": small,
             "paired_change": changes, "gain_sources": sources, "table": table,
             "final_metrics": {k: v for k, v in rows[-1].items()
                               if isinstance(v, (int, float))}}
  if isinstance(run.task, tasks_lib.MixtureTask):
    tasks_before, tasks_after = (task_accuracy(config, run, before),
                                 task_accuracy(config, run, after))
    summary["tasks"] = {t: {"before": tasks_before[t], "after": tasks_after[t]}
                        for t in tasks_after}
    summary["skill_balance"] = evaluation.skill_balance(tasks_after, tasks_before)
  figures.write_report(workdir, rows, bin_names=list(run.eval_sets),
                      arm_names=list(run.arm_names),
                      title=f"{config.task.name}: {config.rl.algorithm} + "
                            f"{config.curriculum.name}", table=table,
                      tasks=getattr(run.task, "task_names", ()))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  log("\nHeld-out greedy accuracy per bin (%; the change's 95% interval is paired per "
      "problem):\n" + table)
  log(f"report: {os.path.join(workdir, 'report.png')}")
  return summary


def paired_changes(before: Optional[dict], after: Optional[dict],
                   trained) -> tuple[Optional[dict], Optional[dict]]:
  """({bin name: `paired.paired_difference` of after against before}, `paired.gain_sources` over
  the held-out sets of the bins named in `trained`, the ones RL trains on; all of them if none is
  evaluated) from the per-problem outcomes of the evaluations before and after RL; (None, None)
  when either is missing (a run folder from before outcomes were kept) or their problems differ."""
  if before is None or after is None or any(
      b not in after or len(after[b][0]) != len(before[b][0]) for b in before):
    return None, None
  changes = {b: paired.paired_difference(after[b][0], before[b][0]) for b in before}
  trained = [b for b in before if b in trained] or list(before)
  cat = lambda d, i: np.concatenate([d[b][i] for b in trained])
  return changes, paired.gain_sources(cat(before, 0), cat(after, 0), cat(before, 1))


def finished(config: ml_collections.ConfigDict, workdir: str) -> Optional[dict]:
  """The summary of a run in `workdir` that already ran all `config.rl.steps` RL steps, or None:
  its summary.json (written last) says so, metrics.jsonl ends at that step, and that step's
  checkpoint is there and intact (else the run resumes from an earlier one and steps on)."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return None  # a summary cut short: the run writes it again
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  if saved.get("steps") != config.rl.steps or not rows or rows[-1]["step"] != config.rl.steps:
    return None
  last = os.path.join(workdir, "checkpoints", str(config.rl.steps))
  if not os.path.isdir(last) or checkpointing.damage(last) is not None:
    return None
  return saved
