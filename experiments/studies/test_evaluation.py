"""The test split of a finished comparison run: its last checkpoint's greedy outcome on every test
problem, evaluated once, after the learning rates were chosen on the validation sets.

  outcomes = test_evaluation.evaluate_run(run_config, folder, per_bin=700)

A comparison's runs evaluate on the validation half of the held-out prompts
(`task.held_out_split = "validation"`); the test half (`data.held_out_part`) is drawn here, for
the run's training and evaluation bins, `per_bin` problems each, and read by nothing that makes a
choice. The outcomes go to `comparison_stats.test_outcomes_path(folder, step)` in the format of
`summary.write_outcomes`; a run already evaluated at its last step is read back, not evaluated
again. Every run of a setting answers the same test problems: they depend on the task, the bins,
the held-out fraction and `per_bin` only.
"""

import os
from typing import Callable

import ml_collections

from experiments.studies import comparison_stats
from rl_curriculum.train import loop
from rl_curriculum.train.report import evaluation
from rl_curriculum.train.report import summary as run_summary
from rl_curriculum.train.setup import data, prepare

__all__ = ["test_sets", "evaluate_run"]


def test_sets(config: ml_collections.ConfigDict, task, per_bin: int) -> dict:
  """{bin: [Problem]} the test sets of a run of `config`: `per_bin` problems of the test half of
  the held-out prompts in each evaluation bin (`data.held_out_sets`, part "test")."""
  sets, _ = data.held_out_sets(task, tuple(config.task.train_bins), tuple(config.task.eval_bins),
                               per_bin, config.task.held_out_fraction, part="test")
  return sets


def evaluate_run(config: ml_collections.ConfigDict, folder: str, per_bin: int,
                 log: Callable[[str], None] = print) -> dict:
  """{bin name: (correct bool[n], formatted bool[n])} of the run in `folder` (made with `config`)
  on its test sets, its last RL checkpoint answering greedily; written to, or read back from,
  `comparison_stats.test_outcomes_path(folder, step)`.

  Raises:
    ValueError: `config` keeps validation and test sets together (task.held_out_split is not
      "validation"): its runs would have chosen on the test problems, or `per_bin` < 1.
  """
  if config.task.held_out_split != "validation":
    raise ValueError("a test split is for runs that evaluate on the validation split: set "
                     f"task.held_out_split = 'validation' (got {config.task.held_out_split!r})")
  if per_bin < 1:
    raise ValueError(f"per_bin must be >= 1, got {per_bin}")
  run = prepare.prepare(config, folder, log=lambda _: None)
  step, params = loop.restore_params(config, run, folder)
  path = comparison_stats.test_outcomes_path(folder, step)
  done = run_summary.read_outcomes(path)
  if done is not None:
    return done
  tok = run.tokenizer
  sets = data.eval_pools(test_sets(config, run.task, per_bin), run.task, tok,
                         template=config.task.template)
  outcomes = evaluation.outcomes_by_bin(
      run.model.graphdef, params, sets, run.task, tok.decode, batch_size=config.eval.batch_size,
      max_new_tokens=config.rl.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
      stop_ids=run.stop_ids)
  run_summary.write_outcomes(path, outcomes)
  log(f"{os.path.basename(folder)}: test split at step {step}, "
      + ", ".join(f"{name} {100 * c.mean():.1f}%" for name, (c, _) in outcomes.items()))
  return outcomes
