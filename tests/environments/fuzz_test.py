"""Arbitrary and adversarial turns through `parse_turn` and every environment's `step`: no
exception, a well-typed bounded Step, and nothing executed (eval, exec, compile, processes and
sockets are replaced by recorders for the whole run)."""

import ast
import builtins
import math
import os
import pathlib
import socket
import subprocess
import sys

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from rl_curriculum import environments
from rl_curriculum.environments import ENVIRONMENTS, Step, Turn, parse_turn
from rl_curriculum.environments import base as env_base
from rl_curriculum.environments.examples.unit_convert import UnitConvertEnv

PACKAGE = pathlib.Path(environments.__file__).parent
ENVS = [cls() for cls in ENVIRONMENTS.values()] + [UnitConvertEnv()]
FUZZ = settings(max_examples=600, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_NAMES = st.one_of(st.sampled_from(["calc", "eval", "convert"]),
                   st.sampled_from(["guess", "x", "", "CALC", "__import__", "calc calc",
                                    "a" * 200]))
_ARGUMENTS = st.one_of(
    st.text(max_size=60),
    st.text(alphabet="0123456789+-*/()^. =", max_size=80),
    st.sampled_from([
        "9" * 5000, str(9 ** 9), "9" * 39 + "*" + "9" * 39, "__import__('os').system('ls')",
        "1/0", "1/(2-2)", "(" * 10000 + "1" + ")" * 10000, "2**99999", "open('/etc/passwd')",
        "lambda: 0", "3 km to m", "1e309 m to km", "-0", "\u0663\u00d7\u0664", "1/3 mm to km",
    ]),
    st.integers(-10 ** 80, 10 ** 80).map(str),
)
_CALLS = st.builds(lambda n, a: f"<tool>{n}({a})</tool>", _NAMES, _ARGUMENTS)
_NEAR_CALLS = st.one_of(
    _ARGUMENTS.map(lambda a: f"<tool>calc({a})"),                   # unterminated
    _CALLS.map(lambda c: f"<tool>{c}</tool>"),                      # nested
    st.tuples(_CALLS, st.integers(2, 400)).map(lambda t: t[0] * t[1]),   # many tags
    _ARGUMENTS.map(lambda a: f"<tool>{a}</tool>"),
    st.integers(0, 10000).map(lambda k: "<tool>" * k + "calc(1)" + "</tool>" * k),
)
_MOVES = st.one_of(
    st.builds(lambda m, a: f"{m} {a}", st.sampled_from(["Answer:", "Guess:", "answer:",
                                                        "Final answer:", "\\boxed{"]), _ARGUMENTS),
    st.integers(-10 ** 45, 10 ** 45).map(lambda n: f"Guess: {n}"),
)
_PIECE = st.one_of(_CALLS, _MOVES, _NEAR_CALLS, st.text(max_size=300),
                   st.tuples(st.text(max_size=40), _CALLS, _MOVES).map(" ".join))
TURNS = st.one_of(_PIECE, st.lists(_PIECE, min_size=2, max_size=4).map("\n".join),
                  st.builds(lambda a, b: "x" * a + b, st.integers(3900, 4100), _CALLS))


def _check_step(env, problem, state, text):
  before = repr(state)
  new_state, step = env.step(problem, state, text)
  assert repr(state) == before, "step changed its input state"
  assert isinstance(step, Step) and isinstance(new_state, dict)
  assert type(step.observation) is str and type(step.reward) is float
  assert all(type(x) is bool for x in (step.done, step.tool_call, step.well_formed,
                                        step.correct))
  assert len(step.observation) <= env_base.MAX_OBSERVATION_CHARS and "\n" not in step.observation
  assert math.isfinite(step.reward) and 0.0 <= step.reward <= 1.0
  assert step.observation != env_base.ERROR_OBSERVATION, text[:200]  # the guard never fires
  assert (not step.correct or step.done) and (step.reward == 1.0) == step.correct
  assert (step.observation == "") == step.done
  return new_state, step


@pytest.fixture
def forbidden(monkeypatch):
  """Replaces ways of running code or reaching the system; returns the calls made from the
  environments' own files (the test machinery itself may compile, e.g. for assertion messages)."""
  calls = []

  def recorder(what, original):
    def record(*args, **kwargs):
      frame = sys._getframe(1)  # pylint: disable=protected-access
      while frame is not None:
        if str(PACKAGE) in frame.f_code.co_filename:
          calls.append((what, frame.f_code.co_filename))
          raise AssertionError(f"{what} called from {frame.f_code.co_filename}")
        frame = frame.f_back
      return original(*args, **kwargs)
    return record

  for module, attr in ((builtins, "eval"), (builtins, "exec"), (builtins, "compile"),
                       (builtins, "__import__"), (builtins, "open"), (subprocess, "Popen"),
                       (os, "system"), (socket, "socket")):
    monkeypatch.setattr(module, attr, recorder(f"{module.__name__}.{attr}",
                                               getattr(module, attr)))
  return calls


def test_fuzz(forbidden):
  # The recorders see code that runs from the package's files (here a probe said to be one).
  with pytest.raises(AssertionError):
    exec(compile("eval('1')", str(PACKAGE / "probe.py"), "exec"), {})  # pylint: disable=exec-used
  assert [what for what, _ in forbidden] == ["builtins.eval"]
  forbidden.clear()
  problems = [(env, env.generate(seed, level)) for env in ENVS
              for level in range(env.num_difficulties) for seed in (0, 1)]

  @FUZZ
  @given(index=st.integers(0, len(problems) - 1),
         texts=st.lists(st.one_of(TURNS, _CALLS, _MOVES), min_size=1, max_size=4))
  def run(index, texts):
    env, problem = problems[index]
    turn = parse_turn(texts[0])
    assert isinstance(turn, Turn) and turn.kind in env_base.TURN_KINDS
    assert all(type(x) is str for x in turn)
    state = env.reset(problem, 0)
    for text in texts:
      new_state, step = _check_step(env, problem, state, text)
      if step.done:
        break
      state = new_state
    assert env.score(problem, texts[0]).reward in (0.0, env.format_bonus, 1.0)

  run()
  assert not forbidden


def test_the_sources_call_nothing_that_executes():
  """The environments' sources import no process, file or network module and call no eval."""
  banned_calls = {"eval", "exec", "compile", "__import__", "open", "getattr", "globals"}
  banned_modules = {"os", "subprocess", "socket", "shutil", "importlib", "pickle", "ctypes"}
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        assert node.func.id not in banned_calls, (path, node.lineno)
      if isinstance(node, ast.Import):
        assert not {a.name.split(".")[0] for a in node.names} & banned_modules, path
      if isinstance(node, ast.ImportFrom):
        assert (node.module or "").split(".")[0] not in banned_modules, path
