"""The test split of a finished comparison run: its last checkpoint's greedy outcome on every test
problem, evaluated once, after the learning rates were chosen on the validation sets.

  outcomes = test_evaluation.evaluate_run(run_config, folder, per_bin=700, extra_bins=(5,))

A comparison's runs evaluate on the validation half of the held-out prompts
(`task.held_out_split = "validation"`); the test half (`data.held_out_part`) is drawn here, for
the run's training and evaluation bins, `per_bin` problems each, and read by nothing that makes a
choice. The outcomes go to `comparison_stats.test_outcomes_path(folder, step)` in the format of
`summary.write_outcomes`; a run already evaluated at its last step is read back, not evaluated
again. Every run of a setting answers the same test problems: they depend on the task, the bins,
the held-out fraction and `per_bin` only.

`extra_bins` are evaluation-only bins of the task that the runs never evaluated (not in
`task.eval_bins`) and that the test split adds: an out-of-distribution bin chosen after the runs
started, from the warm start alone, is measured here without touching the runs. A run evaluated
before a bin was added is evaluated on that bin only, and its file keeps every earlier outcome.
"""

import os
from typing import Callable, Sequence

import ml_collections

from experiments.studies import comparison_stats
from rl_curriculum.train import loop
from rl_curriculum.train.report import evaluation
from rl_curriculum.train.report import summary as run_summary
from rl_curriculum.train.setup import data, prepare

__all__ = ["test_sets", "evaluate_run"]


def test_sets(config: ml_collections.ConfigDict, task, per_bin: int,
              extra_bins: Sequence[int] = ()) -> dict:
  """{bin: [Problem]} the test sets of a run of `config`: `per_bin` problems of the test half of
  the held-out prompts in each evaluation bin and each of `extra_bins` (`data.held_out_sets`,
  part "test").

  Raises:
    ValueError: one of `extra_bins` is already an evaluation bin or is not evaluation-only.
  """
  extra = tuple(int(b) for b in extra_bins)
  bad = [b for b in extra if b in config.task.eval_bins or b not in task.eval_only_bins]
  if bad:
    raise ValueError(f"extra test bins {bad} must be evaluation-only bins of the task "
                     f"{tuple(task.eval_only_bins)} that the runs do not evaluate "
                     f"(task.eval_bins {tuple(config.task.eval_bins)})")
  sets, _ = data.held_out_sets(task, tuple(config.task.train_bins),
                               tuple(config.task.eval_bins) + extra, per_bin,
                               config.task.held_out_fraction, part="test")
  return sets


def evaluate_run(config: ml_collections.ConfigDict, folder: str, per_bin: int,
                 log: Callable[[str], None] = print, extra_bins: Sequence[int] = ()) -> dict:
  """{bin name: (correct bool[n], formatted bool[n])} of the run in `folder` (made with `config`)
  on its test sets (`test_sets`, with `extra_bins`), its last RL checkpoint answering greedily;
  written to, or read back from, `comparison_stats.test_outcomes_path(folder, step)`. Bins already
  in that file are read back, not evaluated again.

  Raises:
    ValueError: `config` keeps validation and test sets together (task.held_out_split is not
      "validation"): its runs would have chosen on the test problems; `per_bin` < 1; a bad
      extra bin (`test_sets`); or the file holds a bin with another number of problems.
  """
  if config.task.held_out_split != "validation":
    raise ValueError("a test split is for runs that evaluate on the validation split: set "
                     f"task.held_out_split = 'validation' (got {config.task.held_out_split!r})")
  if per_bin < 1:
    raise ValueError(f"per_bin must be >= 1, got {per_bin}")
  run = prepare.prepare(config, folder, log=lambda _: None)
  step, params = loop.restore_params(config, run, folder)
  path = comparison_stats.test_outcomes_path(folder, step)
  problems = test_sets(config, run.task, per_bin, extra_bins)
  names = {b: run.task.bin_names[b] for b in problems}
  done = run_summary.read_outcomes(path) or {}
  wrong = [names[b] for b, ps in problems.items()
           if names[b] in done and len(done[names[b]][0]) != len(ps)]
  if wrong:
    raise ValueError(f"{path} holds {wrong} with another number of problems than per_bin "
                     f"{per_bin} gives: evaluate with the per_bin it was made with")
  todo = {b: ps for b, ps in problems.items() if names[b] not in done}
  if not todo:
    return {names[b]: done[names[b]] for b in problems}
  tok = run.tokenizer
  sets = data.eval_pools(todo, run.task, tok, template=config.task.template)
  new = evaluation.held_out(run.model.graphdef, params, sets, run.task, tok,
                           **run_summary.held_out_options(config, run)).outcomes
  merged = {**done, **new}
  run_summary.write_outcomes(path, merged)
  log(f"{os.path.basename(folder)}: test split at step {step}, "
      + ", ".join(f"{name} {100 * c.mean():.1f}%" for name, (c, _) in new.items()))
  return {names[b]: merged[names[b]] for b in problems}
