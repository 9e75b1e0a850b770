"""The task protocol: problems, scores, prompt templates and answer extraction.

A task is a family of verifiable problems split into difficulty bins (the curriculum's arms):

  task = get_task("arithmetic", template="plain")
  problem = task.generate(seed=3, difficulty=0)      # deterministic in (seed, difficulty, options)
  problem.prompt, problem.target                     # "4+7=", "11"  (SFT completion, no EOS)
  task.score(problem, "11")                       # Score(reward=1.0, correct=True, formatted=True)

Templates. The caller chooses how the prompt is shown to the model:

  * "plain" (models trained here from scratch): `Problem.prompt` is the whole prompt and the answer
    is the first line of the completion, stripped of surrounding white space (the decoder has
    already cut the text at EOS). `Problem.target` is the SFT completion for this template.
  * "chat" (instruct models): `Task.prompt_messages(problem)` returns [{"role": "user", "content":
    ...}] asking for the final answer as a line "Answer: <answer>" (a LaTeX `\\boxed{<answer>}` is
    accepted too). The answer is the text after the LAST marker in the completion: the rest of the
    line after the last "Answer:" (case-insensitive, "Final answer:" included), or the content of
    the last `\\boxed{...}`, whichever ends later. No marker means not formatted.
  * "chat_short" (small instruct models): the same chat messages, but asking for the final answer
    alone. The answer is the first line of the completion, or the part of it after the last "="
    or " is " when the model restates the question ("7 + 8 = 15", "83+28 is 111."). Models of
    ~100M parameters rarely follow the "Answer:" rule but do answer in that shape.

Episodes. Every task plays episodes through one protocol (`reset`, `step`, `max_turns`): a task
like those here is an episode of one turn, whose `step` scores the completion (`score`) and ends
the episode; an environment (`rl_curriculum.environments`) answers a turn with an observation and
plays on. So one rollout path serves both: a single-turn completion is a one-turn episode.

Rewards (`Score`): 1.0 when correct; `format_bonus` (default 0.1) when an answer was found in the
required format but is wrong; 0.0 otherwise. `Score.correct` is the raw correctness, never the
shaped reward. `Task.score` never raises: every check is bounded (length, nesting and magnitude
limits in `parsing`) and a last-resort guard turns any unexpected exception into an incorrect,
unformatted score.
"""

import dataclasses
import json
import re
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np


__all__ = [
    "DEFAULT_FORMAT_BONUS", "TEMPLATES", "Problem", "Score", "Step", "Task", "extract_answer",
    "extract_boxed", "chat_instruction",
]

DEFAULT_FORMAT_BONUS = 0.1
TEMPLATES = ("plain", "chat", "chat_short")
# Completions longer than this are cut (from the front) before extraction: the answer sits at the
# end in the chat format and at the start in the plain one, which reads only the first line.
MAX_COMPLETION_CHARS = 20_000
_SHORT_ANSWER_SPLIT = re.compile(r"=|\sis\s", re.IGNORECASE)
_ANSWER_MARKER = re.compile(r"(?:final\s+)?answer\s*[:：]", re.IGNORECASE)


class Score(NamedTuple):
  """Outcome of verifying one completion."""
  reward: float     # shaped reward: 1.0, format_bonus or 0.0
  correct: bool     # raw correctness of the extracted answer
  formatted: bool   # an answer was found in the required format


class Step(NamedTuple):
  """What one turn of the policy led to (`Task.step`)."""
  observation: str    # text shown to the policy before its next turn ("" when done)
  reward: float       # this turn's reward (the episode return is the sum over turns)
  done: bool          # the episode is over
  tool_call: bool     # the turn contained a tool call
  well_formed: bool   # the turn's tool call or answer parsed (False: malformed call, or neither)
  correct: bool       # the episode was solved by this turn (only ever True when done)
  error: bool = False  # the environment failed on this turn (a bug, not the policy's doing)


@dataclasses.dataclass(frozen=True)
class Problem:
  """One verifiable problem.

  `prompt` is the full plain-template prompt; `question` the task statement used inside the chat
  template; `answer` the canonical reference answer; `target` the plain-template SFT completion
  (without EOS); `meta` task-specific, JSON-serialisable data the verifier needs (e.g. countdown
  source numbers, zebra value names).
  """
  task: str
  difficulty: int          # bin index in [0, task.num_difficulties)
  prompt: str
  question: str
  answer: str
  target: str
  seed: int = 0
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def to_record(self) -> dict:
    """A flat dict of str/int fields (meta as JSON), e.g. for TFDS."""
    return {
        "task": self.task, "difficulty": int(self.difficulty), "prompt": self.prompt,
        "question": self.question, "answer": self.answer, "target": self.target,
        "seed": int(self.seed), "meta": json.dumps(dict(self.meta), sort_keys=True),
    }

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> "Problem":
    """Inverse of `to_record`; accepts bytes (as `tfds.data_source` returns for Text features)."""
    def s(x):
      return x.decode("utf-8") if isinstance(x, (bytes, np.bytes_)) else str(x)
    return cls(task=s(record["task"]), difficulty=int(record["difficulty"]),
               prompt=s(record["prompt"]), question=s(record["question"]),
               answer=s(record["answer"]), target=s(record["target"]), seed=int(record["seed"]),
               meta=json.loads(s(record["meta"])))


def chat_instruction(kind: str = "number", template: str = "chat") -> str:
  """The sentence appended to chat questions that fixes the answer format."""
  if template == "chat_short":
    return f"Reply with the {kind} only, nothing else."
  return ("Think briefly if needed, then give the final answer on the last line in the form "
          f"'Answer: <{kind}>'.")


def extract_boxed(text: str) -> Optional[str]:
  """Content of the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, else None.

  Linear in len(text). An unclosed last box yields None (not an earlier box): the model's final
  word decides.
  """
  last = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
  if last < 0:
    return None
  i = text.find("{", last)
  if i < 0 or text[last:i].strip() not in ("\\boxed", "\\fbox"):
    return None
  depth, start = 0, i + 1
  for j in range(i, len(text)):
    c = text[j]
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return text[start:j]
  return None


def _boxed_span(text: str) -> tuple[int, Optional[str]]:
  """(end position, content) of the last complete box, or (-1, None)."""
  content = extract_boxed(text)
  if content is None:
    return -1, None
  last = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
  return last + len(content) + 1, content


def extract_answer(completion: str, template: str) -> Optional[str]:
  """The answer string of a completion under `template` (see the module docstring), or None.

  plain: the first line, stripped; None when empty. chat: the text after the last marker
  ("Answer:" line or `\\boxed{}`), stripped; None when there is no marker or it is empty.
  """
  if not isinstance(completion, str):
    return None
  if template in ("plain", "chat_short"):
    line = completion[:MAX_COMPLETION_CHARS].split("\n", 1)[0].strip()
    if template == "chat_short":
      line = _SHORT_ANSWER_SPLIT.split(line)[-1].strip()
    return line or None
  if template != "chat":
    raise ValueError(f"unknown template {template!r}; expected one of {TEMPLATES}")
  text = completion[-MAX_COMPLETION_CHARS:]
  box_end, box = _boxed_span(text)
  marker_end, marker = -1, None
  matches = list(_ANSWER_MARKER.finditer(text))
  if matches:
    m = matches[-1]
    rest = text[m.end():].split("\n", 1)[0]
    marker_end, marker = m.end() + len(rest), rest
    inner = extract_boxed(rest)  # "Answer: \boxed{5}"
    if inner is not None:
      marker = inner
  answer = box if box_end > marker_end else marker
  if answer is None:
    return None
  answer = answer.strip()
  return answer or None


class Task:
  """Base class of every task; subclasses implement `_make` and `_check`.

  Attributes:
    name: registry name.
    bin_names: one short name per difficulty bin, index = difficulty.
    eval_only_bins: bins reserved for evaluation (out of distribution); never in a training pool.
    template: "plain" or "chat".
    format_bonus: reward of a formatted but wrong answer.
  """
  name: str = "task"
  bin_names: tuple[str, ...] = ()
  eval_only_bins: tuple[int, ...] = ()
  answer_kind: str = "answer"  # placeholder in the chat instruction, e.g. "number"
  turn_budget: int = 1  # the most turns an episode of this task takes (`max_turns`)

  def __init__(self, template: str = "plain", format_bonus: float = DEFAULT_FORMAT_BONUS):
    if template not in TEMPLATES:
      raise ValueError(f"unknown template {template!r}; expected one of {TEMPLATES}")
    if not 0.0 <= format_bonus < 1.0:
      raise ValueError(f"format_bonus must lie in [0, 1), got {format_bonus}")
    self.template = template
    self.format_bonus = float(format_bonus)

  @property
  def num_difficulties(self) -> int:
    return len(self.bin_names)

  @property
  def train_bins(self) -> tuple[int, ...]:
    return tuple(b for b in range(self.num_difficulties) if b not in self.eval_only_bins)

  def generate(self, seed: int, difficulty: int) -> Problem:
    """The problem for (seed, difficulty); the same arguments always give the same problem.

    Raises:
      ValueError: difficulty outside [0, num_difficulties).
    """
    difficulty = int(difficulty)
    if not 0 <= difficulty < self.num_difficulties:
      raise ValueError(f"{self.name}: difficulty {difficulty} outside [0, {self.num_difficulties})")
    return self._make(int(seed), difficulty)

  def generate_many(self, seeds: Sequence[int], difficulty: int) -> list[Problem]:
    return [self.generate(s, difficulty) for s in seeds]

  def prompt_messages(self, problem: Problem) -> list[dict]:
    """Chat messages for instruct models: one user turn with the question and format rule."""
    return [{"role": "user",
             "content": f"{problem.question}\n"
                        f"{chat_instruction(self.answer_kind, self.template)}"}]

  def score(self, problem: Problem, completion: str) -> Score:
    """Verifies `completion` (the generated text after the prompt) against `problem`.

    Never raises and never evaluates the text as code.
    """
    try:
      answer = self.extract(completion)
      if answer is None:
        return Score(0.0, False, False)
      correct, formatted = self._check(problem, answer)
    except Exception:  # pylint: disable=broad-except
      # Last-resort guard: a verifier bug must cost a reward, never the training run.
      return Score(0.0, False, False)
    correct = bool(correct)
    formatted = bool(formatted) or correct
    reward = 1.0 if correct else (self.format_bonus if formatted else 0.0)
    return Score(reward, correct, formatted)

  def split_key(self, problem: Problem) -> str:
    """What decides which split (training or held out) `problem` falls in: problems with equal
    keys always fall in the same one. The prompt by default; a task whose prompts differ in
    things that do not change the problem (an id) gives what does, so that a held-out problem
    is never a training problem under another name."""
    return problem.prompt

  def reset(self, problem: Problem, seed: int = 0) -> dict:
    """The episode's starting state: a small JSON-serialisable dict, {"turn": turns taken}."""
    del problem, seed
    return {"turn": 0}

  def step(self, problem: Problem, state: dict, text: str) -> tuple[dict, Step]:
    """(new state, Step) of the policy's turn `text`: here the one turn of a single-turn task,
    scored (`score`), which ends the episode. Pure; never raises."""
    score = self.score(problem, text)
    turn = int(state.get("turn", 0)) + 1 if isinstance(state, Mapping) else 1
    return {"turn": turn}, Step(observation="", reward=score.reward, done=True, tool_call=False,
                                well_formed=score.formatted, correct=score.correct)

  def max_turns(self, problem: Problem) -> int:
    """The turns a rollout allows `problem`'s episode (at most `turn_budget`)."""
    del problem
    return self.turn_budget

  def demonstration(self, problem: Problem) -> list[str]:
    """The turns of a policy that solves `problem`: here its one turn, `target` (what an SFT
    warm start imitates)."""
    return [problem.target]

  def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]):
    """Scores B pairs; returns (reward f32[B], correct bool[B], formatted bool[B])."""
    if len(problems) != len(completions):
      raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    scores = [self.score(p, c) for p, c in zip(problems, completions)]
    return (np.array([s.reward for s in scores], np.float32),
            np.array([s.correct for s in scores], bool),
            np.array([s.formatted for s in scores], bool))

  def extract(self, completion: str) -> Optional[str]:
    """The answer string of a completion under this task's template, or None."""
    return extract_answer(completion, self.template)

  # Subclass hooks.
  def _make(self, seed: int, difficulty: int) -> Problem:
    raise NotImplementedError

  def _check(self, problem: Problem, answer: str) -> tuple[bool, bool]:
    """(correct, formatted) for the extracted, non-empty answer string."""
    raise NotImplementedError

  def _plain_prompt(self, question: str) -> str:
    return f"{question}\nAnswer:"


def rng_for(task: str, seed: int, difficulty: int, *extra) -> "np.random.Generator":
  """A generator seeded only by its arguments (stable across processes and Python versions)."""
  key = [abs(hash_str(task)), int(difficulty) & 0xFFFFFFFF, int(seed) & 0xFFFFFFFFFFFFFFFF]
  key += [abs(hash_str(str(e))) for e in extra]
  return np.random.default_rng(key)


def hash_str(s: str) -> int:
  """A stable 32-bit hash of a string (Python's `hash` is salted per process)."""
  h = 2166136261
  for b in s.encode("utf-8"):
    h = ((h ^ b) * 16777619) & 0xFFFFFFFF
  return h
