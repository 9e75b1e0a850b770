"""`unit_convert`: lengths from one unit into another, with a `convert` tool.

The worked example of docs/environments.md ("Adding an environment"):

  env = UnitConvertEnv()
  problem = env.generate(seed=0, difficulty=0)   # "How many mm are in 918 cm?" and the tool
  state = env.reset(problem, seed=0)
  state, step = env.step(problem, state, "<tool>convert(918 cm to mm)</tool>")
  step.observation                               # "918 cm = 9180 mm"
  state, step = env.step(problem, state, "Answer: 9180")
  step.reward, step.done                         # 1.0, True

Levels: 0 `down`, a whole amount in [1, 999] of a unit into a smaller one (whole answers);
1 `up`, into a larger one (decimal answers such as 0.35). Units: mm, cm, m, km.
"""

from fractions import Fraction

from rl_curriculum.environments import base as env_base
from rl_curriculum.tasks import base, parsing

__all__ = ["UnitConvertEnv", "UNITS"]

UNITS = {"mm": 1, "cm": 10, "m": 1000, "km": 1000000}  # each unit's length in millimetres
_DECIMALS = 9


def _decimal(value: Fraction) -> str:
  """`value` as a decimal ("0.35") if it has at most `_DECIMALS` decimals, else as "a/b"."""
  scaled = abs(value) * 10 ** _DECIMALS
  if scaled.denominator != 1:
    return env_base.format_value(value)
  whole, part = divmod(scaled.numerator, 10 ** _DECIMALS)
  text = f"{whole}.{part:0{_DECIMALS}d}".rstrip("0").rstrip(".")
  return "-" + text if value < 0 else text


def _convert(argument: str) -> tuple[str, bool]:
  """(observation, well_formed) of the call convert(`argument`), e.g. "3 km to m"."""
  words = argument.split()
  if len(words) != 4 or words[2] != "to" or words[1] not in UNITS or words[3] not in UNITS:
    return f"convert: write an amount and two of {' '.join(UNITS)}, e.g. convert(2 m to cm)", False
  amount = parsing.parse_number(words[0])
  if amount is None:
    return "convert: could not read the amount", False
  value = amount * UNITS[words[1]] / UNITS[words[3]]
  return f"{env_base.excerpt(words[0], 40)} {words[1]} = {_decimal(value)} {words[3]}", True


class UnitConvertEnv(env_base.Environment):
  """Length conversion with a conversion tool; see the module docstring."""
  name = "unit_convert"
  bin_names = ("down", "up")
  answer_kind = "number"
  tool_names = ("convert",)
  call_example = "convert(2 m to cm)"
  turn_budget = 3

  def _make(self, seed: int, difficulty: int) -> base.Problem:
    rng = base.rng_for(self.name, seed, difficulty)
    small, large = (list(UNITS)[i] for i in sorted(rng.choice(len(UNITS), 2, replace=False)))
    source, dest = (large, small) if difficulty == 0 else (small, large)
    amount = int(rng.integers(1, 1000))
    answer = _decimal(Fraction(amount * UNITS[source], UNITS[dest]))
    # The id makes prompts of distinct seeds distinct: there are only 6,000 questions per level.
    question = (
        f"Problem #{env_base.problem_id(self.name, seed, difficulty)}. "
        f"How many {dest} are in {amount} {source}?\n"
        f"You can convert lengths: write {env_base.TOOL_OPEN}convert(AMOUNT UNIT to UNIT)"
        f"{env_base.TOOL_CLOSE} with units mm, cm, m, km; for example {env_base.TOOL_OPEN}"
        f"{self.call_example}{env_base.TOOL_CLOSE} gets the reply \"{_convert('2 m to cm')[0]}\".\n"
        f"Give the final answer on its own line as '{env_base.ANSWER_MARKER} <number>'.")
    return base.Problem(task=self.name, difficulty=difficulty, prompt=question + "\n",
                        question=question, answer=answer,
                        target=f"{env_base.ANSWER_MARKER} {answer}", seed=seed,
                        meta={"amount": amount, "source": source, "dest": dest})

  def _check(self, problem, answer):
    return env_base.check_number(problem, answer)

  def _call(self, problem, state, name, argument):
    del problem, state, name
    return _convert(argument)
