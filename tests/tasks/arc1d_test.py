"""Tests for rl_curriculum/tasks/arc1d.py: every shown pair obeys its family's rule."""

import re

import pytest

from rl_curriculum.tasks import arc1d


def _pairs(problem):
  rows = re.findall(r"Input: ([\d ]+)\nOutput: ?([\d ]*)", problem.prompt + problem.target)
  return [([int(c) for c in x.split()], [int(c) for c in y.split()]) for x, y in rows]


def _runs(row):
  """(start, end, colour) of maximal runs of equal non-zero colour."""
  out, i = [], 0
  while i < len(row):
    if row[i]:
      j = i
      while j + 1 < len(row) and row[j + 1] == row[i]:
        j += 1
      out.append((i, j, row[i]))
      i = j + 1
    else:
      i += 1
  return out


def _check_family(family, pairs):
  if family == "move":
    shifts = set()
    for x, y in pairs:
      (xs, xe, c), = _runs(x)
      (ys, ye, d), = _runs(y)
      assert c == d and xe - xs == ye - ys
      shifts.add(ys - xs)
    assert len(shifts) == 1 and shifts.pop() != 0
  elif family == "fill":
    for x, y in pairs:
      nz = [i for i, v in enumerate(x) if v]
      assert len(nz) == 2 and _runs(y) == [(nz[0], nz[1], x[nz[0]])]
  elif family == "recolour":
    mapping = {}
    for x, y in pairs:
      for a, b in zip(x, y):
        if a != b:
          assert mapping.setdefault(a, b) == b
    assert len(mapping) == 1
  elif family == "mirror":
    assert all(y == x[::-1] and x != y for x, y in pairs)
  elif family == "denoise":
    for x, y in pairs:
      (s, e, c), = _runs(y)
      assert x[s] == x[e] == c and x != y
  elif family == "gravity":
    for x, y in pairs:
      nz = [v for v in x if v]
      assert y == [0] * (len(x) - len(nz)) + nz
  elif family == "hollow":
    for x, y in pairs:
      (s, e, c), = _runs(x)
      assert [i for i, v in enumerate(y) if v] == [s, e] and y[s] == c
  elif family == "scale":
    for x, y in pairs:
      pattern = [v for v in x if v]
      assert [v for v in y if v] == [v for v in pattern for _ in range(2)]
      assert next(i for i, v in enumerate(x) if v) == next(i for i, v in enumerate(y) if v)
  else:
    raise AssertionError(family)


@pytest.mark.parametrize("b", range(len(arc1d.BINS)))
def test_every_pair_follows_the_rule(b):
  task = arc1d.Arc1dTask()
  family, length = arc1d.BINS[b].split("_")
  for seed in range(30):
    p = task.generate(seed, b)
    pairs = _pairs(p)
    assert len(pairs) == task.num_shots + 1
    assert all(len(x) == len(y) == int(length) for x, y in pairs)
    assert len({tuple(x) for x, _ in pairs}) == len(pairs)
    _check_family(family, pairs)
    assert " ".join(map(str, pairs[-1][1])) == p.answer


@pytest.mark.parametrize("text, correct, formatted", [
    ("{a}", True, True), ("[{c}]", True, True), ("{a}   ", True, True),
    ("{short}", False, True), ("{a} 0", False, True), ("{a} x", False, False),
    ("12 3", False, False), ("row: {a}", False, False),
])
def test_answer_rules(text, correct, formatted):
  task = arc1d.Arc1dTask()
  p = task.generate(0, 6)
  text = text.format(a=p.answer, c=", ".join(p.answer.split()),
                     short=" ".join(p.answer.split()[:-1]))
  s = task.score(p, text)
  assert (s.correct, s.formatted) == (correct, formatted)


def test_num_shots_option():
  p = arc1d.Arc1dTask(num_shots=5).generate(0, 0)
  assert len(_pairs(p)) == 6
  with pytest.raises(ValueError):
    arc1d.Arc1dTask(num_shots=0)
