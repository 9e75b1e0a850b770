"""Tests for rl_curriculum/environments/base.py: the turn format and the Step contract."""

from fractions import Fraction

import pytest

from rl_curriculum.environments import base as env_base
from rl_curriculum.environments.base import Step, Turn, parse_turn
from rl_curriculum.tasks.base import Problem


@pytest.mark.parametrize("text, turn", [
    ("<tool>calc(1+2)</tool>", Turn("tool", "calc", "1+2", "")),
    ("Let me compute.\n<tool> calc (1+2) </tool>\n", Turn("tool", "calc", "1+2", "")),
    ("<tool>calc((1+2)*(3+4))</tool>", Turn("tool", "calc", "(1+2)*(3+4)", "")),
    ("<tool>calc()</tool>", Turn("tool", "calc", "", "")),
    ("<tool>a_b(x)(y)</tool>", Turn("tool", "a_b", "x)(y", "")),
    ("<tool>a(1)</tool> then <tool>b(2)</tool>", Turn("tool", "a", "1", "")),
    ("<tool>calc(6*7)</tool>\nAnswer: 42", Turn("tool", "calc", "6*7", "")),
    ("Answer: 42", Turn("answer", "", "", "42")),
    ("So the final answer: 7 ", Turn("answer", "", "", "7")),
    ("It is \\boxed{5}.", Turn("answer", "", "", "5")),
    ("Answer: 1\nAnswer: 2\n", Turn("answer", "", "", "2")),
    ("calc(1)</tool>\nAnswer: 3", Turn("answer", "", "", "3")),
    ("", Turn("none", "", "", "")),
    ("hello", Turn("none", "", "", "")),
    ("Answer:", Turn("none", "", "", "")),
    ("<tool>calc(1+2)", Turn("malformed", "", "", "")),
    ("<tool>calc(1+2)</tool", Turn("malformed", "", "", "")),
    ("<tool>Calc(1)</tool>", Turn("malformed", "", "", "")),
    ("<tool>calc2(1)</tool>", Turn("malformed", "", "", "")),
    ("<tool>calc(1) and more</tool>", Turn("malformed", "", "", "")),
    ("<tool>calc 1</tool>", Turn("malformed", "", "", "")),
    ("<tool>(1)</tool>", Turn("malformed", "", "", "")),
    ("<tool></tool>", Turn("malformed", "", "", "")),
    ("<tool>calc(1 <tool>calc(2)</tool>", Turn("malformed", "", "", "")),
    ("<tool><tool>calc(1)</tool></tool>", Turn("malformed", "", "", "")),
    ("<tool>\nAnswer: 5", Turn("malformed", "", "", "")),
])
def test_parse_turn(text, turn):
  assert parse_turn(text) == turn


def test_parse_turn_reads_a_bounded_prefix():
  call = "<tool>calc(1)</tool>"
  limit = env_base.MAX_TURN_CHARS
  assert parse_turn("x" * (limit - len(call)) + call).kind == "tool"
  assert parse_turn("x" * (limit - len(call) + 1) + call).kind == "malformed"
  assert parse_turn("x" * limit + call).kind == "none"
  assert parse_turn("x" * limit + "Answer: 3").kind == "none"
  assert parse_turn(None) == parse_turn(17) == Turn("none", "", "", "")


def test_excerpt_and_values():
  assert env_base.excerpt("short") == "short"
  assert env_base.excerpt("a\nb\tc") == "a b c"
  long = env_base.excerpt("y" * 500)
  assert long == "y" * env_base.MAX_ECHO_CHARS + "..."
  assert env_base.format_value(Fraction(42)) == "42"
  assert env_base.format_value(Fraction(-7, 2)) == "-7/2"
  assert env_base.format_value(Fraction(10 ** 70)) == "about 1e+70"
  assert env_base.format_value(Fraction(10 ** 400)) == "a number too large to show"


class _Toy(env_base.Environment):
  """An environment whose tool misbehaves on demand."""
  name = "toy"
  bin_names = ("only",)
  tool_names = ("echo",)
  call_example = "echo(hi)"

  def _make(self, seed, difficulty):
    return Problem(task=self.name, difficulty=difficulty, prompt="Say 1.\n", question="Say 1.",
                   answer="1", target="Answer: 1", seed=seed)

  def _check(self, problem, answer):
    return env_base.check_number(problem, answer)

  def _call(self, problem, state, name, argument):
    if argument == "raise":
      raise RuntimeError("a bug in a tool")
    if argument == "long":
      return "line\n" * 200, True
    state["seen"] = argument
    return f"echo {env_base.excerpt(argument)}", True


def test_step_guard_and_bounds(caplog):
  env = _Toy()
  p = env.generate(0, 0)
  state = env.reset(p)
  error = Step(env_base.ERROR_OBSERVATION, 0.0, False, False, False, False, error=True)
  env_base._REPORTED.discard(("_Toy", "RuntimeError"))  # pylint: disable=protected-access
  with caplog.at_level("WARNING", logger=env_base.__name__):
    assert env.step(p, state, "<tool>echo(raise)</tool>") == (state, error)
    assert env.step(p, state, "<tool>echo(raise)</tool>") == (state, error)
  # A failing tool is the environment's bug: counted on every turn, logged once, with its error.
  logged = [r for r in caplog.records if "raised RuntimeError" in r.getMessage()]
  assert len(logged) == 1 and "a bug in a tool" in str(logged[0].exc_info[1])
  assert env.step(p, {"turn": object()}, "<tool>echo(x)</tool>")[1] == error
  assert env.step(p, None, "Answer: 1")[1] == error
  new_state, step = env.step(p, state, "<tool>echo(long)</tool>")
  assert len(step.observation) == env_base.MAX_OBSERVATION_CHARS and "\n" not in step.observation
  # Cut from its middle: its head and its tail (what a tool reports last) survive.
  assert step.observation.startswith("line line") and step.observation.endswith("line ")
  assert " ... " in step.observation
  new_state, step = env.step(p, state, "<tool>echo(x)</tool>")
  assert new_state == {"turn": 1, "seen": "x"} and state == {"turn": 0}
  assert step == Step("echo x", 0.0, False, True, True, False)
  assert env.step(p, state, "Answer: 1")[1] == Step("", 1.0, True, False, True, True)
  assert env.step(p, state, "Answer: 2")[1] == Step("", 0.0, True, False, True, False)
  assert env.step(p, state, "Answer: one")[1] == Step("", 0.0, True, False, False, False)
  assert env.step(p, state, b"Answer: 1")[1].done is False  # not a str: read as empty
  _, step = env.step(p, state, "<tool>other(1)</tool>")
  assert step.observation == "Unknown tool 'other'. The only tool is echo: <tool>echo(hi)</tool>."
