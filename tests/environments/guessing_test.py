"""Tests for rl_curriculum/environments/guessing.py."""

import math
import re

import pytest

from rl_curriculum.environments import Step
from rl_curriculum.environments.guessing import GuessingEnv, read_move

ENV = GuessingEnv()
RANGES = (8, 64, 512)


def test_levels_and_hidden_numbers():
  for level, high in enumerate(RANGES):
    problems = [ENV.generate(s, level) for s in range(200)]
    hidden = [p.meta["hidden"] for p in problems]
    assert all(1 <= h <= high for h in hidden) and all(p.meta["high"] == high for p in problems)
    assert [p.answer for p in problems] == [str(h) for h in hidden]
    assert len(set(hidden)) >= min(high, 150) * 3 // 4  # spread over the range
    assert f"from 1 to {high}." in problems[0].question
    # Prompts differ only in the game number, drawn apart from the hidden number.
    assert len({re.sub(r"#\d+", "#", p.prompt) for p in problems}) == 1
    assert ENV.max_turns(problems[0]) == math.ceil(math.log2(high)) + 2
    assert problems[0].target == f"Guess: {(1 + high) // 2}"


def _binary_search(problem):
  """Plays the game by bisection; returns the steps and the final state."""
  low, high = 1, problem.meta["high"]
  state, steps = ENV.reset(problem, 0), []
  while not steps or not steps[-1].done:
    middle = (low + high) // 2
    state, step = ENV.step(problem, state, f"Let me halve the range.\nGuess: {middle}")
    steps.append(step)
    if step.observation == f"{middle} is too low":
      low = middle + 1
    elif step.observation == f"{middle} is too high":
      high = middle - 1
    else:
      assert step == Step("", 1.0, True, False, True, True)
    assert len(steps) <= 12
  return steps, state


@pytest.mark.parametrize("level", range(3))
def test_binary_search_wins_in_log_turns(level):
  budget = math.ceil(math.log2(RANGES[level])) + 1
  for seed in range(40):
    p = ENV.generate(seed, level)
    steps, state = _binary_search(p)
    assert len(steps) <= budget
    assert sum(s.reward for s in steps) == 1.0 and steps[-1].correct
    assert not any(s.correct or s.done or s.tool_call for s in steps[:-1])
    assert state["turn"] == len(steps) and state["guesses"][-1] == p.meta["hidden"]
    assert len(state["guesses"]) == len(steps)


def test_replies():
  p = next(p for p in (ENV.generate(s, 1) for s in range(100)) if 10 < p.meta["hidden"] < 60)
  h, state = p.meta["hidden"], ENV.reset(p)
  assert ENV.step(p, state, f"Guess: {h - 1}") == (
      {"turn": 1, "guesses": [h - 1]}, Step(f"{h - 1} is too low", 0.0, False, False, True, False))
  assert ENV.step(p, state, f"guess: {h + 3}")[1] == Step(f"{h + 3} is too high", 0.0, False,
                                                          False, True, False)
  for out in (0, 65, -5, 10 ** 30):
    assert ENV.step(p, state, f"Guess: {out}")[1] == Step(
        f"{out} is out of range: the number is from 1 to 64", 0.0, False, False, True, False)
  # "Answer:" is a guess like "Guess:"; a wrong one does not end the game; the last marker counts.
  assert ENV.step(p, state, f"Answer: {h + 1}")[1] == Step(f"{h + 1} is too high", 0.0, False,
                                                           False, True, False)
  assert ENV.step(p, state, f"Answer: {h}")[1] == Step("", 1.0, True, False, True, True)
  assert ENV.step(p, state, f"Guess: 1\nGuess: {h}.\n")[1].correct
  assert not ENV.step(p, state, f"Guess: {h}\nGuess: 1")[1].correct
  for unreadable in ("2.5", "3 or 4", "many", "1/2"):
    _, step = ENV.step(p, state, f"Guess: {unreadable}")
    assert step == Step(f"Could not read one whole number in '{unreadable}'. Write one line "
                        "'Guess: <number>'.", 0.0, False, False, False, False)
  _, step = ENV.step(p, state, "Is it even?")
  assert step == Step("No guess found. Write one line 'Guess: <number>'.", 0.0, False, False,
                      False, False)
  for tool in (f"<tool>calc({h})</tool>", f"<tool>guess({h})</tool>\nGuess: {h}", "<tool>x"):
    assert ENV.step(p, state, tool) == ({"turn": 1, "guesses": []}, Step(
        "This game has no tools. Write one line 'Guess: <number>'.", 0.0, False, True, False,
        False))


def test_prompt_example_and_single_turn_score():
  p = ENV.generate(0, 2)
  assert "'Guess: 256' gets the reply \"256 is too low\" when the number is larger than 256" in (
      p.question)
  h = p.meta["hidden"]
  assert ENV.score(p, f"Guess: {h}").correct and ENV.score(p, f"Answer: {h}").correct
  assert ENV.score(p, f"Guess: {h + 1}").formatted and not ENV.score(p, f"Guess: {h + 1}").correct
  assert not ENV.score(p, "I give up").formatted


def test_read_move():
  assert read_move("Guess: 5") == "5"
  assert read_move("My guess: 7 is good\nthen") == "7 is good"
  assert read_move("Answer: 3\nGuess: 9") == "9"
  assert read_move("Guess:\n") is None and read_move("nothing") is None and read_move(3) is None
  assert read_move("x" * 5000 + "Guess: 3") is None
