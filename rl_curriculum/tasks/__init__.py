"""Verifiable tasks in difficulty bins, their verifiers, and the data sets behind them.

  task = get_task("arithmetic", template="plain")   # or "countdown", "zebra", "arc1d",
                                                    #    "gsm8k", "math"
  problem = task.generate(seed, difficulty)
  score = task.score(problem, completion)           # Score(reward, correct, formatted)

See `base` for the protocol and templates, docs/tasks.md for the bins, sizes and example prompts.
`gsm8k` and `math` import TFDS and read data from disk (see `math_datasets`); the procedural tasks
need nothing but NumPy.
"""

from rl_curriculum.tasks.arc1d import Arc1dTask
from rl_curriculum.tasks.arithmetic import ArithmeticTask
from rl_curriculum.tasks.base import DEFAULT_FORMAT_BONUS, Problem, Score, Task
from rl_curriculum.tasks.countdown import CountdownTask
from rl_curriculum.tasks.zebra import ZebraTask

__all__ = ["get_task", "TASKS", "Task", "Problem", "Score", "DEFAULT_FORMAT_BONUS"]

# name -> class, or "module:class" for the data-set tasks, imported on first use (TFDS import
# takes about a second).
TASKS = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "zebra": ZebraTask,
    "arc1d": Arc1dTask,
    "gsm8k": "rl_curriculum.tasks.math_datasets:Gsm8kTask",
    "math": "rl_curriculum.tasks.math_datasets:MathTask",
}


def get_task(name: str, **options) -> Task:
  """The task called `name`, built with `options` (template, format_bonus, task-specific ones).

  Raises:
    KeyError: unknown name.
    math_datasets.DataNotFoundError: gsm8k/math data not found (fails fast, says where to put it).
  """
  if name not in TASKS:
    raise KeyError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
  cls = TASKS[name]
  if isinstance(cls, str):
    import importlib  # pylint: disable=g-import-not-at-top
    module, attr = cls.split(":")
    cls = getattr(importlib.import_module(module), attr)
  return cls(**options)
