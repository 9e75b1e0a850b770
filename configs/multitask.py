"""Several domains in one run: Countdown, Zebra puzzles and ARC-1D, a tiny model from scratch.

  python -m experiments.train --config configs/multitask.py --workdir workdirs/multitask

What it does: one pool holds the three tasks' problems in eight (task, difficulty) bins: countdown
with 3, 4 and 5 source numbers, zebra puzzles of 2x2 and 2x3 houses x attributes, and three
ARC-1D rule families on rows of 10 cells. The tokenizer (BPE) and a ~3M-parameter transformer are
trained here on all of them (SFT warm start), then RLOO trains with SEC over the eight bins as its
arms (the (task, difficulty) arms of the Self-Evolving Curriculum's multi-domain runs). Each
problem is scored by its own task's verifier. Held-out greedy accuracy is logged per bin
(`eval/acc/<task>/<bin>`), per task (`eval/<task>/accuracy`, over the task's held-out problems)
and as skill balance (`eval/skill/min_gain`: the smallest gain of a task since the warm start;
`eval/skill/spread`: the largest minus the smallest task accuracy); report.png draws the tasks'
curves and the curriculum's mass per task.

Overrides: --config.curriculum.arms=task (SEC over the three tasks)
  --config.curriculum.name=uniform --config.curriculum.options={}
"""

import ml_collections

from configs import scratch
from rl_curriculum.tasks import get_task

TASK = "countdown+zebra+arc1d"
BINS = ("countdown/n3", "countdown/n4", "countdown/n5",
        "zebra/2x2", "zebra/2x3",
        "arc1d/move_10", "arc1d/fill_10", "arc1d/mirror_10")


def bins(names) -> tuple:
  """The mixture bins (indices) of "task/bin" names."""
  mixture = get_task(TASK)
  return tuple(mixture.bin_names.index(name) for name in names)


def get_config() -> ml_collections.ConfigDict:
  c = scratch.get_config()
  c.task.name = TASK                # tasks joined by "+": one pool, each problem its task's
  c.task.train_bins = bins(BINS)    # the (task, difficulty) arms
  c.task.eval_bins = bins(BINS)     # held-out prompts of the same bins (never trained on)
  c.task.train_per_bin = 2000
  c.task.sft_per_bin = 2000
  c.task.eval_per_bin = 200
  c.task.options = {"arc1d": {"num_shots": 1}}  # one worked row: prompts of 84 tokens, not 174
  c.tokenizer.vocab_size = 512      # the three tasks' words (BPE: whole words, single digits)
  c.tokenizer.model_type = "bpe"
  # A short warm start on purpose: after 900 steps the ARC rules sit at 70% (room for RL to
  # help); after 1,500 they were at 93-95% and uniform RL moved them by 3 points.
  c.sft.steps = 900
  c.sft.batch_size = 32
  c.rl.max_new_tokens = 22          # a 10-cell row is 20 tokens ("0 0 3 3 ..."), then EOS
  c.rl.prompts_per_step = 16
  c.rl.steps = 100                  # 100 x 16 prompts x 8 completions = 12,800 rollouts
  c.eval.every = 20
  c.eval.batch_size = 256
  c.checkpoint.every = 50
  return c
