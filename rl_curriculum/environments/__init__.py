"""Multi-turn environments with tools: tasks whose problems are played as episodes.

  env = get_environment("calculator", template="chat")   # or "countdown_tool", "guess"
  problem = env.generate(seed=0, difficulty=2)           # a Task's problem, in levels
  state = env.reset(problem, seed=0)
  state, step = env.step(problem, state, "<tool>calc(835*941)</tool>")   # Step(observation, ...)
  task = get_task("calculator+guess")                    # a mixture of environments
  is_environment(task)                                   # True
  environment_for(task, task.generate(0, 4)).name        # "guess"

See `base` for the turn format, rewards and the Step contract, docs/environments.md for the levels,
example episodes and how to add an environment. Every environment is also registered in
`rl_curriculum.tasks.TASKS`, so the task machinery (splits, pools, curriculum arms) takes them.
"""

from rl_curriculum.environments.base import Environment, Step, Turn, parse_turn
from rl_curriculum.environments.calculator import CalculatorEnv
from rl_curriculum.environments.countdown_tool import CountdownToolEnv
from rl_curriculum.environments.guessing import GuessingEnv
from rl_curriculum.tasks.base import Problem, Task
from rl_curriculum.tasks.mixture import MixtureTask

__all__ = [
    "ENVIRONMENTS", "Environment", "Step", "Turn", "parse_turn", "get_environment",
    "is_environment", "environment_for", "CalculatorEnv", "CountdownToolEnv", "GuessingEnv",
]

ENVIRONMENTS = {
    "calculator": CalculatorEnv,
    "countdown_tool": CountdownToolEnv,
    "guess": GuessingEnv,
}


def get_environment(name: str, **options) -> Environment:
  """The environment called `name`, built with `options` (template, format_bonus, its own ones).

  Raises:
    KeyError: unknown name (mixtures are built by `tasks.get_task("calculator+guess")`).
    TypeError: an option the environment does not take.
  """
  if name not in ENVIRONMENTS:
    raise KeyError(f"unknown environment {name!r}; known environments: {sorted(ENVIRONMENTS)}")
  return ENVIRONMENTS[name](**options)


def is_environment(task: Task) -> bool:
  """True for an `Environment`, and for a mixture whose parts are all environments (a mixture
  with single-turn tasks among its parts is a single-turn task)."""
  if isinstance(task, MixtureTask):
    return all(isinstance(part, Environment) for part in task.parts.values())
  return isinstance(task, Environment)


def environment_for(task: Task, problem: Problem) -> Environment:
  """The environment that plays `problem`: `task` itself, or the part of a mixture named
  `problem.task` (its `step` reads no difficulty, so the mixture's problem steps as it is).

  Raises:
    ValueError: `problem` is not one of `task`'s problems, or its task is not an environment.
  """
  if isinstance(task, MixtureTask):
    env = task.parts.get(problem.task)
  else:
    env = task if problem.task == task.name else None
  if not isinstance(env, Environment):
    raise ValueError(f"no environment plays {problem.task!r} problems in task {task.name!r}")
  return env
