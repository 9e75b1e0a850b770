"""Tests for rl_curriculum/environments/countdown_tool.py."""

import dataclasses

import pytest

from rl_curriculum.environments import Step
from rl_curriculum.environments.countdown_tool import CountdownToolEnv
from rl_curriculum.tasks.countdown import CountdownTask

ENV = CountdownToolEnv()


def _puzzle(numbers, target, use_all=True):
  """A problem with hand-chosen numbers ("step" reads only the answer and meta)."""
  p = ENV.generate(0, 0)
  return dataclasses.replace(p, answer="?", meta={"numbers": numbers, "target": target,
                                                  "use_all": use_all})


def test_levels_and_puzzles():
  countdown = CountdownTask()
  for level in range(3):
    problems = [ENV.generate(s, level) for s in range(200)]
    assert {len(p.meta["numbers"]) for p in problems} == {level + 3}
    assert all(1 <= p.meta["target"] <= 999 and p.meta["use_all"] for p in problems)
    for p in problems[:20]:
      numbers = " ".join(map(str, p.meta["numbers"]))
      assert f"Using the numbers {numbers} (each exactly once)" in p.question
      assert f"equal to {p.meta['target']}." in p.question
      assert countdown.score(p, p.answer).correct  # the reference expression solves it
    # Another seed stream than countdown's own puzzles.
    same = sum(countdown.generate(s, level).meta == p.meta for s, p in enumerate(problems))
    assert same < 5
  assert "(each at most once)" in CountdownToolEnv(use_all=False).generate(0, 0).question


@pytest.mark.parametrize("argument, observation", [
    ("25-3*7", "eval(25-3*7) = 4 (target 24; uses numbers not given: 25)"),
    ("3*7+3", "eval(3*7+3) = 24 (target 24; uses numbers not given: 3)"),
    ("(7-4)*(3+3)", "eval((7-4)*(3+3)) = 18 (target 24; uses numbers not given: 3)"),
    ("7/3", "eval(7/3) = 7/3 (target 24; uses only given numbers)"),
    (" 4*(7-3) ", f"eval(4*(7-3)) = {4 * (7 - 3)} (target 24; uses only given numbers)"),
    ("(7-3-4)*1", "eval((7-3-4)*1) = 0 (target 24; uses numbers not given: 1)"),
    ("9*9+99", f"eval(9*9+99) = {9 * 9 + 99} (target 24; uses numbers not given: 9 9 99)"),
])
def test_eval_observations(argument, observation):
  p = _puzzle([3, 7, 4], 24)
  _, step = ENV.step(p, ENV.reset(p), f"<tool>eval({argument})</tool>")
  assert step == Step(observation, 0.0, False, True, True, False)


@pytest.mark.parametrize("argument", ["-3+7", "3**7", "1/0", "(3+4", "3 7", "", "open('x')"])
def test_eval_unparseable(argument):
  p = _puzzle([3, 7, 4], 24)
  _, step = ENV.step(p, ENV.reset(p), f"<tool>eval({argument})</tool>")
  assert step == Step("eval: could not parse the expression", 0.0, False, True, False, False)


def test_prompt_example_is_what_the_tool_replies():
  for seed in range(10):
    p = ENV.generate(seed, 1)
    call = p.question.split("for example ", 1)[1].split(" gets the reply", 1)[0]
    _, step = ENV.step(p, ENV.reset(p), call)
    assert f"{call} gets the reply \"{step.observation}\"" in p.question
    assert step.well_formed and "uses only given numbers" in step.observation
    assert f"= {p.meta['target']} " not in step.observation  # it gives nothing away


@pytest.mark.parametrize("level", range(3))
def test_scripted_episode(level):
  for seed in range(10):
    p = ENV.generate(seed, level)
    state = ENV.reset(p, seed)
    state, first = ENV.step(p, state, f"<tool>eval({p.answer})</tool>")
    assert first == Step(f"eval({p.answer}) = {p.meta['target']} (target {p.meta['target']}; "
                         "uses only given numbers)", 0.0, False, True, True, False)
    state, last = ENV.step(p, state, f"It checks out.\nAnswer: {p.answer} = {p.meta['target']}")
    assert last == Step("", 1.0, True, False, True, True)
    assert state == {"turn": 2}


def test_answers_checked_as_countdown_checks_them():
  p = _puzzle([3, 7, 4, 2], 24)
  state = ENV.reset(p)
  assert ENV.step(p, state, "Answer: (7-3)*(4+2)")[1] == Step("", 1.0, True, False, True, True)
  assert ENV.step(p, state, "Answer: (7-3)*(4+2)=24")[1].correct
  # Equal to the target but 2 used twice, 4 unused once / all numbers but another value.
  assert ENV.step(p, state, "Answer: (7-4+3)*(2+2)")[1] == Step("", 0.0, True, False, True, False)
  assert ENV.step(p, state, "Answer: 7*3+4+2")[1] == Step("", 0.0, True, False, True, False)
  assert ENV.step(p, state, "Answer: -(7-3)*(4+2)")[1] == Step("", 0.0, True, False, False, False)
  countdown, subset = CountdownTask(), _puzzle([3, 7, 4, 2], 28, use_all=False)
  for answer in ("7*4", "(7+3+2)*4/2", "7*4*1", "7+7+7+7", "4*7=28", "28", "(7-3)*(4+2)"):
    for problem in (p, subset):
      assert ENV.score(problem, f"Answer: {answer}") == countdown.score(problem, answer), answer
  assert ENV.score(subset, "Answer: 7*4").correct


def test_unknown_tool_and_neither():
  p = ENV.generate(0, 2)
  state = ENV.reset(p)
  _, step = ENV.step(p, state, "<tool>calc(2+2)</tool>")
  assert step == Step("Unknown tool 'calc'. The only tool is eval: <tool>eval((2+3)*4)</tool>.",
                      0.0, False, True, False, False)
  _, step = ENV.step(p, state, "Maybe multiply?")
  assert step == Step("No tool call or answer found. Call a tool as <tool>eval((2+3)*4)</tool> "
                      "or answer as 'Answer: <expression>'.", 0.0, False, False, False, False)
