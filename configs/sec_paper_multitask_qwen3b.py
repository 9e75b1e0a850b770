"""The SEC paper's multi-domain setting: Qwen2.5-3B on Countdown, Zebra puzzles and ARC-1D at once.

Chen et al. 2025, "Self-Evolving Curriculum for LLM Reasoning" (arXiv:2505.14970), train one
policy on the three reasoning domains together, with SEC's arms the (task, difficulty) pairs
("2-D SEC", Boltzmann temperature 0.2), and report better skill balance than random ordering.
Here: nine arms, three difficulty levels per task (countdown with 3, 4 and 5 source numbers;
zebra puzzles of 3x3, 4x3 and 4x4 houses x attributes; ARC-1D rows of 10 and 20 cells for the
move rule and 20 for mirror), 256 prompts x 8 completions a step, each problem scored by its own
task's verifier, held-out accuracy per task and the skill balance (`eval/skill/min_gain`,
`eval/skill/spread`) logged at every evaluation. Launch (docs/scaling.md):

  # 8-GPU host, one process, FSDP over the 8 GPUs:
  python -m experiments.train --config configs/sec_paper_multitask_qwen3b.py \
      --workdir /ckpt/sec_multitask --config.model.source=/models/Qwen2.5-3B-Instruct
  # SEC over the three tasks alone (1-D), or the uniform baseline:
      --config.curriculum.arms=task
      --config.curriculum.name=uniform --config.curriculum.options={}

Memory, planned without weights by the TPU compiler (docs/scaling.md has the numbers):
  python -m experiments.plan --config configs/sec_paper_multitask_qwen3b.py --target v5e-8 \
      --prompt_len 768

The chat prompts of the largest zebra puzzles are the longest of the mixture (several hundred
tokens with Qwen's tokenizer and chat template); every pool is padded to the longest prompt, so
plan with the length the data gives (the run logs it as "prompt length").

Not measured: nothing in this file has been run at this size (it needs a pod or an 8-GPU host).
"""

from configs import sec_paper_countdown_qwen3b
from rl_curriculum.tasks import get_task

TASK = "countdown+zebra+arc1d"
BINS = ("countdown/n3", "countdown/n4", "countdown/n5",
        "zebra/3x3", "zebra/4x3", "zebra/4x4",
        "arc1d/move_10", "arc1d/move_20", "arc1d/mirror_20")


def get_config():
  c = sec_paper_countdown_qwen3b.get_config()
  mixture = get_task(TASK)
  c.task.name = TASK                  # one pool over the three tasks
  c.task.train_bins = tuple(mixture.bin_names.index(b) for b in BINS)
  c.task.eval_bins = c.task.train_bins
  c.task.train_per_bin = 10_000       # paper: about 10k problems per level
  c.task.eval_per_bin = 256

  c.curriculum.name = "sec"
  c.curriculum.arms = "bin"           # (task, difficulty) pairs: 2-D SEC
  c.curriculum.options.temperature = 0.2  # the paper's temperature for 2-D arms
  return c
