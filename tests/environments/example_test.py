"""The worked example (rl_curriculum/environments/examples/unit_convert.py) and the promises of
docs/environments.md: the quoted file, the example prompts and episodes, the code blocks."""

import pathlib
import re

from hypothesis import given, settings, strategies as st
import pytest

from rl_curriculum.environments import Step, get_environment
from rl_curriculum.environments import base as env_base
from rl_curriculum.environments.examples.unit_convert import UNITS, UnitConvertEnv

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "environments.md").read_text()
EXAMPLE = "rl_curriculum/environments/examples/unit_convert.py"
ENV = UnitConvertEnv()


def test_doc_quotes_the_example_file_verbatim():
  match = re.search(rf"<!-- begin {re.escape(EXAMPLE)} -->\n```python\n(.*?)```\n"
                    rf"<!-- end {re.escape(EXAMPLE)} -->", DOC, re.S)
  assert match, "docs/environments.md must quote the example between its begin/end markers"
  assert match.group(1) == (ROOT / EXAMPLE).read_text()


def test_docstring_episode():
  problem = ENV.generate(seed=0, difficulty=0)
  assert "How many mm are in 918 cm?" in problem.question
  state = ENV.reset(problem, seed=0)
  state, step = ENV.step(problem, state, "<tool>convert(918 cm to mm)</tool>")
  assert step.observation == "918 cm = 9180 mm"
  state, step = ENV.step(problem, state, "Answer: 9180")
  assert (step.reward, step.done) == (1.0, True)


@pytest.mark.parametrize("argument, observation", [
    ("3 km to m", "3 km = 3000 m"),
    ("350 m to km", "350 m = 0.35 km"),
    ("82 cm to km", "82 cm = 0.00082 km"),
    ("2.5 cm to mm", "2.5 cm = 25 mm"),
    ("1/3 mm to km", "1/3 mm = 1/3000000 km"),
    ("-4 m to cm", "-4 m = -400 cm"),
    ("  7   mm   to   mm ", "7 mm = 7 mm"),
])
def test_convert_observations(argument, observation):
  p = ENV.generate(0, 1)
  _, step = ENV.step(p, ENV.reset(p), f"<tool>convert({argument})</tool>")
  assert step == Step(observation, 0.0, False, True, True, False)


@pytest.mark.parametrize("argument", ["3 km in m", "3 km to miles", "three km to m", "3km to m",
                                      "", "1e9 m to km", "9" * 100 + " m to km"])
def test_convert_rejects(argument):
  p = ENV.generate(0, 1)
  _, step = ENV.step(p, ENV.reset(p), f"<tool>convert({argument})</tool>")
  assert step.tool_call and not step.well_formed and not step.done
  assert step.observation.startswith("convert: ")


@pytest.mark.parametrize("level", range(2))
def test_correct_episodes_and_levels(level):
  for seed in range(30):
    p = ENV.generate(seed, level)
    source, dest, amount = p.meta["source"], p.meta["dest"], p.meta["amount"]
    assert (UNITS[source] > UNITS[dest]) == (level == 0)
    state, first = ENV.step(p, ENV.reset(p, seed), f"<tool>convert({amount} {source} to {dest})"
                                                   "</tool>")
    value = first.observation.split(" = ")[1].split()[0]
    assert value == p.answer
    state, last = ENV.step(p, state, f"So it is {value}.\nAnswer: {value}")
    assert last == Step("", 1.0, True, False, True, True) and state["turn"] == 2
    wrong = ENV.step(p, ENV.reset(p), f"Answer: {value}1")[1]
    assert wrong == Step("", 0.0, True, False, True, False)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=200),
                 st.text(max_size=40).map(lambda a: f"<tool>convert({a})</tool>"),
                 st.tuples(st.integers(-10 ** 50, 10 ** 50), st.sampled_from(list(UNITS)),
                           st.sampled_from(list(UNITS) + ["in"])).map(
                               lambda t: f"<tool>convert({t[0]} {t[1]} to {t[2]})</tool>")))
def test_fuzz_a_little(text):
  p = ENV.generate(1, 1)
  state = ENV.reset(p)
  new_state, step = ENV.step(p, state, text)
  assert state == {"turn": 0} and new_state["turn"] == 1
  assert isinstance(step, Step) and len(step.observation) <= env_base.MAX_OBSERVATION_CHARS
  assert step.observation != env_base.ERROR_OBSERVATION


# ------------------------------------------------------------------------------ the page

def _blocks(kind):
  """(name, seed, level, text) of each ```text block after a `<!-- kind name seed level -->`."""
  pattern = rf"<!-- {kind} (\w+) (\d+) (\d+) -->\n```text\n(.*?)```"
  return [(n, int(s), int(l), t) for n, s, l, t in re.findall(pattern, DOC, re.S)]


def test_doc_prompts_are_generated():
  blocks = _blocks("prompt")
  assert {b[0] for b in blocks} == {"calculator", "countdown_tool", "guess"}
  for name, seed, level, text in blocks:
    assert get_environment(name).generate(seed, level).prompt == text


def test_doc_episodes_replay():
  blocks = _blocks("episode")
  assert {b[0] for b in blocks} == {"calculator", "countdown_tool", "guess"}
  for name, seed, level, text in blocks:
    env = get_environment(name)
    problem = env.generate(seed, level)
    state, step = env.reset(problem, seed), None
    for line in text.splitlines():
      key, value = line.split(":", 1)
      value = value.strip()
      if key == "policy":
        state, step = env.step(problem, state, value)
      elif key == "reply":
        assert step.observation == value and not step.done
      else:
        assert key == "end" and step.done and value == f"reward {step.reward}"


def test_doc_code_blocks_run():
  blocks = re.findall(r"```python\n(.*?)```", DOC, re.S)
  runnable = [b for b in blocks if b.startswith("from ")]  # not the quoted file, not Step
  assert len(runnable) == 2
  for block in runnable:
    namespace = {}
    exec(compile(block, "docs/environments.md", "exec"), namespace)  # pylint: disable=exec-used
    assert namespace["step"].observation in ("", "32 is too high")
