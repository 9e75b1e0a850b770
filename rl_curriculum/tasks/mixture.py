"""Several tasks as one: a run that trains on Countdown, Zebra and ARC-1D together.

  task = get_task("countdown+zebra+arc1d", template="plain")
  task.bin_names[:4]            # ("countdown/n3", "countdown/n4", "countdown/n5", "zebra/2x2")
  task.bin_of("zebra", "2x3")   # 4: the mixture bin of a (task, bin) pair
  task.task_of(4)               # "zebra"
  task.local_bin(4)             # 1: zebra's own bin "2x3"
  problem = task.generate(seed=3, difficulty=4)     # zebra's problem (3, "2x3"), difficulty 4
  task.score(problem, completion)                    # scored by zebra's own verifier

Every (task, bin) pair is one bin of the mixture, in the order the tasks are named and each task's
own bin order inside, so a category curriculum over the mixture's bins has the (task, difficulty)
arms of the Self-Evolving Curriculum's multi-domain runs (Chen et al. 2025, "Self-Evolving
Curriculum for LLM Reasoning", arXiv:2505.14970), and prompt-level curricula see one pool. A
problem keeps its own task's name (`Problem.task`), which is how the mixture routes it to that
task's verifier and chat instruction; its `difficulty` is the mixture bin. The parts keep their
evaluation-only bins.

Episodes: a mixture of environments plays each problem's episode by its own part (`step`,
`max_turns`); a mixture with a single-turn task among its parts plays every problem as one turn,
scored by its part's `score`.
"""

import dataclasses
from typing import Sequence

from rl_curriculum.tasks import base

__all__ = ["SEPARATOR", "MixtureTask"]

SEPARATOR = "+"  # get_task("countdown+zebra") builds the mixture of countdown and zebra


class MixtureTask(base.Task):
  """The union of `parts` (tasks with distinct names and the same template and format bonus)."""
  name = "mixture"

  def __init__(self, parts: Sequence[base.Task]):
    parts = tuple(parts)
    if len(parts) < 2:
      raise ValueError(f"a mixture needs at least two tasks, got {len(parts)}")
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
      raise ValueError(f"a mixture names each task once, got {names}")
    if len({(p.template, p.format_bonus) for p in parts}) != 1:
      raise ValueError("the tasks of a mixture share one template and format bonus, got "
                       f"{[(p.name, p.template, p.format_bonus) for p in parts]}")
    super().__init__(parts[0].template, parts[0].format_bonus)
    self.parts = {p.name: p for p in parts}
    self.name = SEPARATOR.join(names)
    # Mixture bin -> (task name, the task's own bin).
    self._where = tuple((p.name, b) for p in parts for b in range(p.num_difficulties))
    self.bin_names = tuple(f"{t}/{self.parts[t].bin_names[b]}" for t, b in self._where)
    self.eval_only_bins = tuple(k for k, (t, b) in enumerate(self._where)
                                if b in self.parts[t].eval_only_bins)

  @property
  def task_names(self) -> tuple[str, ...]:
    return tuple(self.parts)

  def task_of(self, difficulty: int) -> str:
    """The name of the task mixture bin `difficulty` belongs to."""
    return self._where[difficulty][0]

  def local_bin(self, difficulty: int) -> int:
    """The bin, in its own task's numbering, that mixture bin `difficulty` is."""
    return self._where[difficulty][1]

  def bin_of(self, task: str, bin_name: str) -> int:
    """The mixture bin of the task's bin called `bin_name`."""
    name = f"{task}/{bin_name}"
    if name not in self.bin_names:
      raise ValueError(f"{name!r} is not a bin of {self.name}; bins: {self.bin_names}")
    return self.bin_names.index(name)

  def _part(self, problem: base.Problem) -> tuple[base.Task, base.Problem]:
    """The task that made `problem`, and the problem as that task made it (its own bin)."""
    task, local = self._where[problem.difficulty]
    if problem.task != task:
      raise ValueError(f"a {problem.task} problem in mixture bin {problem.difficulty} ({task})")
    return self.parts[task], dataclasses.replace(problem, difficulty=local)

  def _make(self, seed: int, difficulty: int) -> base.Problem:
    task, local = self._where[difficulty]
    return dataclasses.replace(self.parts[task].generate(seed, local), difficulty=difficulty)

  def prompt_messages(self, problem: base.Problem) -> list[dict]:
    task, local = self._part(problem)
    return task.prompt_messages(local)

  def split_key(self, problem: base.Problem) -> str:
    """The split key of the problem's own task."""
    task, local = self._part(problem)
    return task.split_key(local)

  @property
  def turn_budget(self) -> int:
    """The most turns an episode takes: its parts' largest, or 1 when a part is single-turn."""
    budgets = [part.turn_budget for part in self.parts.values()]
    return 1 if min(budgets) == 1 else max(budgets)

  def reset(self, problem: base.Problem, seed: int = 0) -> dict:
    if self.turn_budget == 1:
      return super().reset(problem, seed)
    task, local = self._part(problem)
    return task.reset(local, seed)

  def step(self, problem: base.Problem, state: dict, text: str) -> tuple[dict, base.Step]:
    """The step of the problem's own part (one scored turn when a part is single-turn)."""
    if self.turn_budget == 1:
      return super().step(problem, state, text)
    try:
      task, local = self._part(problem)
    except Exception:  # pylint: disable=broad-except
      return super().step(problem, state, text)  # scored as no problem of this mixture
    return task.step(local, state, text)

  def demonstration(self, problem: base.Problem) -> list[str]:
    """The solving turns of the problem's own part (its target when a part is single-turn)."""
    if self.turn_budget == 1:
      return super().demonstration(problem)
    task, local = self._part(problem)
    return task.demonstration(local)

  def max_turns(self, problem: base.Problem) -> int:
    if self.turn_budget == 1:
      return 1
    task, local = self._part(problem)
    return task.max_turns(local)

  def score(self, problem: base.Problem, completion: str) -> base.Score:
    """The score of the problem's own task; never raises (a problem that belongs to no part of
    the mixture scores as unformatted and wrong)."""
    try:
      task, local = self._part(problem)
    except Exception:  # pylint: disable=broad-except
      return base.Score(0.0, False, False)
    return task.score(local, completion)
