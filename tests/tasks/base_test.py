"""Tests for rl_curriculum/tasks/base.py: answer extraction rules and the scoring guard."""

import pytest

from rl_curriculum.tasks import base


@pytest.mark.parametrize("text, expected", [
    ("19", "19"), ("  19  \nmore", "19"), ("", None), ("\n19", None), ("   ", None),
])
def test_extract_plain(text, expected):
  assert base.extract_answer(text, "plain") == expected


@pytest.mark.parametrize("text, expected", [
    ("Answer: 5", "5"), ("ANSWER:5\n", "5"), ("Final answer: 5 apples\nthanks", "5 apples"),
    ("Answer: 1\nAnswer: 2", "2"), ("\\boxed{7}", "7"), ("Answer: 3 then \\boxed{4}", "4"),
    ("\\boxed{4}\nAnswer: 3", "3"), ("Answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{a{b}c}", "a{b}c"), ("\\boxed{1} \\boxed{2", None), ("no marker", None),
    ("Answer:", None), ("Answer:   \n5", None), ("\\fbox{9}", "9"), ("\\boxed 9", None),
    ("Answer\uff1a 6", "6"),
])
def test_extract_chat(text, expected):
  assert base.extract_answer(text, "chat") == expected


def test_extract_rejects_unknown_template():
  with pytest.raises(ValueError):
    base.extract_answer("x", "fancy")


def test_score_guard_turns_bugs_into_zero():
  class Broken(base.Task):
    name = "broken"
    bin_names = ("only",)

    def _check(self, problem, answer):
      raise RuntimeError("verifier bug")

  p = base.Problem(task="broken", difficulty=0, prompt="", question="", answer="1", target="1")
  assert Broken().score(p, "1") == base.Score(0.0, False, False)


def test_score_batch():
  from rl_curriculum.tasks import get_task  # pylint: disable=g-import-not-at-top
  task = get_task("arithmetic")
  ps = [task.generate(s, 0) for s in range(3)]
  rewards, correct, formatted = task.score_batch(ps, [ps[0].answer, "x", "-1"])
  assert rewards.tolist() == pytest.approx([1.0, 0.0, 0.1])
  assert correct.tolist() == [True, False, False] and formatted.tolist() == [True, False, True]
  with pytest.raises(ValueError):
    task.score_batch(ps, ["1"])


def test_rng_for_is_stable():
  a = base.rng_for("t", 3, 1).integers(0, 1 << 30, size=4)
  b = base.rng_for("t", 3, 1).integers(0, 1 << 30, size=4)
  c = base.rng_for("t", 4, 1).integers(0, 1 << 30, size=4)
  assert (a == b).all() and (a != c).any()
  assert base.hash_str("abc") == 440920331  # FNV-1a 32-bit of "abc"
