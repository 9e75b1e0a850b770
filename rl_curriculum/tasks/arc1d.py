"""`arc1d`: one-dimensional abstraction-and-reasoning puzzles with few-shot examples.

Each problem shows `num_shots` (default 3) input/output pairs of rows of colours 0-9 (0 is the
background) produced by one hidden rule, then a test input; the answer is the output row, written
as digits separated by single spaces ("0 0 3 3 0"). Rule parameters (shift, colours, ...) are drawn
once per problem and shared by its examples.

Families:
  move      a solid block moves `s` cells (s in 1..3, left or right; the block stays in the row)
  fill      two end points of one colour; the cells between them are filled with that colour
  recolour  every cell of colour c becomes colour d (other colours unchanged)
  mirror    the row is reversed
  denoise   a solid block with some cells flipped to another colour, plus stray pixels outside;
            the output is the clean block alone
  gravity   all coloured cells fall to the right end, keeping their order
  hollow    a solid block keeps only its two end cells
  scale     every coloured cell of a short pattern is doubled in place ("1 2" -> "1 1 2 2")

Bins are family x row length: for each family in the order above, a short (length 10) and a long
(length 20) bin: 0 move_10, 1 move_20, 2 fill_10, ..., 15 scale_20.

Verification: the answer is split on white space, commas and brackets; formatted when every piece
is a single digit; correct when the digit sequence equals the reference row exactly.
"""

import re

from rl_curriculum.tasks import base

__all__ = ["Arc1dTask", "FAMILIES", "LENGTHS", "BINS"]

FAMILIES = ("move", "fill", "recolour", "mirror", "denoise", "gravity", "hollow", "scale")
LENGTHS = (10, 20)
BINS = tuple(f"{f}_{n}" for f in FAMILIES for n in LENGTHS)
_MAX_ANSWER_CELLS = 256


def _colours(rng, k):
  return [int(c) for c in rng.choice(range(1, 10), size=k, replace=False)]


def _block(rng, n, min_len=2, max_len=None):
  """(start, length) of a random block inside a row of n cells."""
  max_len = max_len or max(min_len, n // 2)
  length = int(rng.integers(min_len, max_len + 1))
  start = int(rng.integers(0, n - length + 1))
  return start, length


def _rule(rng, family, n):
  """Per-problem rule parameters and a sampler of (input, output) pairs under them."""
  if family == "move":
    shift = int(rng.integers(1, 4)) * (1 if rng.random() < 0.5 else -1)
    def pair(r):
      start, length = _block(r, n - abs(shift))
      start += max(0, -shift)
      c = _colours(r, 1)[0]
      x = [0] * n
      x[start:start + length] = [c] * length
      y = [0] * n
      y[start + shift:start + shift + length] = [c] * length
      return x, y
    return pair
  if family == "fill":
    def pair(r):
      start, length = _block(r, n, 3, max(3, n - 2))
      c = _colours(r, 1)[0]
      x = [0] * n
      x[start] = x[start + length - 1] = c
      y = [0] * n
      y[start:start + length] = [c] * length
      return x, y
    return pair
  if family == "recolour":
    src, dst = _colours(rng, 2)
    def pair(r):
      others = [c for c in range(1, 10) if c not in (src, dst)]
      x = [int(r.choice([0, 0, src, src] + others[:2])) for _ in range(n)]
      if src not in x:
        x[int(r.integers(n))] = src
      return x, [dst if v == src else v for v in x]
    return pair
  if family == "mirror":
    def pair(r):
      while True:
        x = [int(r.choice(10)) if r.random() < 0.5 else 0 for _ in range(n)]
        if x != x[::-1]:
          return x, x[::-1]
    return pair
  if family == "denoise":
    def pair(r):
      start, length = _block(r, n, max(3, n // 4), max(3, n // 2))
      c, noise = _colours(r, 2)
      y = [0] * n
      y[start:start + length] = [c] * length
      x = list(y)
      inner = [i for i in range(start + 1, start + length - 1)]
      outer = [i for i in range(n) if i < start - 1 or i > start + length]
      k_in = int(r.integers(1, max(2, len(inner) // 3 + 1)))
      for i in r.choice(inner, size=min(k_in, len(inner)), replace=False):
        x[int(i)] = noise
      if outer:
        for i in r.choice(outer, size=min(int(r.integers(1, 3)), len(outer)), replace=False):
          x[int(i)] = c if r.random() < 0.5 else noise
      return x, y
    return pair
  if family == "gravity":
    def pair(r):
      while True:
        x = [int(r.integers(1, 10)) if r.random() < 0.35 else 0 for _ in range(n)]
        nz = [v for v in x if v]
        y = [0] * (n - len(nz)) + nz
        if nz and x != y:
          return x, y
    return pair
  if family == "hollow":
    def pair(r):
      start, length = _block(r, n, 3, max(3, n - 2))
      c = _colours(r, 1)[0]
      x = [0] * n
      x[start:start + length] = [c] * length
      y = [0] * n
      y[start] = y[start + length - 1] = c
      return x, y
    return pair
  if family == "scale":
    def pair(r):
      k = int(r.integers(2, n // 4 + 1))
      start = int(r.integers(0, n - 2 * k + 1))
      pattern = [int(c) for c in r.integers(1, 10, size=k)]
      x = [0] * n
      x[start:start + k] = pattern
      y = [0] * n
      y[start:start + 2 * k] = [c for c in pattern for _ in range(2)]
      return x, y
    return pair
  raise ValueError(f"unknown family {family!r}")


def _row(cells) -> str:
  return " ".join(map(str, cells))


class Arc1dTask(base.Task):
  """1-D ARC puzzles; see the module docstring."""
  name = "arc1d"
  bin_names = BINS
  answer_kind = "row of digits"

  def __init__(self, template: str = "plain", format_bonus: float = base.DEFAULT_FORMAT_BONUS,
               num_shots: int = 3):
    super().__init__(template, format_bonus)
    if num_shots < 1:
      raise ValueError(f"num_shots must be >= 1, got {num_shots}")
    self.num_shots = int(num_shots)

  def _make(self, seed, difficulty):
    rng = base.rng_for(self.name, seed, difficulty, self.num_shots)
    family, n = FAMILIES[difficulty // len(LENGTHS)], LENGTHS[difficulty % len(LENGTHS)]
    pair = _rule(rng, family, n)
    pairs, seen = [], set()
    while len(pairs) < self.num_shots + 1:
      x, y = pair(rng)
      if tuple(x) not in seen:
        seen.add(tuple(x))
        pairs.append((x, y))
    shots = "\n\n".join(f"Input: {_row(x)}\nOutput: {_row(y)}" for x, y in pairs[:-1])
    x, y = pairs[-1]
    question = (f"Each output row is made from its input row by the same rule.\n\n{shots}\n\n"
                f"Input: {_row(x)}")
    answer = _row(y)
    return base.Problem(task=self.name, difficulty=difficulty,
                        prompt=f"{question}\nOutput:", question=question + "\nWhat is the output?",
                        answer=answer, target=f" {answer}", seed=seed,
                        meta={"family": family, "length": n})

  def _check(self, problem, answer):
    pieces = [p for p in re.split(r"[\s,\[\]()]+", answer[:4 * _MAX_ANSWER_CELLS]) if p]
    if not pieces or len(pieces) > _MAX_ANSWER_CELLS:
      return False, False
    if not all(len(p) == 1 and p in "0123456789" for p in pieces):
      return False, False
    return pieces == problem.answer.split(), True
