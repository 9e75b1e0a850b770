"""Verifiable tasks in difficulty bins, their verifiers, and the data sets behind them.

  task = get_task("arithmetic", template="plain")   # or "countdown", "zebra", "arc1d",
                                                    #    "gsm8k", "math"
  task = get_task("countdown+zebra+arc1d")          # several tasks as one (`mixture`)
  task = get_task("countdown+arc1d", task_options={"arc1d": {"num_shots": 1}})
  problem = task.generate(seed, difficulty)
  score = task.score(problem, completion)           # Score(reward, correct, formatted)

See `base` for the protocol and templates, docs/tasks.md for the bins, sizes and example prompts.
`gsm8k` and `math` import TFDS and read data from disk (see `math_datasets`); the procedural tasks
need nothing but NumPy. `calculator`, `countdown_tool` and `guess` are multi-turn environments with
tools (`rl_curriculum.environments`, docs/environments.md).
"""

from typing import Mapping, Optional

from rl_curriculum.tasks.arc1d import Arc1dTask
from rl_curriculum.tasks.arithmetic import ArithmeticTask
from rl_curriculum.tasks.base import DEFAULT_FORMAT_BONUS, Problem, Score, Task
from rl_curriculum.tasks.countdown import CountdownTask
from rl_curriculum.tasks.mixture import SEPARATOR, MixtureTask
from rl_curriculum.tasks.zebra import ZebraTask

__all__ = ["get_task", "TASKS", "Task", "MixtureTask", "Problem", "Score", "DEFAULT_FORMAT_BONUS"]

# name -> class, or "module:class" for the data-set tasks, imported on first use (TFDS import
# takes about a second).
TASKS = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "zebra": ZebraTask,
    "arc1d": Arc1dTask,
    "gsm8k": "rl_curriculum.tasks.math_datasets:Gsm8kTask",
    "math": "rl_curriculum.tasks.math_datasets:MathTask",
    # Multi-turn environments with tools (rl_curriculum.environments).
    "calculator": "rl_curriculum.environments.calculator:CalculatorEnv",
    "countdown_tool": "rl_curriculum.environments.countdown_tool:CountdownToolEnv",
    "guess": "rl_curriculum.environments.guessing:GuessingEnv",
}


def get_task(name: str, *, task_options: Optional[Mapping[str, Mapping]] = None,
             **options) -> Task:
  """The task called `name`, built with `options` (template, format_bonus, task-specific ones).
  Names joined by "+" ("countdown+zebra") give the `MixtureTask` of those tasks, each built with
  `options`. `task_options` adds the options of single tasks by name, e.g.
  `get_task("countdown+arc1d", task_options={"arc1d": {"num_shots": 1}})`.

  Raises:
    KeyError: unknown name, or `task_options` for a task `name` does not name.
    ValueError: a mixture that names a task twice, or fewer than two.
    TypeError: an option the task does not take.
    math_datasets.DataNotFoundError: gsm8k/math data not found (fails fast, says where to put it).
  """
  parts = name.split(SEPARATOR)
  extra = dict(task_options or {})
  stray = sorted(set(extra) - set(parts))
  if stray:
    raise KeyError(f"task_options name {stray}, which {name!r} does not")
  if len(parts) > 1:
    return MixtureTask([get_task(part, **options, **dict(extra.get(part, {})))
                        for part in parts])
  options = {**options, **dict(extra.get(name, {}))}
  if name not in TASKS:
    raise KeyError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
  cls = TASKS[name]
  if isinstance(cls, str):
    import importlib  # pylint: disable=g-import-not-at-top
    module, attr = cls.split(":")
    cls = getattr(importlib.import_module(module), attr)
  return cls(**options)
