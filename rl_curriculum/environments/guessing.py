"""`guess`: find a hidden whole number from "too low" / "too high" replies, over several turns.

Levels (difficulty index: name, range): 0 `l0` [1, 8], 1 `l1` [1, 64], 2 `l2` [1, 512]; a binary
search needs at most 4, 7 and 10 guesses. The hidden number is drawn from
`base.rng_for("guess", seed, level)`; the prompt shows a game number drawn from another stream of
the same seed (`environments.base.problem_id`), so prompts differ between seeds while saying
nothing about the hidden number.

Moves. This game has no tools: a turn with a `<tool>` tag is answered "This game has no tools"
(tool_call True, well_formed False). Otherwise the move is the text after the last "Guess:" or
"Answer:" marker on its line (one rule for both markers, case-insensitive), which must hold one
whole number (`parsing.extract_number`). The reply is "N is too low", "N is too high", or "N is
out of range" (all well formed, reward 0); a correct guess ends the episode with reward 1.0. A
wrong "Answer:" is a wrong guess like any other: it does not end the episode. The state keeps
the guesses made, in order.

`Problem.answer` is the hidden number; `Problem.target` is the one-turn completion
"Guess: <middle of the range>", the first move of a binary search (one turn cannot know more),
so the single-turn `score` of the target is correct only when the hidden number is the middle.
"""

import math
import re
from typing import Optional

from rl_curriculum.environments import base as env_base
from rl_curriculum.tasks import base, parsing

__all__ = ["GuessingEnv", "LEVELS", "RANGES", "GUESS_MARKER", "read_move"]

LEVELS = ("l0", "l1", "l2")
RANGES = (8, 64, 512)
GUESS_MARKER = "Guess:"
_MOVE = re.compile(r"(?:guess|answer)\s*[:\uff1a]", re.IGNORECASE)


def read_move(text: str) -> Optional[str]:
  """The text after the last "Guess:" or "Answer:" marker up to the end of its line, stripped;
  None when there is no marker (or nothing after it)."""
  if not isinstance(text, str):
    return None
  text = text[:env_base.MAX_TURN_CHARS]
  matches = list(_MOVE.finditer(text))
  if not matches:
    return None
  move = text[matches[-1].end():].split("\n", 1)[0].strip()
  return move or None


def _whole(move: str) -> Optional[int]:
  value = parsing.extract_number(move)
  return int(value) if value is not None and value.denominator == 1 else None


class GuessingEnv(env_base.Environment):
  """Guess the hidden number; see the module docstring."""
  name = "guess"
  bin_names = LEVELS
  answer_kind = "number"
  turn_budget = 11  # `max_turns` of the largest range

  def _make(self, seed: int, difficulty: int) -> base.Problem:
    high = RANGES[difficulty]
    hidden = int(base.rng_for(self.name, seed, difficulty).integers(1, high + 1))
    middle = (1 + high) // 2
    question = (
        f"Game #{env_base.problem_id(self.name, seed, difficulty)}. I am thinking of a whole "
        f"number from 1 to {high}. Find it in as few turns as you can.\n"
        f"Each turn, write one line '{GUESS_MARKER} <number>'. I reply whether your number is too "
        f"low or too high, and the game ends when you guess it; for example '{GUESS_MARKER} "
        f"{middle}' gets the reply \"{middle} is too low\" when the number is larger than "
        f"{middle}. This game has no tools.")
    return base.Problem(task=self.name, difficulty=difficulty, prompt=question + "\n",
                        question=question, answer=str(hidden),
                        target=f"{GUESS_MARKER} {middle}", seed=seed,
                        meta={"low": 1, "high": high, "hidden": hidden})

  def split_key(self, problem: base.Problem) -> str:
    """The hidden number: a held-out game hides a number no training game of any range hides
    (prompts differ only by a game id, so a prompt split would train on every hidden number)."""
    return f"{self.name}:{problem.meta['hidden']}"

  def reset(self, problem: base.Problem, seed: int = 0) -> dict:
    return {**super().reset(problem, seed), "guesses": []}

  def max_turns(self, problem: base.Problem) -> int:
    """One turn more than a binary search needs at worst (ceil(log2(high)) + 1 guesses): 5, 8
    and 11 turns on the three levels (`turn_budget` is the largest)."""
    return math.ceil(math.log2(problem.meta["high"])) + 2

  def format_hint(self) -> str:
    return f"Write one line '{GUESS_MARKER} <number>'."

  def extract(self, completion):
    if env_base.parse_turn(completion).kind in ("tool", "malformed"):
      return None
    return read_move(completion)

  def _solution(self, problem):
    """Binary search: the middle of the range left, until the hidden number."""
    low, high, hidden = problem.meta["low"], problem.meta["high"], problem.meta["hidden"]
    moves = []
    while True:
      guess = (low + high) // 2
      moves.append(f"Guess: {guess}")
      if guess == hidden:
        return moves
      low, high = (guess + 1, high) if guess < hidden else (low, guess - 1)

  def _check(self, problem, answer):
    guess = _whole(answer)
    return guess == problem.meta["hidden"], guess is not None

  def _turn(self, problem, state, text):
    if env_base.parse_turn(text).kind in ("tool", "malformed"):
      return env_base.Step(f"This game has no tools. {self.format_hint()}", 0.0, False, True,
                           False, False)
    move = read_move(text)
    if move is None:
      return env_base.Step(f"No guess found. {self.format_hint()}", 0.0, False, False, False,
                           False)
    guess = _whole(move)
    if guess is None:
      return env_base.Step(f"Could not read one whole number in '{env_base.excerpt(move)}'. "
                           f"{self.format_hint()}", 0.0, False, False, False, False)
    state["guesses"] = list(state.get("guesses", [])) + [guess]
    low, high, hidden = problem.meta["low"], problem.meta["high"], problem.meta["hidden"]
    if guess == hidden:
      return env_base.Step("", 1.0, True, False, True, True)
    if not low <= guess <= high:
      return env_base.Step(f"{guess} is out of range: the number is from {low} to {high}", 0.0,
                           False, False, True, False)
    return env_base.Step(f"{guess} is too {'low' if guess < hidden else 'high'}", 0.0, False,
                         False, True, False)
