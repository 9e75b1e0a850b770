"""Tests of demonstrations (`Environment(shots=k)`, rl_curriculum/environments/base.py): each
environment's scripted solution solves its problems, and a prompt opens with k solved episodes
whose replies are the environment's own."""

import pytest

from rl_curriculum import environments
from rl_curriculum.environments import base as env_base

NAMES = sorted(environments.ENVIRONMENTS)


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_solves_every_level(name):
  env = environments.get_environment(name, template="chat")
  for level in range(env.num_difficulties):
    for seed in range(5):
      problem = env.generate(seed, level)
      state, total, done = env.reset(problem, 0), 0.0, False
      for text in env.demonstration(problem):
        assert not done
        state, step = env.step(problem, state, text)
        total, done = total + step.reward, step.done
      assert done and total == 1.0 and step.correct


@pytest.mark.parametrize("name", NAMES)
def test_shots_open_the_prompt_with_solved_episodes_and_their_replies(name):
  plain = environments.get_environment(name, template="chat")
  shown = environments.get_environment(name, template="chat", shots=2)
  problem = plain.generate(7, 1)
  assert plain.prompt_messages(problem) == [{"role": "user", "content": problem.question}]
  messages = shown.prompt_messages(problem)
  assert messages[-1] == {"role": "user", "content": problem.question}
  roles = [m["role"] for m in messages]
  assert all(a != b for a, b in zip(roles, roles[1:]))  # user and assistant take turns
  # Each demonstration: its question, then the solution's turns with the replies step gave.
  position = 0
  for shot in range(2):
    demo = plain.generate(env_base.DEMO_SEED - shot, 0)
    assert messages[position] == {"role": "user", "content": demo.question}
    state = plain.reset(demo, 0)
    for text in plain.demonstration(demo):
      assert messages[position + 1] == {"role": "assistant", "content": text}
      state, step = plain.step(demo, state, text)
      position += 1
      if not step.done:
        assert messages[position + 1] == {"role": "user", "content": step.observation}
        position += 1
    position += 1
  assert position == len(messages) - 1
  with pytest.raises(ValueError, match="shots must be an int >= 0"):
    environments.get_environment(name, shots=-1)
