"""`calculator`: products too long to work out in one's head, with a `calc` tool.

Levels (difficulty index: name, question; operands uniform in their ranges):

  0 l0   a*b               a, b two-digit                  e.g. "What is 16*59?"         944
  1 l1   a*b               a, b three-digit                e.g. "What is 553*671?"       371063
  2 l2   a*b+c or a*b-c    a, b three-digit, c four-digit  e.g. "What is 835*941-4098?"  781637

Tool: `<tool>calc(EXPRESSION)</tool>` evaluates EXPRESSION with `parsing.parse_expression` (whole
numbers, + - * /, parentheses, unary minus, at most 128 characters) and replies
"calc(EXPRESSION) = VALUE" (an integer, or an exact fraction a/b), or "calc: could not parse the
expression" (a malformed call, as is division by zero). The final answer is correct when
`parsing.extract_number` reads exactly the value ("Answer: 944", "Answer: 944.").

`Problem.prompt` is the user message of `prompt_messages` plus "\\n"; `Problem.target` is the
one-turn completion "Answer: VALUE" (the final answer alone, not an episode with its tool call).
"""

from rl_curriculum.environments import base as env_base
from rl_curriculum.tasks import base, parsing

__all__ = ["CalculatorEnv", "LEVELS"]

LEVELS = ("l0", "l1", "l2")
_MAX_EXPRESSION_CHARS = 128
_EXAMPLE = "12*(3+4)"


def _calc(argument: str) -> tuple[str, bool]:
  """(observation, well_formed) of the call calc(`argument`)."""
  parsed = parsing.parse_expression(argument, max_len=_MAX_EXPRESSION_CHARS, allow_unary=True)
  if parsed is None:
    return "calc: could not parse the expression", False
  return (f"calc({env_base.excerpt(argument.strip())}) = "
          f"{env_base.format_value(parsed.value)}", True)


class CalculatorEnv(env_base.Environment):
  """Multiplication with a calculator tool; see the module docstring."""
  name = "calculator"
  bin_names = LEVELS
  answer_kind = "number"
  tool_names = ("calc",)
  call_example = f"calc({_EXAMPLE})"
  turn_budget = 4

  def _make(self, seed: int, difficulty: int) -> base.Problem:
    rng = base.rng_for(self.name, seed, difficulty)
    digits = 2 if difficulty == 0 else 3
    a, b = (int(x) for x in rng.integers(10 ** (digits - 1), 10 ** digits, size=2))
    expression, value = f"{a}*{b}", a * b
    if difficulty == 2:
      c = int(rng.integers(1000, 10000))
      sign = str(rng.choice(["+", "-"]))
      expression, value = f"{expression}{sign}{c}", value + c if sign == "+" else value - c
    example = f"{env_base.TOOL_OPEN}{self.call_example}{env_base.TOOL_CLOSE}"
    question = (
        f"Problem #{env_base.problem_id(self.name, seed, difficulty)}. What is {expression}?\n"
        f"You have a calculator: write {env_base.TOOL_OPEN}calc(EXPRESSION){env_base.TOOL_CLOSE} "
        "with whole numbers, + - * / and parentheses, and the result comes back in the next "
        f"message; for example {example} gets the reply \"{_calc(_EXAMPLE)[0]}\"."
        f"\nWhen you know the value, give the final answer on its own line as "
        f"'{env_base.ANSWER_MARKER} <number>'.")
    return base.Problem(task=self.name, difficulty=difficulty, prompt=question + "\n",
                        question=question, answer=str(value),
                        target=f"{env_base.ANSWER_MARKER} {value}", seed=seed,
                        meta={"expression": expression, "value": value})

  def split_key(self, problem: base.Problem) -> str:
    """The expression: a held-out problem's operands are never a training problem's (its prompt
    also holds an id, which two problems of one expression do not share)."""
    return f"{self.name}:{problem.meta['expression']}"

  def _solution(self, problem):
    return [f"<tool>calc({problem.meta['expression']})</tool>",
            f"Answer: {problem.meta['value']}"]

  def _check(self, problem, answer):
    return env_base.check_number(problem, answer)

  def _call(self, problem, state, name, argument):
    del problem, state, name
    return _calc(argument)
