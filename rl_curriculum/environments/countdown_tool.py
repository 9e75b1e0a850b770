"""`countdown_tool`: the countdown puzzle with an `eval` tool that checks a candidate expression.

Levels 0 `n3`, 1 `n4`, 2 `n5`: the puzzles of `tasks.countdown.CountdownTask` (3, 4 or 5 source
numbers in [1, 30], a reachable target in [1, 999]), drawn from this environment's own seed
stream, so that seed s gives another puzzle than countdown's seed s.

Tool: `<tool>eval(EXPRESSION)</tool>` parses EXPRESSION as countdown answers are parsed (whole
numbers, + - * /, parentheses, no unary signs, at most 128 characters) and replies with its value,
the target and whether its numbers are among the given ones, each at most once, e.g.
"eval(25-3*7) = 4 (target 24; uses numbers not given: 25)" or "eval(18-12) = 6 (target 20; uses
only given numbers)"; it says nothing else about the puzzle (with `use_all`, it does not say which
numbers are still unused). An unparseable expression is a malformed call.

The final answer (`Answer: EXPRESSION`) is checked exactly as `CountdownTask` checks it: the
expression before any "=" must equal the target and use the given numbers, each exactly once
(`use_all=True`, the default) or at most once. `Problem.target` is the one-turn completion
"Answer: <reference expression>".
"""

from collections import Counter

from rl_curriculum.environments import base as env_base
from rl_curriculum.tasks import base, countdown, parsing

__all__ = ["CountdownToolEnv", "LEVELS"]

LEVELS = countdown.BINS
_MAX_EXPRESSION_CHARS = 128
_MAX_DEPTH = 16


def _eval(numbers, target, argument: str) -> tuple[str, bool]:
  """(observation, well_formed) of the call eval(`argument`) on a puzzle."""
  parsed = parsing.parse_expression(argument, max_len=_MAX_EXPRESSION_CHARS,
                                    max_depth=_MAX_DEPTH, allow_unary=False)
  if parsed is None:
    return "eval: could not parse the expression", False
  extra = sorted((Counter(parsed.numbers) - Counter(numbers)).elements())
  uses = ("uses only given numbers" if not extra else
          f"uses numbers not given: {env_base.excerpt(' '.join(map(str, extra)), 30)}")
  expression = env_base.excerpt(argument.strip(), env_base.MAX_ECHO_CHARS - 30)
  return (f"eval({expression}) = {env_base.format_value(parsed.value)} (target {target}; "
          f"{uses})", True)


class CountdownToolEnv(env_base.Environment):
  """Countdown with an expression-checking tool; see the module docstring."""
  name = "countdown_tool"
  bin_names = LEVELS
  answer_kind = "expression"
  tool_names = ("eval",)
  call_example = "eval((2+3)*4)"
  turn_budget = 6

  def __init__(self, template: str = "plain", format_bonus: float = base.DEFAULT_FORMAT_BONUS,
               use_all: bool = True, shots: int = 0):
    super().__init__(template, format_bonus, shots)
    self.use_all = bool(use_all)
    self._puzzles = countdown.CountdownTask(template, format_bonus, use_all=use_all)
    self._puzzles.name = self.name  # its own seed stream, and problems named after this task

  def _make(self, seed: int, difficulty: int) -> base.Problem:
    puzzle = self._puzzles.generate(seed, difficulty)
    numbers, target = puzzle.meta["numbers"], puzzle.meta["target"]
    a, b = numbers[0], numbers[1]
    # A worked call on the puzzle's own numbers whose value is not the target.
    example = next(e for e, v in ((f"{a}+{b}", a + b), (f"{a}*{b}", a * b), (f"{a}-{b}", a - b))
                   if v != target)
    rule = "each exactly once" if self.use_all else "each at most once"
    question = (
        f"Puzzle #{env_base.problem_id(self.name, seed, difficulty)}. Using the numbers "
        f"{' '.join(map(str, numbers))} ({rule}) with + - * / and parentheses, write an "
        f"expression equal to {target}.\n"
        f"You can check an expression: write {env_base.TOOL_OPEN}eval(EXPRESSION)"
        f"{env_base.TOOL_CLOSE} and the next message gives its value and whether it uses only "
        f"the given numbers; for example {env_base.TOOL_OPEN}eval({example}){env_base.TOOL_CLOSE}"
        f" gets the reply \"{_eval(numbers, target, example)[0]}\".\n"
        f"Give the final answer on its own line as '{env_base.ANSWER_MARKER} <expression>'.")
    return base.Problem(task=self.name, difficulty=difficulty, prompt=question + "\n",
                        question=question, answer=puzzle.answer,
                        target=f"{env_base.ANSWER_MARKER} {puzzle.answer}", seed=seed,
                        meta=dict(puzzle.meta))

  def _solution(self, problem):
    return [f"<tool>eval({problem.answer})</tool>", f"Answer: {problem.answer}"]

  def _check(self, problem, answer):
    return self._puzzles._check(problem, answer)  # pylint: disable=protected-access

  def _call(self, problem, state, name, argument):
    del state, name
    return _eval(problem.meta["numbers"], problem.meta["target"], argument)
