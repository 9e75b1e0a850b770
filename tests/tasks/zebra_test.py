"""Tests for rl_curriculum/tasks/zebra.py: uniqueness proved by an independent brute force."""

import itertools

import numpy as np
import pytest

from rl_curriculum.tasks import zebra

SMALL_BINS = (0, 1, 2, 3)   # 2x2, 2x3, 3x3, 3x4: brute force in pure Python stays fast
PUZZLES_PER_BIN = 25


def _holds(kind, p, q, k):
  """House-level meaning of each clue kind, written out independently of the module."""
  if kind == "at":
    return p == k
  if kind == "not_at":
    return p != k
  if kind == "same":
    return p == q
  if kind == "not_same":
    return p != q
  if kind == "left":
    return q - p == 1
  if kind == "next":
    return abs(p - q) == 1
  if kind == "before":
    return p < q
  raise AssertionError(kind)


def _brute_force(meta):
  """All assignments (as tuples of per-attribute house tuples) satisfying every clue."""
  houses, attrs = meta["houses"], len(meta["attributes"])
  found = []
  for assign in itertools.product(itertools.permutations(range(houses)), repeat=attrs):
    ok = True
    for kind, a1, v1, a2, v2, k in meta["clues"]:
      if not _holds(kind, assign[a1][v1], assign[a2][v2], k):
        ok = False
        break
    if ok:
      found.append(assign)
  return found


@pytest.mark.parametrize("b", SMALL_BINS)
def test_every_small_puzzle_is_unique_and_answer_matches(b):
  task = zebra.ZebraTask()
  for seed in range(PUZZLES_PER_BIN):
    p = task.generate(seed, b)
    sols = _brute_force(p.meta)
    assert len(sols) == 1, (b, seed)
    (sol,) = sols
    a, h = p.meta["ask"]
    value_index = sol[a].index(h)
    assert p.meta["values"][a][value_index] == p.answer
    # The module's vectorised solver agrees.
    assert np.array_equal(zebra.solutions(p.meta)[0], np.array(sol))


@pytest.mark.parametrize("b", range(len(zebra.BINS)))
def test_all_bins_unique_by_module_solver_and_minimal(b):
  task = zebra.ZebraTask()
  for seed in range(5):
    p = task.generate(seed, b)
    assert len(zebra.solutions(p.meta)) == 1
    houses, attrs = (int(x) for x in zebra.BINS[b].split("x"))
    assert p.meta["houses"] == houses and len(p.meta["attributes"]) == attrs
    # Minimal: dropping any clue admits a second solution.
    for i in range(len(p.meta["clues"])):
      reduced = dict(p.meta, clues=p.meta["clues"][:i] + p.meta["clues"][i + 1:])
      assert len(zebra.solutions(reduced)) > 1


def test_clue_text_mentions_every_clue():
  p = zebra.ZebraTask().generate(0, 2)
  assert p.prompt.count("\n") >= len(p.meta["clues"]) + 3
  for i in range(len(p.meta["clues"])):
    assert f"\n{i + 1}. " in p.prompt


@pytest.mark.parametrize("text, correct, formatted", [
    ("{a}", True, True), ("The {a}.", True, True), ("{A}", True, True), ("house {a}", False, False),
    ("{other}", False, True), ("purple", False, False), ("**{a}**", True, True),
    ("\"{a}\"", True, True), ("{a}0", False, False), ("${a}0$", False, False),
    ("{{{{{a}0}}}}", False, False), ("{a}_", False, False), ("the-{a}", False, False),
])
def test_answer_normalisation(text, correct, formatted):
  task = zebra.ZebraTask()
  p = task.generate(4, 1)
  other = next(c for c in p.meta["choices"] if c != p.answer)
  text = text.format(a=p.answer, A=p.answer.upper(), other=other)
  s = task.score(p, text)
  assert (s.correct, s.formatted) == (correct, formatted)
