"""The environment protocol: multi-turn episodes of one problem, with tools the policy may call.

An environment is a `tasks.base.Task` (problems in difficulty levels, prompts for both templates,
single-turn `score`) that also plays episodes, host side and pure:

  env = get_environment("calculator")
  problem = env.generate(seed=0, difficulty=1)       # "What is 553*671?", the tool, the format
  state = env.reset(problem, seed=0)                 # {"turn": 0}
  state, step = env.step(problem, state, "<tool>calc(553*671)</tool>")
  step.observation                                   # "calc(553*671) = 371063"
  state, step = env.step(problem, state, "Answer: 371063")
  step.done, step.reward, step.correct               # True, 1.0, True

Turn format (one format for every template; a chat template carries it as plain text). A turn is
the policy's text for one turn, decoded, its end-of-turn token already cut; only its first
`MAX_TURN_CHARS` characters are read.

  * Tool call: `<tool>NAME(ARGUMENT)</tool>`. The first `<tool>` opens the call and the first
    `</tool>` after it closes it; what lies between, stripped of white space, must be NAME
    (`[a-z_]+`, spaces before "(" allowed), "(", ARGUMENT, ")": ARGUMENT is everything between the
    first "(" and the last ")". Any other shape (no closing tag, text after the ")", a nested
    `<tool>`, an upper-case name) is a malformed call. A turn with a `<tool>` tag is a tool turn
    even if it also holds an answer: the answer is ignored, the policy must see the result first.
  * Final answer: the text after the last "Answer:" marker on its line (`tasks.base.extract_answer`
    under the "chat" template: "Final answer:" and a last `\\boxed{...}` count too). A turn with an
    answer and no `<tool>` ends the episode.
  * Anything else is neither: the observation restates the format and the episode goes on.

A game may read its own kind of move instead of the final answer (`guess` reads "Guess: N").
Episodes end only on an answer: a rollout stops unfinished ones after `max_turns` turns, and they
return 0. The state is a small JSON-serialisable dict, {"turn": number of turns taken, ...}.

Rewards: a turn that ends the episode earns 1.0 if the answer is correct, else 0.0; every other
turn earns 0.0, so the episode's return is its correctness. Environments pay no format bonus in
episodes (`format_bonus` applies only to the inherited single-turn `score`, whose answer is read
from a one-turn completion by the same rule: "Answer: 42" is formatted, a tool call is not).

`Environment.step` never raises on any string (a last-resort guard turns an unexpected exception
into an unfinished, unrewarded step) and never executes the text: tools parse their arguments with
`tasks.parsing` (bounded recursive descent, exact fractions) and call no eval, exec, compile,
subprocess, network or file. Observations are one line of at most `MAX_OBSERVATION_CHARS`
characters (a longer one loses its middle: `middle_excerpt`) that quote at most `MAX_ECHO_CHARS`
characters of the policy's text. An exception inside `step` is a bug of the environment, not a
move of the policy: the turn gets `ERROR_OBSERVATION` and `Step.error`, and the first of each
kind is logged. `step` reads
only the problem's `answer` and `meta`, never its `difficulty`, so a mixture's problem (whose
difficulty is the mixture bin) steps the same.
"""

import copy
import json
import logging
import math
import re
from typing import NamedTuple, Optional

from rl_curriculum.tasks import base, parsing

__all__ = [
    "TOOL_OPEN", "TOOL_CLOSE", "ANSWER_MARKER", "MAX_TURN_CHARS", "MAX_ECHO_CHARS",
    "MAX_OBSERVATION_CHARS", "TURN_KINDS", "Turn", "Step", "Environment", "parse_turn", "excerpt",
    "middle_excerpt", "format_value", "problem_id", "check_number", "ERROR_OBSERVATION",
]

TOOL_OPEN = "<tool>"
TOOL_CLOSE = "</tool>"
ANSWER_MARKER = "Answer:"
MAX_TURN_CHARS = 4000
MAX_ECHO_CHARS = 80
MAX_OBSERVATION_CHARS = 300
TURN_KINDS = ("tool", "answer", "none", "malformed")
ERROR_OBSERVATION = "Error: this turn could not be processed."
_VALUE_CHARS = 60
DEMO_SEED = -1  # the demonstrations' problems: pools draw seeds >= 0
_NAME = re.compile(r"[a-z_]+")


class Turn(NamedTuple):
  """One turn, parsed (`parse_turn`)."""
  kind: str        # one of TURN_KINDS
  name: str        # the tool's name ("" unless kind == "tool")
  argument: str    # the tool's argument, as written ("" unless kind == "tool")
  answer: str      # the final answer, stripped ("" unless kind == "answer")


Step = base.Step  # what one turn led to: observation, reward, done, tool call, ... error


_NONE = Turn("none", "", "", "")
_MALFORMED = Turn("malformed", "", "", "")


def parse_turn(text: str) -> Turn:
  """The turn `text` under the format of the module docstring. Linear time; never raises."""
  if not isinstance(text, str):
    return _NONE
  text = text[:MAX_TURN_CHARS]
  start = text.find(TOOL_OPEN)
  if start < 0:
    answer = base.extract_answer(text, "chat")
    return Turn("answer", "", "", answer) if answer else _NONE
  end = text.find(TOOL_CLOSE, start + len(TOOL_OPEN))
  if end < 0:
    return _MALFORMED
  inner = text[start + len(TOOL_OPEN):end].strip()
  paren = inner.find("(")
  name = inner[:paren].strip() if paren > 0 else ""
  if TOOL_OPEN in inner or not inner.endswith(")") or not _NAME.fullmatch(name):
    return _MALFORMED
  return Turn("tool", name, inner[paren + 1:-1], "")


def excerpt(text: str, limit: int = MAX_ECHO_CHARS) -> str:
  """At most `limit` characters of `text` on one line (unprintable ones as spaces), "..." if cut."""
  head = "".join(c if c.isprintable() else " " for c in str(text)[:limit + 1])
  return head[:limit] + "..." if len(head) > limit else head


def middle_excerpt(text: str, limit: int) -> str:
  """`text` on one line (unprintable characters as spaces), at most `limit` characters: a longer
  one keeps its head and its tail around " ... ", so that what a tool reports last (its value)
  survives."""
  line = "".join(c if c.isprintable() else " " for c in str(text))
  if len(line) <= limit:
    return line
  keep = max(limit - 5, 2)
  head = (keep + 1) // 2
  return line[:head] + " ... " + line[len(line) - (keep - head):]


def format_value(value) -> str:
  """An exact number as text: "42", "-7/2"; "about 1.23457e+70" beyond `_VALUE_CHARS` chars."""
  text = str(value)
  if len(text) <= _VALUE_CHARS:
    return text
  try:
    return f"about {float(value):.6g}"
  except OverflowError:
    return "a number too large to show"


def problem_id(task: str, seed: int, difficulty: int) -> int:
  """A ten-digit number shown in a prompt so that prompts of distinct seeds differ (two of 10^4
  problems share one with probability about 0.5%); it tells nothing about the problem."""
  return int(base.rng_for(task, seed, difficulty, "id").integers(10 ** 9, 10 ** 10))


class Environment(base.Task):
  """Base class of every environment; see the module docstring for the turn format and rewards.

  Subclasses set `name`, `bin_names`, `answer_kind`, `tool_names` and `call_example`, and
  implement `_make` (the problem: `question` holds the whole user message, `prompt` the same text
  ending in "\\n"), `_check` (the final answer) and `_call` (one tool call). `reset` and `_turn`
  may be overridden for games that need more state or another move format.

  Attributes:
    tool_names: the tools a turn may call.
    call_example: one valid call, shown in format hints, e.g. "calc(2*3)".
    turn_budget: the turns a rollout allows an episode (`max_turns`; a run's rl.max_turns and
      its horizon may allow fewer). `step` ends episodes only on an answer, so the rollout stops
      unfinished ones, which earn 0.
  """
  tool_names: tuple[str, ...] = ()
  call_example: str = ""
  turn_budget: int = 4

  def __init__(self, template: str = "plain", format_bonus: float = base.DEFAULT_FORMAT_BONUS,
               shots: int = 0):
    """`shots` solved episodes (`demonstration`) open every chat prompt as earlier messages."""
    super().__init__(template, format_bonus)
    if not isinstance(shots, int) or shots < 0:
      raise ValueError(f"shots must be an int >= 0, got {shots!r}")
    self.shots = shots

  def reset(self, problem: base.Problem, seed: int = 0) -> dict:
    """The episode's starting state: a small JSON-serialisable dict. Deterministic in (problem,
    seed); the environments here keep no randomness per episode, so `seed` is unused."""
    del problem, seed
    return {"turn": 0}

  def step(self, problem: base.Problem, state: dict, text: str) -> tuple[dict, Step]:
    """(new state, Step) for the policy's turn `text`.

    Pure: `state` is never changed, and equal arguments give equal results. Never raises and
    never executes `text`; the new state's "turn" counts the turns taken.
    """
    try:
      new_state = json.loads(json.dumps(state))
      new_state["turn"] = int(new_state.get("turn", 0)) + 1
      result = self._turn(problem, new_state, text if isinstance(text, str) else "")
      done = bool(result.done)
      reward = float(result.reward)
      if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise ValueError(f"reward {reward} outside [0, 1]")
      observation = "" if done else middle_excerpt(result.observation, MAX_OBSERVATION_CHARS)
      return new_state, Step(observation, reward, done, bool(result.tool_call),
                             bool(result.well_formed), bool(result.correct) and done)
    except Exception as e:  # pylint: disable=broad-except
      # Last-resort guard: a bug in a tool must cost a turn, never the training run; it is
      # counted (Step.error, episode/tool_errors) and its first occurrence logged.
      _report_once(self, e)
      try:
        kept = copy.deepcopy(dict(state))
      except Exception:  # pylint: disable=broad-except
        kept = {}
      return kept, Step(ERROR_OBSERVATION, 0.0, False, False, False, False, error=True)

  def prompt_messages(self, problem: base.Problem) -> list[dict]:
    """One user message (the question, the tool with a worked call, and the answer format),
    after `shots` demonstrations."""
    return self.demonstration_messages() + [{"role": "user", "content": problem.question}]

  def demonstration(self, problem: base.Problem) -> list[str]:
    """The turns of a policy that solves `problem` (the subclass's `_solution`)."""
    return self._solution(problem)

  def demonstration_messages(self) -> list[dict]:
    """The chat of `shots` solved episodes of level 0 problems that no pool draws (seeds
    DEMO_SEED, DEMO_SEED - 1, ...): each question, the solving turns and the replies `step` gives
    them. Small instruct models follow a format they have seen played far more often than one
    they have only read about."""
    messages = []
    for shot in range(self.shots):
      problem = self.generate(DEMO_SEED - shot, 0)
      messages.append({"role": "user", "content": problem.question})
      state = self.reset(problem, 0)
      for text in self.demonstration(problem):
        messages.append({"role": "assistant", "content": text})
        state, step = self.step(problem, state, text)
        if step.done:
          break
        messages.append({"role": "user", "content": step.observation})
    return messages

  def extract(self, completion: str) -> Optional[str]:
    """The final answer of a one-turn completion (None for a tool call, or no answer)."""
    turn = parse_turn(completion)
    return turn.answer if turn.kind == "answer" else None

  def format_hint(self) -> str:
    """How to call a tool or answer, in one sentence."""
    return (f"Call a tool as {TOOL_OPEN}{self.call_example}{TOOL_CLOSE} or answer as "
            f"'{ANSWER_MARKER} <{self.answer_kind}>'.")

  # Subclass hooks.
  def _turn(self, problem: base.Problem, state: dict, text: str) -> Step:
    """The Step of one turn; `state` is this step's own copy (turn already counted), which the
    hook may update. The default dispatches tool calls to `_call` and answers to `_check`."""
    turn = parse_turn(text)
    if turn.kind == "tool":
      if turn.name not in self.tool_names:
        return Step(f"Unknown tool '{excerpt(turn.name)}'. {self._tools_line()}", 0.0, False,
                    True, False, False)
      observation, well_formed = self._call(problem, state, turn.name, turn.argument)
      return Step(observation, 0.0, False, True, well_formed, False)
    if turn.kind == "malformed":
      return Step(f"Malformed tool call. Write exactly {TOOL_OPEN}{self.call_example}"
                  f"{TOOL_CLOSE}: a name, its argument in parentheses, then {TOOL_CLOSE}.",
                  0.0, False, True, False, False)
    if turn.kind == "answer":
      correct, formatted = self._check(problem, turn.answer)
      return Step("", 1.0 if correct else 0.0, True, False, bool(formatted or correct),
                  bool(correct))
    return Step(f"No tool call or answer found. {self.format_hint()}", 0.0, False, False, False,
                False)

  def _solution(self, problem: base.Problem) -> list[str]:
    """The turns of a policy that solves `problem` (demonstrations)."""
    raise NotImplementedError(f"{self.name} has no demonstration; use shots=0")

  def _call(self, problem: base.Problem, state: dict, name: str,
            argument: str) -> tuple[str, bool]:
    """(observation, well_formed) of calling tool `name` (one of `tool_names`) on `argument`."""
    raise NotImplementedError

  def _tools_line(self) -> str:
    if not self.tool_names:
      return "There are no tools here."
    if len(self.tool_names) == 1:
      return f"The only tool is {self.tool_names[0]}: {TOOL_OPEN}{self.call_example}{TOOL_CLOSE}."
    return f"The tools are {', '.join(self.tool_names)}."


_REPORTED = set()  # (environment class, exception class) already logged by this process


def _report_once(env: "Environment", error: Exception) -> None:
  """Logs, with its traceback, the first exception of each kind an environment's step raised
  in this process (later ones are only counted: `Step.error`)."""
  kind = (type(env).__qualname__, type(error).__qualname__)
  if kind in _REPORTED:
    return
  _REPORTED.add(kind)
  logging.getLogger(__name__).warning(
      "environment %r raised %s in step (the turn gets the error observation and reward 0; "
      "episode/tool_errors counts every such turn; later ones are not logged)", env.name,
      type(error).__name__, exc_info=error)


def check_number(problem: base.Problem, answer: str) -> tuple[bool, bool]:
  """(correct, formatted) of an answer that must be the single number `problem.answer`."""
  value = parsing.extract_number(answer)
  if value is None:
    return False, False
  return value == parsing.parse_number(problem.answer), True
