"""Properties every environment must have, for every level: the Task side (generation, prompts,
single-turn score) and the episode side (reset, step purity, the turn format's fixed replies)."""

import copy
import json

import pytest

from rl_curriculum.environments import ENVIRONMENTS, Environment, Step, get_environment
from rl_curriculum.environments.examples.unit_convert import UnitConvertEnv
from rl_curriculum.tasks.base import TEMPLATES, Score

MAKERS = {**ENVIRONMENTS, "unit_convert": UnitConvertEnv}
ALL_LEVELS = [(name, level) for name, cls in MAKERS.items()
              for level in range(len(cls.bin_names))]
IDS = [f"{name}-{level}" for name, level in ALL_LEVELS]
SEEDS = range(200)


def _env(name, **options) -> Environment:
  return MAKERS[name](**options)


@pytest.mark.parametrize("name, level", ALL_LEVELS, ids=IDS)
def test_generation_is_deterministic_and_prompts_unique(name, level):
  first = [_env(name).generate(s, level) for s in SEEDS]
  again = [_env(name).generate(s, level) for s in SEEDS]
  assert first == again
  assert all(p.task == name and p.difficulty == level and p.seed == s
             for s, p in zip(SEEDS, first))
  assert len({p.prompt for p in first}) == len(first)
  for p in first[:5]:
    assert p.prompt == p.question + "\n"
    assert json.loads(json.dumps(dict(p.meta))) == dict(p.meta)


@pytest.mark.parametrize("name", MAKERS)
def test_prompts_for_both_templates(name):
  chat = _env(name, template="chat")
  plain = _env(name)
  p = plain.generate(3, 1)
  assert p == chat.generate(3, 1)
  messages = chat.prompt_messages(p)
  assert messages == [{"role": "user", "content": p.question}]
  content = messages[0]["content"]
  assert p.prompt.endswith("\n") and p.prompt.rstrip("\n") == content
  if plain.tool_names:
    assert f"<tool>{plain.tool_names[0]}(" in content and "Answer: <" in content
  for template in TEMPLATES:
    assert _env(name, template=template).prompt_messages(p) == messages


@pytest.mark.parametrize("name", MAKERS)
def test_single_turn_score(name):
  for template in TEMPLATES:
    env = _env(name, template=template)
    for level in range(env.num_difficulties):
      p = env.generate(7, level)
      move = p.target.split(":", 1)[0]  # "Answer", or "Guess" for the guessing game
      assert env.score(p, f"I think so.\n{move}: {p.answer}") == Score(1.0, True, True)
      assert env.score(p, "no answer here") == Score(0.0, False, False)
      # A tool call is never a final answer, whatever else the turn says.
      assert env.score(p, f"<tool>calc(1)</tool>\n{move}: {p.answer}") == Score(0.0, False, False)
      assert env.score(p, None) == Score(0.0, False, False)


@pytest.mark.parametrize("name", MAKERS)
def test_reset_is_deterministic_and_small(name):
  env = _env(name)
  p = env.generate(1, 0)
  state = env.reset(p, seed=0)
  assert state == env.reset(p, seed=0) == env.reset(env.generate(1, 0), seed=0)
  assert state["turn"] == 0
  assert json.loads(json.dumps(state)) == state


def _turns(env, problem):
  call = f"<tool>{env.call_example}</tool>" if env.tool_names else "<tool>calc(1)</tool>"
  return [call, "hello", "<tool>calc(1+2", "<tool>nope(1)</tool>", f"Answer: {problem.answer}",
          "Answer: not a number", "Guess: 3", ""]


@pytest.mark.parametrize("name", MAKERS)
def test_step_is_pure(name):
  env = _env(name)
  p = env.generate(2, 1)
  state = env.reset(p, 0)
  for text in _turns(env, p):
    before = copy.deepcopy(state)
    new_state, step = env.step(p, state, text)
    assert state == before, text
    assert env.step(p, before, text) == (new_state, step)
    assert new_state is not state and new_state["turn"] == state["turn"] + 1
    assert isinstance(step, Step)
    if not step.done:
      state = new_state


@pytest.mark.parametrize("name", MAKERS)
def test_fixed_replies(name):
  env = _env(name)
  p = env.generate(4, 0)
  state = env.reset(p, 0)
  _, step = env.step(p, state, "Let me think about it first.")
  assert step == Step(step.observation, 0.0, False, False, False, False)
  assert "Answer:" in step.observation or "Guess:" in step.observation
  _, step = env.step(p, state, "<tool>no_such_tool(1)</tool>")
  assert step == Step(step.observation, 0.0, False, True, False, False)
  assert "no_such_tool" in step.observation or "no tools" in step.observation
  for malformed in ("<tool>calc(1+2", "<tool>Calc(1)</tool>", "<tool>calc(1) x</tool>",
                    "<tool><tool>calc(1)</tool></tool>", "<tool>(1)</tool>",
                    "<tool>calc</tool> Answer: 3"):
    _, step = env.step(p, state, malformed)
    assert step == Step(step.observation, 0.0, False, True, False, False), malformed
    assert "<tool>" in step.observation or "no tools" in step.observation


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_target_and_registry(name):
  env = get_environment(name)
  assert type(env) is ENVIRONMENTS[name]
  for level in range(env.num_difficulties):
    p = env.generate(0, level)
    assert p.target.startswith(("Answer: ", "Guess: "))
    assert env.max_turns(p) >= 2
