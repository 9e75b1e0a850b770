"""Tests for rl_curriculum/environments/calculator.py."""

import re

import pytest

from rl_curriculum.environments import Step
from rl_curriculum.environments.calculator import CalculatorEnv

ENV = CalculatorEnv()
SEEDS = range(200)


def _operands(problem):
  return [int(x) for x in re.findall(r"\d+", problem.meta["expression"])]


def test_levels_are_strictly_harder():
  shapes = []
  for level in range(3):
    problems = [ENV.generate(s, level) for s in SEEDS]
    operands = [_operands(p) for p in problems]
    shapes.append({(len(o), max(len(str(x)) for x in o)) for o in operands})
    for p, o in zip(problems, operands):
      assert f"What is {p.meta['expression']}?" in p.question
      a, b = o[0], o[1]
      if level < 2:
        assert p.meta["expression"] == f"{a}*{b}" and p.answer == str(a * b)
      else:
        c = o[2]
        assert 1000 <= c <= 9999
        assert p.answer in (str(a * b + c), str(a * b - c))
  # Two two-digit operands, two three-digit ones, then a third four-digit one.
  assert shapes == [{(2, 2)}, {(2, 3)}, {(3, 4)}]


@pytest.mark.parametrize("argument, observation", [
    ("37*48", f"calc(37*48) = {37 * 48}"),
    (" 2 * (3+4) ", "calc(2 * (3+4)) = 14"),
    ("-3/6", "calc(-3/6) = -1/2"),
    ("7/7", "calc(7/7) = 1"),
    ("835*941-4098", f"calc(835*941-4098) = {835 * 941 - 4098}"),
    ("(((1+1)))", "calc((((1+1)))) = 2"),
    ("12\u00d710", "calc(12\u00d710) = 120"),
])
def test_calc_observations(argument, observation):
  p = ENV.generate(0, 0)
  _, step = ENV.step(p, ENV.reset(p), f"<tool>calc({argument})</tool>")
  assert step == Step(observation, 0.0, False, True, True, False)


@pytest.mark.parametrize("argument", [
    "1/0", "2**3", "2^3", "__import__('os').system('ls')", "x+1", "1+", "", "1" * 41,
    "1+" * 70 + "1", "(" * 40 + "1" + ")" * 40, "9" * 3000,
])
def test_calc_unparseable(argument):
  p = ENV.generate(0, 0)
  _, step = ENV.step(p, ENV.reset(p), f"<tool>calc({argument})</tool>")
  assert step == Step("calc: could not parse the expression", 0.0, False, True, False, False)


def test_prompt_example_is_what_the_tool_replies():
  p = ENV.generate(5, 2)
  _, step = ENV.step(p, ENV.reset(p), f"<tool>{ENV.call_example}</tool>")
  assert f"<tool>{ENV.call_example}</tool> gets the reply \"{step.observation}\"" in p.question
  assert step.observation == f"calc(12*(3+4)) = {12 * (3 + 4)}"


@pytest.mark.parametrize("level", range(3))
def test_scripted_episode(level):
  for seed in range(20):
    p = ENV.generate(seed, level)
    state = ENV.reset(p, seed)
    state, first = ENV.step(p, state, f"I will compute it.\n<tool>calc({p.meta['expression']})"
                                      "</tool>")
    assert first == Step(f"calc({p.meta['expression']}) = {p.answer}", 0.0, False, True, True,
                         False)
    value = first.observation.rsplit("= ", 1)[1]
    state, last = ENV.step(p, state, f"The calculator says {value}.\nAnswer: {value}")
    assert last == Step("", 1.0, True, False, True, True)
    assert state["turn"] == 2 and first.reward + last.reward == 1.0


def test_answers():
  p = ENV.generate(1, 1)
  state = ENV.reset(p)
  value = int(p.answer)
  for right in (f"Answer: {value}", f"Answer: {value:,}.", f"Final answer: ${value}$"):
    assert ENV.step(p, state, right)[1] == Step("", 1.0, True, False, True, True), right
  for wrong in (f"Answer: {value + 1}", f"Answer: {value} or {value + 1}", "Answer: many"):
    assert ENV.step(p, state, wrong)[1].reward == 0.0
    assert ENV.step(p, state, wrong)[1].done
  assert ENV.step(p, state, f"Answer: {value + 1}")[1] == Step("", 0.0, True, False, True, False)
  # An answer next to a tool call is ignored: the call is answered and the episode goes on.
  _, step = ENV.step(p, state, f"<tool>calc(1+1)</tool>\nAnswer: {value}")
  assert step == Step("calc(1+1) = 2", 0.0, False, True, True, False)


def test_unknown_tool_malformed_and_neither():
  p = ENV.generate(2, 0)
  state = ENV.reset(p)
  _, step = ENV.step(p, state, "<tool>eval(2+2)</tool>")
  assert step == Step("Unknown tool 'eval'. The only tool is calc: <tool>calc(12*(3+4))</tool>.",
                      0.0, False, True, False, False)
  _, step = ENV.step(p, state, "<tool>calc(2+2)")
  assert step == Step("Malformed tool call. Write exactly <tool>calc(12*(3+4))</tool>: a name, "
                      "its argument in parentheses, then </tool>.", 0.0, False, True, False, False)
  _, step = ENV.step(p, state, "The product is large.")
  assert step == Step("No tool call or answer found. Call a tool as <tool>calc(12*(3+4))</tool> "
                      "or answer as 'Answer: <number>'.", 0.0, False, False, False, False)
