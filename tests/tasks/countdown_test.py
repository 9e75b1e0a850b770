"""Tests for rl_curriculum/tasks/countdown.py: solvability and the multiset rule."""

import ast
import dataclasses
from collections import Counter
from fractions import Fraction
import re

import pytest

from rl_curriculum.tasks import countdown


def _value(expr):
  """Exact value of a trusted, generated expression via Python's AST (reference only)."""
  assert re.fullmatch(r"[0-9+\-*/()]+", expr), expr
  def ev(node):
    if isinstance(node, ast.Constant):
      return Fraction(node.value)
    a, b = ev(node.left), ev(node.right)
    return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b,
            ast.Div: a / b if b else None}[type(node.op)]
  return ev(ast.parse(expr, mode="eval").body)


@pytest.mark.parametrize("b", range(3))
def test_reference_solution_is_valid(b):
  task = countdown.CountdownTask()
  for seed in range(60):
    p = task.generate(seed, b)
    nums, target = p.meta["numbers"], p.meta["target"]
    assert len(nums) == b + 3 and all(1 <= n <= 30 for n in nums)
    assert 1 <= target <= 999
    assert Counter(int(x) for x in re.findall(r"\d+", p.answer)) == Counter(nums)
    assert _value(p.answer) == target
    assert str(target) in p.prompt and " ".join(map(str, nums)) in p.prompt


@pytest.mark.parametrize("b, n, lo, hi, targets", [
    (3, 6, 1, 30, (1, 999)), (4, 3, 31, 99, (1, 999)), (5, 3, 1, 30, (1_000, 9_999))])
def test_out_of_distribution_bins_are_valid_and_evaluation_only(b, n, lo, hi, targets):
  task = countdown.CountdownTask(ood_bins=True)
  assert task.bin_names == ("n3", "n4", "n5", "n6", "n3_wide", "n3_big")
  assert task.eval_only_bins == (3, 4, 5) and task.train_bins == (0, 1, 2)
  for seed in range(40):
    p = task.generate(seed, b)
    nums, target = p.meta["numbers"], p.meta["target"]
    assert len(nums) == n and all(lo <= x <= hi for x in nums)
    assert targets[0] <= target <= targets[1] and _value(p.answer) == target
    assert task.score(p, " " + p.answer).correct
  # The trained bins' problems are those of the task without the extra bins.
  assert task.generate(7, 1) == countdown.CountdownTask().generate(7, 1)
  assert countdown.CountdownTask().bin_names == countdown.BINS


def test_each_bin_keeps_its_problems_whatever_bins_follow_it():
  """Each bin draws from its own stream: the problems of n3-n5, n6 and n3_wide (the bins a
  comparison's runs trained and evaluated on) are those of their first version, before n3_big
  was appended. Expected values recorded from that version."""
  task = countdown.CountdownTask(ood_bins=True)
  got = {name: (task.generate(11, b).meta["numbers"], task.generate(11, b).meta["target"])
         for b, name in enumerate(task.bin_names[:5])}
  assert got == {"n3": ([8, 27, 27], 62), "n4": ([17, 27, 17, 24], 410),
                 "n5": ([11, 20, 12, 21, 26], 529), "n6": ([12, 6, 11, 22, 10, 2], 267),
                 "n3_wide": ([32, 79, 34], 81)}


def _problem(use_all=True):
  return countdown.base.Problem(
      task="countdown", difficulty=0, prompt="", question="", answer="(3+5)*2", target="",
      meta={"numbers": [3, 5, 2], "target": 16, "use_all": use_all})


@pytest.mark.parametrize("text, correct, formatted", [
    ("(3+5)*2", True, True), ("2*(5+3)", True, True), ("(5+3)*2=16", True, True),
    ("2 * (3 + 5)", True, True), ("(3+5)\u00d72", True, True),
    ("3*5+2", False, True), ("(3+5)*2*1", False, True), ("16", False, True),
    ("(3+3)*2+4", False, True), ("3+5*2", False, True),
    ("(3+5)*2+3-3", False, True),  # every number used, and 3 twice: the value is right
    ("-(3-5)*8", False, False), ("(3+5)**2", False, False), ("16/0", False, False),
    ("eval('16')", False, False), ("(((3+5)*2", False, False),
])
def test_rules_exactly_once(text, correct, formatted):
  s = countdown.CountdownTask().score(_problem(), text)
  assert (s.correct, s.formatted) == (correct, formatted)


def test_rules_at_most_once():
  task = countdown.CountdownTask(use_all=False)
  p = _problem(use_all=False)
  assert task.score(p, "(3+5)*2").correct
  big = countdown.base.Problem(task="countdown", difficulty=0, prompt="", question="",
                               answer="", target="",
                               meta={"numbers": [8, 2, 7], "target": 16, "use_all": False})
  assert task.score(big, "8*2").correct              # 7 unused: allowed
  assert not task.score(big, "8+8").correct          # 8 twice: not allowed
  exact = dataclasses.replace(big, meta={**big.meta, "use_all": True})
  assert not countdown.CountdownTask().score(exact, "8*2").correct   # 7 must be used
