"""The scratch setting at toy size, for tests and smoke runs (about a minute on a 2-core CPU).

  python -m experiments.train --config configs/toy.py --workdir /tmp/toy

Nothing is learned at this size: 10 SFT steps, 4 RL steps of 4 prompts x 4 completions. It runs
every phase (tokenizer, SFT cache, RL, evaluation, checkpoints, report) quickly, which is what the
end-to-end, resume and multi-process tests need.
"""

from configs import scratch


def get_config():
  c = scratch.get_config()
  c.task.train_bins = (0, 1, 2)
  c.task.eval_bins = (0, 2, 8)      # 8 (three-digit sums) is out of distribution
  c.task.train_per_bin = 40
  c.task.sft_per_bin = 40
  c.task.eval_per_bin = 8
  c.sft.steps = 10
  c.sft.batch_size = 16
  c.rl.steps = 4
  c.rl.prompts_per_step = 4
  c.rl.group_size = 4
  c.rl.max_new_tokens = 4
  c.eval.every = 2
  c.eval.batch_size = 8
  c.checkpoint.every = 1
  c.model.scan_layers = True       # one block to compile, not four: most of a short run's time
  return c
