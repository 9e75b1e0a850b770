"""`gsm8k` and `math`: grade-school and competition mathematics read through TFDS, offline-safe.

Where the data comes from, in this order (nothing is downloaded unless `download=True`):

  1. prepared TFDS data under `data_dir` (array_record files): `data_dir/gsm8k/1.0.0/`,
     `data_dir/hendrycks_math/1.0.0/`; read with `builder.as_data_source()` (no TensorFlow);
  2. the official files in a manual folder, prepared into (1) on first use:
       gsm8k: `train.jsonl` and `test.jsonl` of github.com/openai/grade-school-math
              (grade_school_math/data/), in `manual_dir` (default
              `data_dir/downloads/manual/gsm8k/`);
       math:  the MATH release of Hendrycks et al. (2021), MATH.tar extracted so that
              `manual_dir/MATH/train/algebra/1.json` (or `manual_dir/train/algebra/1.json`)
              exists (default `manual_dir`: `data_dir/downloads/manual/hendrycks_math/`);
  3. `download=True` (gsm8k only): the TFDS catalogue builder downloads the files.

Otherwise `DataNotFoundError` is raised at once with these instructions. The check happens
before any TFDS download machinery runs, because `tfds.load('gsm8k')` without a network retries
for minutes before failing. `data_dir` defaults to $TFDS_DATA_DIR or ~/tensorflow_datasets.

Bins: gsm8k has one bin (`all`); math has five, its difficulty levels 1-5 (index = level - 1;
the few problems labelled "Level ?" are skipped).

Answers. The reference is the text after "####" (gsm8k) or the last `\\boxed{}` of the solution
(MATH). A completion's answer is extracted by the template rule of `base` (last "Answer:" line or
`\\boxed{}` for chat; first line for plain); gsm8k also accepts a "#### <number>" marker.
Equivalence (`math_equal`): both sides are normalised (LaTeX spacing, `\\left`/`\\right`, `\\dfrac`,
degrees, percent and dollar signs, trailing units in `\\text{}`, a leading "x =", white space);
when both then read as exact rationals (integers, decimals, `a/b`, `\\frac{a}{b}`, or a bounded
expression of those, parsed by `parsing.parse_expression`), they are compared exactly; otherwise
the normalised strings must be identical. `math_equal(..., use_math_verify=True)` additionally
consults the optional `math-verify` package when it is installed and the strict check fails.
"""

import json
import os
import re
from typing import Optional

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from rl_curriculum.tasks import base, parsing

__all__ = ["DataNotFoundError", "Gsm8kTask", "MathTask", "HendrycksMath", "Gsm8kFromFiles",
           "load_gsm8k", "load_math", "math_equal", "normalize_math_answer", "gsm8k_reference",
           "default_data_dir"]


class DataNotFoundError(FileNotFoundError):
  """Raised when a data set is neither prepared nor available as manual files."""


def default_data_dir() -> str:
  return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def _prepared(data_dir: epath.Path, name: str, version: str) -> Optional[epath.Path]:
  """The prepared dataset folder if it holds dataset_info.json, else None."""
  path = data_dir / name / version
  return path if (path / "dataset_info.json").exists() else None


def _check_array_record(path: epath.Path) -> None:
  info = json.loads((path / "dataset_info.json").read_text())
  fmt = info.get("fileFormat", "tfrecord")
  if fmt != "array_record":
    raise DataNotFoundError(
        f"{path} was prepared as {fmt}; reading it needs TensorFlow. Delete the folder and let "
        "this module prepare it again from the manual files (it writes array_record).")


# ----------------------------------------------------------------------------- gsm8k

_GSM8K_INSTRUCTIONS = """\
Put train.jsonl and test.jsonl of the GSM8K release (github.com/openai/grade-school-math,
folder grade_school_math/data/) into {manual_dir}
or pass manual_dir=<folder holding them>, or download=True on a machine with internet access."""


def _gsm8k_builder_cls():
  # The catalogue builder module is imported lazily by tensorflow_datasets; import it explicitly.
  from tensorflow_datasets.text.gsm8k import gsm8k  # pylint: disable=g-import-not-at-top
  return gsm8k.Gsm8k


def _make_gsm8k_from_files():
  base_cls = _gsm8k_builder_cls()

  class Gsm8kFromFiles(base_cls, skip_registration=True):
    """The catalogue `gsm8k` builder, reading the official jsonl files from a manual folder."""
    name = "gsm8k"
    MANUAL_DOWNLOAD_INSTRUCTIONS = _GSM8K_INSTRUCTIONS.format(manual_dir="<manual_dir>")

    def _split_generators(self, dl_manager):
      folder = epath.Path(dl_manager.manual_dir)
      return {k: self._generate_examples(folder / f"{k}.jsonl") for k in ("train", "test")}

  return Gsm8kFromFiles


Gsm8kFromFiles = _make_gsm8k_from_files()


def load_gsm8k(split: str = "test", data_dir: Optional[str] = None,
               manual_dir: Optional[str] = None, download: bool = False) -> list[dict]:
  """GSM8K records {question, answer, annotation, short_answer} of `split` ("train"/"test").

  Raises:
    DataNotFoundError: (within milliseconds) when the data is neither prepared nor in manual_dir
      and download is False; the message says where to put the files.
  """
  if split not in ("train", "test"):
    raise ValueError(f"gsm8k split must be 'train' or 'test', got {split!r}")
  data_dir = epath.Path(data_dir or default_data_dir())
  manual = epath.Path(manual_dir) if manual_dir else data_dir / "downloads" / "manual" / "gsm8k"
  prepared = _prepared(data_dir, "gsm8k", "1.0.0")
  if prepared is not None:
    _check_array_record(prepared)
    builder = Gsm8kFromFiles(data_dir=str(data_dir))
  elif all((manual / f).exists() for f in ("train.jsonl", "test.jsonl")):
    builder = Gsm8kFromFiles(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=str(manual)))
  elif download:
    builder = _gsm8k_builder_cls()(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare()
  else:
    raise DataNotFoundError(
        f"GSM8K is not prepared in {data_dir / 'gsm8k'} and no manual files were found.\n"
        + _GSM8K_INSTRUCTIONS.format(manual_dir=manual))
  source = builder.as_data_source(split=split)
  return [_decode(source[i]) for i in range(len(source))]


def gsm8k_reference(answer_field: str) -> str:
  """The final number of a GSM8K solution: the text after the last "####", commas removed."""
  return answer_field.rsplit("####", 1)[-1].strip().replace(",", "")


# ----------------------------------------------------------------------------- MATH

_MATH_INSTRUCTIONS = """\
Extract MATH.tar of the MATH release (Hendrycks et al. 2021, github.com/hendrycks/math) into
{manual_dir} so that {manual_dir}/MATH/train/algebra/1.json exists (the
top folder may also be left out: {manual_dir}/train/algebra/1.json), or pass
manual_dir=<folder>."""


def _math_root(manual: epath.Path) -> Optional[epath.Path]:
  for root in (manual / "MATH", manual):
    if (root / "train").is_dir() and (root / "test").is_dir():
      return root
  return None


class HendrycksMath(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """MATH (Hendrycks et al. 2021) from the official JSON release in a manual folder.

  Features: problem, solution, answer (last `\\boxed{}` of the solution), level (1-5), type
  (subject), id ("<subject>/<file stem>"). Examples keep the sorted file order.
  """
  name = "hendrycks_math"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Official JSON release, levels 1-5."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = _MATH_INSTRUCTIONS.format(manual_dir="<manual_dir>")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description="MATH: 12,500 competition problems with step-by-step solutions.",
        features=tfds.features.FeaturesDict({
            "problem": tfds.features.Text(), "solution": tfds.features.Text(),
            "answer": tfds.features.Text(), "level": np.int32, "type": tfds.features.Text(),
            "id": tfds.features.Text()}),
        homepage="https://github.com/hendrycks/math",
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    root = _math_root(epath.Path(dl_manager.manual_dir))
    if root is None:
      raise DataNotFoundError(_MATH_INSTRUCTIONS.format(manual_dir=dl_manager.manual_dir))
    return {k: self._generate_examples(root / k) for k in ("train", "test")}

  def _generate_examples(self, folder):
    for subject in sorted(p for p in folder.iterdir() if p.is_dir()):
      for path in sorted(subject.glob("*.json"), key=lambda p: (len(p.stem), p.stem)):
        ex = json.loads(path.read_text())
        m = re.search(r"(\d)", str(ex.get("level", "")))
        answer = base.extract_boxed(ex["solution"])
        if not m or not 1 <= int(m.group(1)) <= 5 or answer is None:
          continue
        key = f"{subject.name}/{path.stem}"
        yield key, {"problem": ex["problem"], "solution": ex["solution"], "answer": answer,
                    "level": int(m.group(1)), "type": str(ex.get("type", subject.name)),
                    "id": key}


def load_math(split: str = "test", data_dir: Optional[str] = None,
              manual_dir: Optional[str] = None) -> list[dict]:
  """MATH records {problem, solution, answer, level, type, id} of `split` ("train"/"test").

  Raises:
    DataNotFoundError: (within milliseconds) when the data is neither prepared nor in manual_dir.
  """
  if split not in ("train", "test"):
    raise ValueError(f"math split must be 'train' or 'test', got {split!r}")
  data_dir = epath.Path(data_dir or default_data_dir())
  manual = (epath.Path(manual_dir) if manual_dir
            else data_dir / "downloads" / "manual" / "hendrycks_math")
  prepared = _prepared(data_dir, HendrycksMath.name, str(HendrycksMath.VERSION))
  if prepared is not None:
    _check_array_record(prepared)
    builder = HendrycksMath(data_dir=str(data_dir))
  elif _math_root(manual) is not None:
    builder = HendrycksMath(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=str(manual)))
  else:
    raise DataNotFoundError(
        f"MATH is not prepared in {data_dir / HendrycksMath.name} and no manual files were "
        "found.\n" + _MATH_INSTRUCTIONS.format(manual_dir=manual))
  source = builder.as_data_source(split=split)
  return [_decode(source[i]) for i in range(len(source))]


def _decode(record) -> dict:
  return {k: v.decode("utf-8") if isinstance(v, bytes) else (int(v) if isinstance(
      v, np.integer) else v) for k, v in record.items()}


# ----------------------------------------------------------------------------- equivalence

_TEXT_GROUP = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_MAX_ANSWER_CHARS = 512


def normalize_math_answer(s: str) -> str:
  """A canonical string form of a short math answer (see the module docstring)."""
  s = parsing.normalize(s[:_MAX_ANSWER_CHARS]).strip()
  for a, b in (("\n", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", ""),
               ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
               ("^{\\circ}", ""), ("^\\circ", ""), ("\\circ", ""), ("\\%", ""), ("%", ""),
               ("\\$", ""), ("$", ""), ("\\displaystyle", "")):
    s = s.replace(a, b)
  # Trailing units such as "5 \text{ cm}"; a lone "\text{yes}" keeps its content.
  m = re.match(r"^(.*?\S)\s*\\(?:text|mbox|mathrm)\s*\{[^{}]*\}\s*$", s)
  if m and re.search(r"\d", m.group(1)):
    s = m.group(1)
  s = _TEXT_GROUP.sub(r"\1", s)
  s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)   # "x = 5" -> "5"
  s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
  s = s.replace(" ", "").rstrip(".")
  s = re.sub(r"(?<![\d])\.(\d)", r"0.\1", s)   # ".5" -> "0.5"
  return s


def _as_rational(s: str) -> Optional[parsing.Fraction]:
  """The exact value of a normalised answer that is purely numeric, else None."""
  value = parsing.parse_number(s)
  if value is not None:
    return value
  expr = _FRAC.sub(r"(\1)/(\2)", s)
  expr = expr.replace("{", "(").replace("}", ")").replace("\\cdot", "*").replace("\\times", "*")
  if re.fullmatch(r"[\d\s+\-*/().]+", expr) and "." not in expr:
    parsed = parsing.parse_expression(expr, max_len=128, max_depth=8)
    return None if parsed is None else parsed.value
  return None


def math_equal(prediction: str, reference: str, use_math_verify: bool = False) -> bool:
  """Whether two short answers are mathematically equal (exact rationals, else same text)."""
  if not prediction or not reference:
    return False
  p, r = normalize_math_answer(prediction), normalize_math_answer(reference)
  if not p:
    return False
  vp, vr = _as_rational(p), _as_rational(r)
  if vp is not None and vr is not None:
    return vp == vr
  if p == r:
    return True
  if use_math_verify:
    return _math_verify(prediction, reference)
  return False


def _math_verify(prediction: str, reference: str) -> bool:
  try:
    import math_verify  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  try:
    return bool(math_verify.verify(math_verify.parse(f"${reference}$"),
                                   math_verify.parse(f"${prediction}$")))
  except Exception:  # pylint: disable=broad-except
    return False


# ----------------------------------------------------------------------------- tasks

class Gsm8kTask(base.Task):
  """GSM8K word problems; one bin. `generate(seed, 0)` is record `seed % N` of the split."""
  name = "gsm8k"
  bin_names = ("all",)
  answer_kind = "number"

  def __init__(self, template: str = "chat", format_bonus: float = base.DEFAULT_FORMAT_BONUS,
               split: str = "test", data_dir: Optional[str] = None,
               manual_dir: Optional[str] = None, download: bool = False):
    super().__init__(template, format_bonus)
    self.records = load_gsm8k(split, data_dir, manual_dir, download)
    if not self.records:
      raise DataNotFoundError(f"GSM8K split {split!r} is empty")

  def _make(self, seed, difficulty):
    rec = self.records[seed % len(self.records)]
    answer = gsm8k_reference(rec["answer"])
    question = rec["question"].strip()
    return base.Problem(task=self.name, difficulty=0, prompt=f"Question: {question}\nAnswer:",
                        question=question, answer=answer, target=f" {answer}", seed=seed,
                        meta={"index": seed % len(self.records)})

  def extract(self, completion):
    answer = base.extract_answer(completion, self.template)
    if answer is None and isinstance(completion, str) and "####" in completion:
      answer = completion[-base.MAX_COMPLETION_CHARS:].rsplit("####", 1)[1].split("\n", 1)[0]
      answer = answer.strip() or None
    return answer

  def _check(self, problem, answer):
    value = parsing.extract_number(answer)
    if value is None:
      return False, False
    return value == parsing.parse_number(problem.answer), True


class MathTask(base.Task):
  """MATH competition problems; bins are levels 1-5. `generate(seed, d)` is record
  `seed % N_d` among the split's problems of level d + 1 (optionally of some subjects)."""
  name = "math"
  bin_names = ("level1", "level2", "level3", "level4", "level5")
  answer_kind = "answer"

  def __init__(self, template: str = "chat", format_bonus: float = base.DEFAULT_FORMAT_BONUS,
               split: str = "test", data_dir: Optional[str] = None,
               manual_dir: Optional[str] = None, subjects: Optional[tuple] = None,
               use_math_verify: bool = False):
    super().__init__(template, format_bonus)
    records = load_math(split, data_dir, manual_dir)
    if subjects is not None:
      records = [r for r in records if r["type"] in subjects or r["id"].split("/")[0] in subjects]
    self.by_level = [[r for r in records if r["level"] == k + 1] for k in range(5)]
    self.use_math_verify = bool(use_math_verify)

  def _make(self, seed, difficulty):
    recs = self.by_level[difficulty]
    if not recs:
      raise ValueError(f"math: no problems of level {difficulty + 1} in this split")
    rec = recs[seed % len(recs)]
    question = rec["problem"].strip()
    return base.Problem(task=self.name, difficulty=difficulty,
                        prompt=f"Problem: {question}\nAnswer:", question=question,
                        answer=rec["answer"], target=f" {rec['answer']}", seed=seed,
                        meta={"id": rec["id"], "type": rec["type"]})

  def prompt_messages(self, problem):
    return [{"role": "user", "content": f"{problem.question}\nPut the final answer in "
                                        "\\boxed{}, or on the last line as 'Answer: <answer>'."}]

  def _check(self, problem, answer):
    return math_equal(answer, problem.answer, self.use_math_verify), True
