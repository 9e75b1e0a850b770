"""Turn a list of problems into a pool: arms, difficulties and left-padded prompt tokens.

  pool = make_pool(problems, encode=tokenizer.encode, pad_id=0, num_arms=task.num_difficulties)
  pool.prompt_pool()          # curriculum.base.PromptPool(arms i32[N], difficulty f32[N])
  pool.tokens[selection.prompt_ids]   # i32[P, Tp] prompts for the sampler

The tokenizer lives elsewhere; this module only takes callables.
"""

from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.tasks.base import Problem

__all__ = ["TaskPool", "make_pool", "left_pad"]


class TaskPool(NamedTuple):
  """N problems with their arms and tokenised prompts (host arrays)."""
  problems: tuple            # N Problems, index = prompt id
  arms: np.ndarray           # i32[N] arm of each prompt, in [0, K)
  difficulty: np.ndarray     # f32[N] scalar difficulty (the problem's bin unless given)
  tokens: np.ndarray         # i32[N, Tp] prompt tokens, left-padded with pad_id
  mask: np.ndarray           # bool[N, Tp] True on real prompt tokens
  num_arms: int              # K

  def prompt_pool(self) -> PromptPool:
    return PromptPool.from_arms(self.arms, num_arms=self.num_arms, difficulty=self.difficulty)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int,
             length: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
  """(tokens i32[N, Tp], mask bool[N, Tp]): each row ends with its sequence, pad_id before it.

  Raises:
    ValueError: a sequence is empty or longer than `length`.
  """
  lengths = [len(s) for s in sequences]
  if not sequences or min(lengths) == 0:
    raise ValueError("every prompt must encode to at least one token")
  width = max(lengths) if length is None else int(length)
  if max(lengths) > width:
    i = int(np.argmax(lengths))
    raise ValueError(f"prompt {i} has {lengths[i]} tokens > max_prompt_len={width}; raise the "
                     "limit or filter long prompts (prompts are never truncated silently)")
  tokens = np.full((len(sequences), width), pad_id, np.int32)
  mask = np.zeros((len(sequences), width), bool)
  for i, s in enumerate(sequences):
    tokens[i, width - len(s):] = np.asarray(s, np.int32)
    mask[i, width - len(s):] = True
  return tokens, mask


def make_pool(problems: Sequence[Problem], encode: Callable[[str], list],
              pad_id: int, *, max_prompt_len: Optional[int] = None,
              num_arms: Optional[int] = None, bins: Optional[Sequence[int]] = None,
              bin_arms: Optional[Sequence[int]] = None,
              prompt_fn: Optional[Callable[[Problem], str]] = None,
              difficulty: Optional[Sequence[float]] = None) -> TaskPool:
  """Builds a `TaskPool` from problems.

  Args:
    problems: N problems (e.g. a split from `tfds_builders.load_split`).
    encode: text -> token ids (add BOS inside it if the model wants one).
    pad_id: id written left of shorter prompts.
    max_prompt_len: Tp; default the longest prompt. Longer prompts raise.
    num_arms: K; default max arm + 1 (or len(bins)).
    bins: optional map from difficulty bins to arms: arm = bins.index(problem.difficulty), so a
      subset of bins (e.g. the training bins) becomes arms 0..K-1. Problems of other bins raise.
    bin_arms: with `bins`, the arm of each of them instead (several bins may share an arm, e.g.
      one arm per task of a mixture); default their positions 0..len(bins)-1.
    prompt_fn: Problem -> prompt text; default `problem.prompt` (the plain template). For chat
      models pass a function applying the tokenizer's chat template to `task.prompt_messages`.
    difficulty: optional f32[N]; default each problem's own difficulty bin
      (`Problem.difficulty`, the task's order from easy to hard), NOT its arm: with
      bins=(5, 0, 1) arm 0 holds the hardest problems.

  Raises:
    ValueError: empty problems, a prompt longer than max_prompt_len, a bin not in `bins`,
      `bin_arms` not one label per bin.
  """
  problems = tuple(problems)
  if not problems:
    raise ValueError("make_pool needs at least one problem")
  if bins is not None:
    labels = range(len(bins)) if bin_arms is None else bin_arms
    if len(labels) != len(bins):
      raise ValueError(f"bin_arms has {len(labels)} labels for {len(bins)} bins")
    index = {int(b): int(k) for b, k in zip(bins, labels)}
    missing = sorted({p.difficulty for p in problems} - set(index))
    if missing:
      raise ValueError(f"problems of bins {missing} are not in bins={list(bins)}")
    arms = np.array([index[p.difficulty] for p in problems], np.int32)
    num_arms = max(index.values()) + 1 if num_arms is None else num_arms
  else:
    arms = np.array([p.difficulty for p in problems], np.int32)
  num_arms = int(arms.max()) + 1 if num_arms is None else int(num_arms)
  if arms.min() < 0 or arms.max() >= num_arms:
    raise ValueError(f"arms must lie in [0, {num_arms}), got [{arms.min()}, {arms.max()}]")
  diff = (np.array([p.difficulty for p in problems], np.float32) if difficulty is None
          else np.asarray(difficulty, np.float32).reshape(-1))
  if diff.shape != arms.shape:
    raise ValueError(f"difficulty has shape {diff.shape}, expected {arms.shape}")
  prompt_fn = prompt_fn or (lambda p: p.prompt)
  tokens, mask = left_pad([list(encode(prompt_fn(p))) for p in problems], pad_id, max_prompt_len)
  return TaskPool(problems=problems, arms=arms, difficulty=diff, tokens=tokens, mask=mask,
                  num_arms=num_arms)
