"""Mean `Task.score` time per task on fuzzed completions (a benchmark, not a test).

  python -m benchmarks.verifiers [--n 4000] [--seed 0]

Prints one JSON line per (task, template): microseconds per call (mean, p99, max) over completions
drawn from a fixed mix: random printable and Unicode text (up to 2,000 characters), numbers with
junk, deeply nested parentheses, huge numbers, exponent and division-by-zero expressions, the
reference answer with noise around it, and long texts ending with an answer marker. GSM8K and
MATH verifiers are timed on hand-written problems (no data needed).
"""

import json
import time

from absl import app
from absl import flags
import numpy as np

from rl_curriculum.tasks import base
from rl_curriculum.tasks import get_task
from rl_curriculum.tasks.math_datasets import Gsm8kTask
from rl_curriculum.tasks.math_datasets import MathTask

FLAGS = flags.FLAGS


_ALPHABET = list("0123456789+-*/()=.,: abcxyzAB\n\\{}$^") + ["\u0663", "\uff17", "\u00b2",
                                                             "\u2212", "\u00d7", "Answer:"]


def fuzzed_completions(rng: np.random.Generator, answer: str, n: int) -> list[str]:
  """n completions of mixed kinds (see the module docstring)."""
  out = []
  for _ in range(n):
    kind = int(rng.integers(8))
    if kind == 0:
      text = "".join(rng.choice(_ALPHABET, size=int(rng.integers(0, 200))))
    elif kind == 1:
      text = "".join(chr(int(c)) for c in rng.integers(32, 0x3000, size=int(rng.integers(0, 2000))))
    elif kind == 2:
      text = f"{rng.integers(-10**6, 10**6):,}{''.join(rng.choice(list('xyz.$%'), size=3))}"
    elif kind == 3:
      k = int(rng.integers(0, 3000))
      text = "(" * k + answer + ")" * k
    elif kind == 4:
      text = str(int(rng.integers(1, 9))) + "9" * int(rng.integers(10, 500))
    elif kind == 5:
      text = rng.choice(["2**99999999", "1/0", "(1/(2-2))", "9^9^9^9", "1e999999"])
    elif kind == 6:
      text = f"{rng.choice(['', 'so ', '[['])}{answer}{rng.choice(['', '.', ' ok', ']]'])}"
    else:
      text = "x " * int(rng.integers(0, 5000)) + f"\nAnswer: {answer}"
    if rng.random() < 0.5:
      text = f"Answer: {text}" if rng.random() < 0.5 else f"\\boxed{{{text}}}"
    out.append(str(text))
  return out


def verifier_only(cls, template: str) -> base.Task:
  """A GSM8K or MATH task without its data (its constructor would load it): only `score` works.
  """
  task = cls.__new__(cls)
  base.Task.__init__(task, template)
  task.use_math_verify = False
  return task


def run(n: int = 4000, seed: int = 0) -> list[dict]:
  """Times `n` calls of `score` per (task, template); one dict of microseconds per pair."""
  rng = np.random.default_rng(seed)
  results = []
  cases = []
  for name in ("arithmetic", "countdown", "zebra", "arc1d"):
    for template in ("plain", "chat"):
      task = get_task(name, template=template)
      problems = [task.generate(s, b) for b in range(task.num_difficulties) for s in range(2)]
      cases.append((name, template, task, problems))
  gsm = base.Problem(task="gsm8k", difficulty=0, prompt="", question="", answer="6000",
                     target="")
  math = base.Problem(task="math", difficulty=0, prompt="", question="",
                      answer="\\frac{3}{4}", target="")
  for cls, problem in ((Gsm8kTask, gsm), (MathTask, math)):
    cases.append((cls.name, "chat", verifier_only(cls, "chat"), [problem]))
  for name, template, task, problems in cases:
    times = []
    for i in range(n):
      p = problems[i % len(problems)]
      text = fuzzed_completions(rng, p.answer, 1)[0]
      t0 = time.perf_counter()
      task.score(p, text)
      times.append(time.perf_counter() - t0)
    t = np.array(times) * 1e6
    results.append({"task": name, "template": template, "calls": n,
                    "mean_us": round(float(t.mean()), 1),
                    "p99_us": round(float(np.percentile(t, 99)), 1),
                    "max_us": round(float(t.max()), 1)})
  return results


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_integer("n", 4000, "Timed calls per (task, template).")
  flags.DEFINE_integer("seed", 0, "Seed of the fuzzed completions.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for row in run(FLAGS.n, FLAGS.seed):
    print(json.dumps(row))


if __name__ == "__main__":
  define_flags()
  app.run(main)
