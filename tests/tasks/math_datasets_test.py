"""Tests for rl_curriculum/tasks/math_datasets.py on tiny hand-made files; no network."""

import json
import time

from hypothesis import given, settings, strategies as st
import pytest

from rl_curriculum.tasks import get_task, math_datasets as md
from rl_curriculum.tasks.base import DEFAULT_FORMAT_BONUS, Score

# (subject, file stem, level, solution); "Level ?" must be skipped.
MATH_FILES = {
    "train": [("algebra", "1", "Level 1", "So $x = \\boxed{5}$."),
              ("algebra", "2", "Level 2", "Thus \\boxed{\\frac{1}{2}}."),
              ("geometry", "7", "Level ?", "\\boxed{3}")],
    "test": [("algebra", "3", "Level 1", "\\boxed{-4}"),
             ("algebra", "10", "Level 3", "We get $\\boxed{\\dfrac{3}{4}}$."),
             ("counting_and_probability", "4", "Level 4", "\\boxed{\\{1,2\\}}"),
             ("geometry", "5", "Level 5", "The side is $\\boxed{3\\sqrt{2}}$ units."),
             ("precalculus", "6", "Level 2", "\\boxed{\\text{(B)}}")],
}
GSM8K_ROWS = {
    "train": [("Tom has 3 apples and buys 4. How many?", "3+4=<<3+4=7>>7\n#### 7")],
    "test": [("A shop sells 1,200 pens a day for 5 days. How many?",
              "1200*5=<<1200*5=6000>>6000\n#### 6,000"),
             ("Half of 9?", "9/2=<<9/2=4.5>>4.5\n#### 4.5")],
}


@pytest.fixture(scope="module")
def math_manual(tmp_path_factory):
  root = tmp_path_factory.mktemp("math_manual")
  for split, rows in MATH_FILES.items():
    for subject, stem, level, solution in rows:
      folder = root / "MATH" / split / subject
      folder.mkdir(parents=True, exist_ok=True)
      (folder / f"{stem}.json").write_text(json.dumps({
          "problem": f"Problem {subject} {stem}", "level": level,
          "type": subject.replace("_", " ").title(), "solution": solution}))
  return root


@pytest.fixture(scope="module")
def gsm8k_manual(tmp_path_factory):
  root = tmp_path_factory.mktemp("gsm8k_manual")
  for split, rows in GSM8K_ROWS.items():
    with open(root / f"{split}.jsonl", "w") as f:
      for q, a in rows:
        f.write(json.dumps({"question": q, "answer": a}) + "\n")
  return root


def _fails_fast(fn, path_fragment):
  start = time.monotonic()
  with pytest.raises(md.DataNotFoundError) as err:
    fn()
  # A generous bound: the point is "not minutes of download retries".
  assert time.monotonic() - start < 5.0
  assert path_fragment in str(err.value)


def test_offline_gsm8k_fails_fast_with_instructions(tmp_path):
  _fails_fast(lambda: md.load_gsm8k("test", data_dir=str(tmp_path)), "downloads/manual/gsm8k")
  _fails_fast(lambda: get_task("gsm8k", data_dir=str(tmp_path)), "train.jsonl")


def test_offline_math_fails_fast_with_instructions(tmp_path):
  _fails_fast(lambda: md.load_math("test", data_dir=str(tmp_path)),
              "downloads/manual/hendrycks_math")
  _fails_fast(lambda: get_task("math", data_dir=str(tmp_path)), "MATH/train/algebra/1.json")


def test_math_builder_reads_official_layout(tmp_path, math_manual):
  data_dir = str(tmp_path / "tfds")
  test = md.load_math("test", data_dir=data_dir, manual_dir=str(math_manual))
  assert [r["id"] for r in test] == ["algebra/3", "algebra/10", "counting_and_probability/4",
                                     "geometry/5", "precalculus/6"]
  assert [r["level"] for r in test] == [1, 3, 4, 5, 2]
  assert [r["answer"] for r in test] == ["-4", "\\dfrac{3}{4}", "\\{1,2\\}", "3\\sqrt{2}",
                                         "\\text{(B)}"]
  train = md.load_math("train", data_dir=data_dir)  # prepared now: no manual folder needed
  assert [r["id"] for r in train] == ["algebra/1", "algebra/2"]   # "Level ?" skipped
  # The top "MATH" folder may be left out.
  flat = md.load_math("train", data_dir=str(tmp_path / "tfds2"),
                      manual_dir=str(math_manual / "MATH"))
  assert [r["answer"] for r in flat] == ["5", "\\frac{1}{2}"]


def test_math_task_bins_and_scoring(tmp_path, math_manual):
  task = get_task("math", data_dir=str(tmp_path), manual_dir=str(math_manual))
  assert task.num_difficulties == 5
  assert [len(x) for x in task.by_level] == [1, 1, 1, 1, 1]
  level3 = task.generate(0, 2)
  assert level3.answer == "\\dfrac{3}{4}" and level3.difficulty == 2
  assert task.generate(7, 2) == task.generate(7, 2)
  for good in ("Answer: 3/4", "\\boxed{0.75}", "so \\boxed{\\frac{3}{4}}", "Answer: \\frac34",
               "Answer: $\\tfrac{3}{4}$"):
    assert task.score(level3, good) == Score(1.0, True, True), good
  for bad in ("Answer: 4/3", "\\boxed{0.7}", "Answer: 3"):
    assert task.score(level3, bad) == Score(DEFAULT_FORMAT_BONUS, False, True), bad
  assert task.score(level3, "3/4") == Score(0.0, False, False)   # no marker
  level5 = task.generate(0, 4)
  assert task.score(level5, "Answer: 3 \\sqrt{2}").correct
  assert not task.score(level5, "Answer: \\sqrt{18}").correct   # beyond the strict check
  assert not task.score(level5, "Answer: 3").correct
  assert task.score(task.generate(0, 1), "\\boxed{(B)}").correct
  assert task.prompt_messages(level3)[0]["content"].startswith(level3.question)


@pytest.mark.parametrize("pred, ref, equal", [
    ("0.5", "\\frac{1}{2}", True), ("1/2", "\\dfrac12", True), ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{-1}{2}", "-1/2", True), ("x = 5", "5", True), ("5 \\text{ cm}", "5", True),
    ("10\\%", "10", True), ("\\$1,000", "1000", True), ("90^\\circ", "90", True),
    ("\\left( 1, 2 \\right)", "(1,2)", True), ("3\\sqrt{2}", "3 \\sqrt{2}", True),
    ("\\text{yes}", "yes", True), ("2", "2.0", True), (".5", "0.5", True),
    ("\\sqrt{3}", "3", False), ("1/3", "0.33", False), ("x^2", "x^3", False), ("", "1", False),
    ("1/0", "1/0", True), ("1/0", "0", False), ("2**3", "8", False), ("(1,2)", "(2,1)", False),
])
def test_math_equal(pred, ref, equal):
  assert md.math_equal(pred, ref) is equal


def test_gsm8k_reference_parsing():
  assert md.gsm8k_reference("a\n#### 6,000") == "6000"
  assert md.gsm8k_reference("#### 1 #### 72 ") == "72"
  assert md.gsm8k_reference("no marker 5") == "no marker 5"


def test_gsm8k_from_manual_files(tmp_path, gsm8k_manual):
  data_dir = str(tmp_path)
  rows = md.load_gsm8k("test", data_dir=data_dir, manual_dir=str(gsm8k_manual))
  assert sorted(r["short_answer"] for r in rows) == ["4.5", "6,000"]
  task = get_task("gsm8k", data_dir=data_dir)   # prepared: manual folder no longer needed
  problems = sorted((task.generate(s, 0) for s in range(2)), key=lambda p: p.answer)
  half, pens = problems
  assert (half.answer, pens.answer) == ("4.5", "6000")
  good = ["The total is 6000.\nAnswer: 6000", "Answer: 6,000 pens", "\\boxed{6000}",
          "so\n#### 6000", "Answer: $6,000.", "Answer: \uff16\uff10\uff10\uff10"]
  for text in good:
    assert task.score(pens, text) == Score(1.0, True, True), text
  bad = [("Answer: 600", DEFAULT_FORMAT_BONUS), ("Answer: 6000 or 5000", 0.0),
         ("6000", 0.0), ("Answer: six thousand", 0.0),
         ("Answer: 6000\nAnswer: 5999", DEFAULT_FORMAT_BONUS)]
  for text, reward in bad:
    assert task.score(pens, text).reward == reward, text
  assert task.score(half, "Answer: 9/2").correct and task.score(half, "Answer: 4.50").correct
  assert task.score(pens, "x" * 100_000 + "Answer: 6000").correct


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.text(max_size=200), st.text(max_size=60).map(lambda t: f"Answer: {t}"),
                 st.text(max_size=60).map(lambda t: f"\\boxed{{{t}}}"),
                 st.text(alphabet="\\{}frac0123456789/.-$ ", max_size=60)),
       st.text(alphabet="\\{}frac0123456789/.-$ sqrt", max_size=30))
def test_fuzz_math_equal_and_scores(text, ref):
  assert md.math_equal(text, ref) in (True, False)
  problem = md.base.Problem(task="math", difficulty=0, prompt="", question="", answer=ref or "1",
                            target="")
  for task in (_MATH_TASK, _GSM8K_TASK):
    s = task.score(problem, text)
    assert s.reward in (0.0, DEFAULT_FORMAT_BONUS, 1.0)
    assert s.correct == (s.reward == 1.0)


class _Offline(md.MathTask):
  """A MathTask without data, to fuzz its verifier alone."""

  def __init__(self):  # pylint: disable=super-init-not-called
    md.base.Task.__init__(self, "chat")
    self.use_math_verify = False


class _OfflineGsm8k(md.Gsm8kTask):
  def __init__(self):  # pylint: disable=super-init-not-called
    md.base.Task.__init__(self, "chat")


_MATH_TASK, _GSM8K_TASK = _Offline(), _OfflineGsm8k()
