"""The environments in the task registry, alone and in mixtures, and the lookup functions."""

import dataclasses

import numpy as np
import pytest

from rl_curriculum import environments
from rl_curriculum.environments import (ENVIRONMENTS, Environment, environment_for,
                                        get_environment, is_environment)
from rl_curriculum.tasks import MixtureTask, get_task
from rl_curriculum.tasks.data import make_pool


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_get_task_builds_each_environment(name):
  for template in ("plain", "chat"):
    task = get_task(name, template=template)
    assert type(task) is ENVIRONMENTS[name] and task.template == template
    assert is_environment(task) and environment_for(task, task.generate(0, 0)) is task
  assert get_task(name, format_bonus=0.0).format_bonus == 0.0


def test_get_environment():
  assert isinstance(get_environment("guess", template="chat"), environments.GuessingEnv)
  assert not get_environment("countdown_tool", use_all=False).use_all
  with pytest.raises(KeyError, match="calculator"):
    get_environment("abacus")
  with pytest.raises(TypeError):
    get_environment("calculator", use_all=True)


def test_mixture_of_environments():
  task = get_task("calculator+countdown_tool+guess", template="chat")
  assert isinstance(task, MixtureTask) and is_environment(task)
  assert task.bin_names == ("calculator/l0", "calculator/l1", "calculator/l2",
                            "countdown_tool/n3", "countdown_tool/n4", "countdown_tool/n5",
                            "guess/l0", "guess/l1", "guess/l2")
  assert task.train_bins == tuple(range(9)) and task.bin_of("guess", "l1") == 7
  problems = [task.generate(s, b) for b in range(9) for s in range(3)]
  for p in problems:
    env = environment_for(task, p)
    assert env is task.parts[p.task] and env.name == task.task_of(p.difficulty)
    assert task.prompt_messages(p) == env.prompt_messages(p)
    # A mixture's problem steps as its environment's own problem does.
    local = dataclasses.replace(p, difficulty=task.local_bin(p.difficulty))
    assert local == env.generate(p.seed, local.difficulty)
    for text in (p.target, "<tool>calc(2*3)</tool>", "Guess: 1", "hmm"):
      assert env.step(p, env.reset(p, 0), text) == env.step(local, env.reset(local, 0), text)
    if p.task != "guess":
      assert task.score(p, p.target).correct
  pool = make_pool(problems, encode=lambda s: [ord(c) % 251 + 1 for c in s], pad_id=0,
                   bins=task.train_bins,
                   bin_arms=[task.task_names.index(task.task_of(b)) for b in task.train_bins])
  assert pool.num_arms == 3
  np.testing.assert_array_equal(pool.arms, np.repeat([0, 1, 2], 9))


def test_mixture_with_single_turn_tasks():
  task = get_task("countdown+calculator")
  assert not is_environment(task)
  calc = task.generate(0, task.bin_of("calculator", "l1"))
  assert isinstance(environment_for(task, calc), environments.CalculatorEnv)
  with pytest.raises(ValueError, match="countdown"):
    environment_for(task, task.generate(0, 0))
  env = get_environment("calculator")
  with pytest.raises(ValueError):
    environment_for(env, get_environment("guess").generate(0, 0))
  assert not is_environment(get_task("arithmetic")) and not isinstance(task, Environment)
  with pytest.raises(ValueError):
    get_task("calculator+guess", task_options={"guess": {"format_bonus": 0.0}})
