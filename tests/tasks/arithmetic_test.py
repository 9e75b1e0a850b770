"""Tests for rl_curriculum/tasks/arithmetic.py: bin contents checked by an independent evaluator."""

import ast
from fractions import Fraction
import re

import pytest

from rl_curriculum.tasks import arithmetic
from rl_curriculum.tasks.base import DEFAULT_FORMAT_BONUS, Score


def _eval(node):
  """Exact value of a trusted, generated expression via Python's AST (reference only)."""
  if isinstance(node, ast.Expression):
    return _eval(node.body)
  if isinstance(node, ast.Constant):
    return Fraction(node.value)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return -_eval(node.operand)
  ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
         ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
  return ops[type(node.op)](_eval(node.left), _eval(node.right))


def _value(expr):
  assert re.fullmatch(r"[0-9+\-*/() ]+", expr), expr
  return _eval(ast.parse(expr, mode="eval"))


DIGITS = {  # bin -> allowed operand digit counts
    "add_1d_1d": {1}, "add_2d_1d": {1, 2}, "add_2d_2d": {2}, "sub_2d_2d": {2},
    "mul_1d_1d": {1}, "mul_2d_1d": {1, 2}, "mix3_1d": {1}, "mix3_2d": {1, 2},
    "add_3d_3d": {3}, "mul_2d_2d": {2}, "mix4_2d": {1, 2}, "mix5_1d": {1},
}
TERMS = {"mix3_1d": 3, "mix3_2d": 3, "mix4_2d": 4, "mix5_1d": 5}


@pytest.mark.parametrize("b", range(len(arithmetic.BINS)))
def test_bins_match_their_description(b):
  task = arithmetic.ArithmeticTask()
  name = arithmetic.BINS[b]
  for seed in range(40):
    p = task.generate(seed, b)
    assert p.prompt.endswith("=") and p.target == p.answer
    expr = p.prompt[:-1]
    assert _value(expr) == int(p.answer)
    numbers = re.findall(r"\d+", expr)
    assert {len(n) for n in numbers} <= DIGITS[name], (name, expr)
    assert len(numbers) == TERMS.get(name, 2)
    if name.startswith(("add", "sub")):
      assert int(p.answer) >= 0
  assert arithmetic.ArithmeticTask().train_bins == tuple(range(8))


@pytest.mark.parametrize("b", range(len(arithmetic.CHAIN_BINS)))
def test_chain_bins(b):
  task = arithmetic.ArithmeticTask(chain=True)
  for seed in range(20):
    p = task.generate(seed, b)
    *steps, last = p.prompt[:-1].split(",")
    assert len(steps) == b + 1 and last == "abcdefghij"[b]
    env = {}
    for step in steps:   # evaluate by substitution, one step at a time
      var, rhs = step.split("=")
      for k, v in env.items():
        rhs = rhs.replace(k, f"({v})")
      env[var] = int(_value(rhs))
    assert env[last] == int(p.answer)


@pytest.mark.parametrize("text, score", [
    ("19", Score(1.0, True, True)), (" 19 ", Score(1.0, True, True)),
    ("19.", Score(1.0, True, True)), ("+19", Score(1.0, True, True)),
    ("19\n20", Score(1.0, True, True)), ("\uff11\uff19", Score(1.0, True, True)),
    ("20", Score(DEFAULT_FORMAT_BONUS, False, True)),
    ("-19", Score(DEFAULT_FORMAT_BONUS, False, True)),
    ("19 20", Score(0.0, False, False)), ("1 9", Score(0.0, False, False)),
    ("19abc", Score(0.0, False, False)), ("nineteen", Score(0.0, False, False)),
    ("", Score(0.0, False, False)), ("\n19", Score(0.0, False, False)),
    ("12+7", Score(0.0, False, False)), ("9" * 100, Score(0.0, False, False)),
])
def test_plain_answer_rules(text, score):
  task = arithmetic.ArithmeticTask()
  p = arithmetic.base.Problem(task="arithmetic", difficulty=2, prompt="12+7=",
                              question="What is 12+7?", answer="19", target="19")
  assert task.score(p, text) == score


@pytest.mark.parametrize("text, correct, formatted", [
    ("Answer: 19", True, True), ("12+7 is 19.\nAnswer: 19.", True, True),
    ("answer: $19$", True, True), ("Final answer: 19", True, True), ("\\boxed{19}", True, True),
    ("Answer: 18\nAnswer: 19", True, True), ("Answer: 19\nAnswer: 18", False, True),
    ("Answer: 12+7=19", False, False), ("Answer: 19 or 20", False, False), ("19", False, False),
])
def test_chat_answer_rules(text, correct, formatted):
  task = arithmetic.ArithmeticTask(template="chat")
  p = arithmetic.base.Problem(task="arithmetic", difficulty=2, prompt="12+7=",
                              question="What is 12+7?", answer="19", target="19")
  s = task.score(p, text)
  assert (s.correct, s.formatted) == (correct, formatted)


def test_chat_short_reads_the_result_after_a_restated_question():
  task = arithmetic.ArithmeticTask(template="chat_short")
  problem = task.generate(3, 2)
  a = int(problem.answer)
  assert "only" in task.prompt_messages(problem)[0]["content"]
  for text in [f"{a}", f"{problem.question[8:-1]} = {a}", f"It is {a}.", f"x = y = {a}\nmore"]:
    assert task.score(problem, text).correct, text
  assert task.score(problem, f"= {a + 1}") == (task.format_bonus, False, True)
  assert not task.score(problem, f"{a} or {a + 1}").formatted   # two candidates: not an answer
  assert task.score(problem, "") == (0.0, False, False)
