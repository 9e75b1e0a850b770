"""Properties every procedural task must have, for every bin and every template.

Deterministic generation; the reference answer scores correct; a perturbed answer scores incorrect;
arbitrary text never raises and gets a reward in {0, bonus, 1} consistent with the flags.
"""

import dataclasses
import re

from hypothesis import given, settings, strategies as st
import pytest

from rl_curriculum.tasks import get_task
from rl_curriculum.tasks.base import DEFAULT_FORMAT_BONUS, TEMPLATES, Score
import test_util

PROCEDURAL = ("arithmetic", "countdown", "zebra", "arc1d")
VARIANTS = [("arithmetic", {}), ("arithmetic", {"chain": True}), ("countdown", {}),
            ("countdown", {"use_all": False}), ("zebra", {}), ("arc1d", {})]
SEEDS = range(12)


def _bins(name, options):
  task = get_task(name, **options)
  return [(name, options, b) for b in range(task.num_difficulties)]


ALL_BINS = [x for name, options in VARIANTS for x in _bins(name, options)]
IDS = [f"{n}{'-' + '-'.join(o) if o else ''}-{b}" for n, o, b in ALL_BINS]


def _as_chat(answer):
  return f"Let me think.\nAnswer: {answer}"


def _perturb(task, problem):
  """Answers that must score incorrect (but stay in the answer format)."""
  a = problem.answer
  if task.name == "arithmetic":
    return [str(int(a) + 1), str(int(a) - 1), str(-int(a) if int(a) else 7)]
  if task.name == "countdown":
    nums = problem.meta["numbers"]
    out = [f"{a}*1" if 1 not in nums else f"{a}*2"]
    for k in (len(nums) - 1, len(nums)):
      if sum(nums[:k]) != problem.meta["target"]:
        out.append("+".join(map(str, nums[:k])))
    return out
  if task.name == "zebra":
    return [c for c in problem.meta["choices"] if c != a]
  if task.name == "arc1d":
    cells = a.split()
    flipped = list(cells)
    flipped[0] = "1" if cells[0] != "1" else "2"
    return [" ".join(flipped), " ".join(cells[:-1]), " ".join(cells + ["0"])]
  raise AssertionError(task.name)


def test_bins_and_train_split():
  for name in PROCEDURAL:
    task = get_task(name)
    assert task.num_difficulties == len(task.bin_names) >= 3
    assert set(task.train_bins) | set(task.eval_only_bins) == set(range(task.num_difficulties))
  arith = get_task("arithmetic")
  assert len(arith.train_bins) >= 6 and len(arith.eval_only_bins) >= 2


@pytest.mark.parametrize("name, options, b", ALL_BINS, ids=IDS)
def test_generation_is_deterministic(name, options, b):
  first = [get_task(name, **options).generate(s, b) for s in SEEDS]
  again = [get_task(name, **options).generate(s, b) for s in SEEDS]
  assert first == again
  assert all(p.difficulty == b and p.task == name for p in first)
  # Different seeds give (mostly) different problems.
  assert len({p.prompt for p in first}) > len(first) // 2


@pytest.mark.parametrize("name, options, b", ALL_BINS, ids=IDS)
def test_reference_correct_and_perturbed_incorrect(name, options, b):
  plain = get_task(name, **options)
  chat = get_task(name, template="chat", **options)
  for s in SEEDS:
    p = plain.generate(s, b)
    assert p == chat.generate(s, b)
    assert plain.score(p, p.target) == Score(1.0, True, True)
    assert plain.score(p, p.target + "\nmore text") == Score(1.0, True, True)
    assert chat.score(p, _as_chat(p.answer)) == Score(1.0, True, True)
    assert chat.score(p, f"\\boxed{{{p.answer}}}") == Score(1.0, True, True)
    # Plain completions without the chat marker are not formatted for the chat template.
    assert chat.score(p, p.answer) == Score(0.0, False, False)
    for wrong in _perturb(plain, p):
      assert plain.score(p, wrong) == Score(DEFAULT_FORMAT_BONUS, False, True), wrong
      assert chat.score(p, _as_chat(wrong)) == Score(DEFAULT_FORMAT_BONUS, False, True), wrong
      # The last answer counts: a correct one followed by a wrong one is wrong.
      assert not chat.score(p, _as_chat(p.answer) + "\n" + _as_chat(wrong)).correct


@pytest.mark.parametrize("name", PROCEDURAL)
def test_empty_and_unformatted(name):
  for template in TEMPLATES:
    task = get_task(name, template=template)
    p = task.generate(0, 0)
    for text in ("", " ", "\n", "Answer:", "\\boxed{}", "\\boxed{" + p.answer):
      assert task.score(p, text) == Score(0.0, False, False), (template, text)
    assert task.score(p, None) == Score(0.0, False, False)


@pytest.mark.parametrize("name", PROCEDURAL)
def test_format_bonus_option(name):
  task = get_task(name, format_bonus=0.25)
  p = task.generate(1, 0)
  wrong = _perturb(task, p)[0]
  assert task.score(p, wrong) == Score(0.25, False, True)
  assert get_task(name, format_bonus=0.0).score(p, wrong) == Score(0.0, False, True)
  with pytest.raises(ValueError):
    get_task(name, format_bonus=1.5)
  with pytest.raises(ValueError):
    get_task(name, template="fancy")
  with pytest.raises(ValueError):
    task.generate(0, task.num_difficulties)


def test_chat_messages():
  for name in PROCEDURAL:
    task = get_task(name, template="chat")
    p = task.generate(0, 1)
    messages = task.prompt_messages(p)
    assert [m["role"] for m in messages] == ["user"]
    assert p.question in messages[0]["content"] and "Answer:" in messages[0]["content"]


def test_problem_record_round_trip():
  for name in PROCEDURAL:
    p = get_task(name).generate(5, 1)
    record = p.to_record()
    assert dataclasses.replace(p) == type(p).from_record(record)
    bytes_record = {k: v.encode() if isinstance(v, str) else v for k, v in record.items()}
    assert type(p).from_record(bytes_record) == p


# ----------------------------------------------------------------------------- fuzzing

def _completion_strategy(problem):
  """Arbitrary text plus text built around the problem's own answer."""
  a = problem.answer
  numberish = st.from_regex(r"\A[-+]?[0-9,\.]{0,30}[a-z$%]{0,3}\Z")
  huge = st.integers(-10 ** 60, 10 ** 60).map(str)
  nested = st.integers(0, 500).map(lambda k: "(" * k + a + ")" * k)
  exprs = st.lists(st.sampled_from(list("0123456789+-*/()^ ") + ["**", "/0", "1/0"]),
                   max_size=60).map("".join)
  around = st.tuples(st.text(max_size=20), st.text(max_size=20)).map(
      lambda t: f"{t[0]}{a}{t[1]}")
  marked = st.one_of(st.text(max_size=80), numberish, huge, exprs, around).map(
      lambda t: f"Answer: {t}")
  boxed = st.one_of(st.text(max_size=40), nested, exprs).map(lambda t: f"\\boxed{{{t}}}")
  unicode = st.text(alphabet="\u0660\u0661\u0662\uff10\uff11\u00b2\u2212\u00d7", max_size=20)
  return st.one_of(st.text(max_size=300), numberish, huge, nested, exprs, around, marked, boxed,
                   unicode)


_TASKS = {(n, t): get_task(n, template=t) for n in PROCEDURAL for t in TEMPLATES}
_PROBLEMS = {n: [_TASKS[(n, "plain")].generate(3, b)
                 for b in range(_TASKS[(n, "plain")].num_difficulties)] for n in PROCEDURAL}


@pytest.mark.parametrize("name", test_util.fast_first(PROCEDURAL))
@settings(max_examples=2000, deadline=None)
@given(data=st.data())
def test_fuzz(name, data):
  """Any completion of any template and bin scores without raising, with consistent flags."""
  template = data.draw(st.sampled_from(TEMPLATES))
  task = _TASKS[(name, template)]
  b = data.draw(st.integers(0, task.num_difficulties - 1))
  problem = _PROBLEMS[name][b]
  text = data.draw(_completion_strategy(problem))
  score = task.score(problem, text)
  assert isinstance(score, Score)
  assert score.reward in (0.0, DEFAULT_FORMAT_BONUS, 1.0)
  assert score.correct == (score.reward == 1.0)
  assert score.formatted == (score.reward > 0.0)


def test_plain_target_is_the_answer():
  """Plain targets are the answer text (with a leading space outside arithmetic)."""
  for name in PROCEDURAL:
    task = get_task(name)
    p = task.generate(2, 0)
    assert p.target.strip() == p.answer
    assert re.search(r"\S", p.prompt)
