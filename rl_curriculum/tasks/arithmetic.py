"""`arithmetic`: a ladder of integer arithmetic bins, from one-digit sums to multi-term expressions.

Plain template (models trained here): prompt "12+7=", target "19"; the answer is the first line of
the completion and must be exactly one integer ("19", "+19", " 19 ", "19." are accepted; "19 20",
"1 9", "nineteen" are not). Chat template: "What is 12+7?" plus the "Answer: <number>" rule.

Bins (difficulty index: name, operands; results are exact integers, `*` binds tighter than `+ -`):

   0 add_1d_1d   a+b, a, b in [0, 9]                      e.g. "3+5="        8
   1 add_2d_1d   a+b, a in [10, 99], b in [0, 9]          e.g. "47+8="       55
   2 add_2d_2d   a+b, a, b in [10, 99]                    e.g. "38+57="      95
   3 sub_2d_2d   a-b, 10 <= b <= a <= 99                  e.g. "83-27="      56
   4 mul_1d_1d   a*b, a, b in [2, 9]                      e.g. "7*8="        56
   5 mul_2d_1d   a*b, a in [10, 99], b in [2, 9]          e.g. "34*7="       238
   6 mix3_1d     three one-digit terms, two ops of + - *  e.g. "3+4*5="      23
   7 mix3_2d     three terms in [1, 99], + - *; the first two in parentheses half of the time
                                                          e.g. "(12+9)*4="   84
  Out of distribution, evaluation only:
   8 add_3d_3d   a+b, a, b in [100, 999]
   9 mul_2d_2d   a*b, a, b in [10, 99]
  10 mix4_2d     four terms in [1, 99], + - *
  11 mix5_1d     five one-digit terms, + - *

Chain option (`chain=True`): a compositional ladder where each step's result feeds the next,
"a=3+4,b=a*2,c=b-5,c=" -> "9". Bin k (0-based) has k+1 steps with one-digit operands; bins 0-5
train, 6-7 (7 and 8 steps) evaluation only. Results may be negative.
"""

from rl_curriculum.tasks import base, parsing

__all__ = ["ArithmeticTask", "BINS", "CHAIN_BINS"]

BINS = ("add_1d_1d", "add_2d_1d", "add_2d_2d", "sub_2d_2d", "mul_1d_1d", "mul_2d_1d", "mix3_1d",
        "mix3_2d", "add_3d_3d", "mul_2d_2d", "mix4_2d", "mix5_1d")
EVAL_ONLY = (8, 9, 10, 11)
CHAIN_BINS = tuple(f"chain{k}" for k in range(1, 9))
CHAIN_EVAL_ONLY = (6, 7)
_VARS = "abcdefghij"


def _eval_terms(nums, ops) -> int:
  """Value of nums[0] ops[0] nums[1] ... with * before + and -, by hand (no parser)."""
  terms, signs = [nums[0]], [1]
  for op, n in zip(ops, nums[1:]):
    if op == "*":
      terms[-1] *= n
    else:
      terms.append(n)
      signs.append(1 if op == "+" else -1)
  return sum(s * t for s, t in zip(signs, terms))


class ArithmeticTask(base.Task):
  """Integer arithmetic with exact-integer answers; see the module docstring for the bins."""
  name = "arithmetic"
  answer_kind = "number"

  def __init__(self, template: str = "plain", format_bonus: float = base.DEFAULT_FORMAT_BONUS,
               chain: bool = False):
    super().__init__(template, format_bonus)
    self.chain = bool(chain)
    self.bin_names = CHAIN_BINS if self.chain else BINS
    self.eval_only_bins = CHAIN_EVAL_ONLY if self.chain else EVAL_ONLY

  def _make(self, seed: int, difficulty: int) -> base.Problem:
    rng = base.rng_for(self.name + ("/chain" if self.chain else ""), seed, difficulty)
    if self.chain:
      expr, value = self._chain(rng, difficulty + 1)
      *steps, last = expr[:-1].split(",")
      question = f"Let {', '.join(steps)}. What is {last}?"
    else:
      expr, value = self._expression(rng, self.bin_names[difficulty])
      question = f"What is {expr[:-1]}?"
    answer = str(value)
    return base.Problem(task=self.name, difficulty=difficulty, prompt=expr, question=question,
                        answer=answer, target=answer, seed=seed,
                        meta={"bin": self.bin_names[difficulty]})

  @staticmethod
  def _expression(rng, name: str):
    def r(lo, hi):
      return int(rng.integers(lo, hi + 1))
    def ops(k):
      return [str(rng.choice(["+", "-", "*"])) for _ in range(k)]
    if name == "add_1d_1d":
      a, b = r(0, 9), r(0, 9); return f"{a}+{b}=", a + b
    if name == "add_2d_1d":
      a, b = r(10, 99), r(0, 9); return f"{a}+{b}=", a + b
    if name == "add_2d_2d":
      a, b = r(10, 99), r(10, 99); return f"{a}+{b}=", a + b
    if name == "sub_2d_2d":
      a, b = r(10, 99), r(10, 99); a, b = max(a, b), min(a, b); return f"{a}-{b}=", a - b
    if name == "mul_1d_1d":
      a, b = r(2, 9), r(2, 9); return f"{a}*{b}=", a * b
    if name == "mul_2d_1d":
      a, b = r(10, 99), r(2, 9); return f"{a}*{b}=", a * b
    if name == "add_3d_3d":
      a, b = r(100, 999), r(100, 999); return f"{a}+{b}=", a + b
    if name == "mul_2d_2d":
      a, b = r(10, 99), r(10, 99); return f"{a}*{b}=", a * b
    if name == "mix3_2d" and rng.random() < 0.5:
      a, b, c = r(1, 99), r(1, 99), r(2, 9)
      o1, o2 = str(rng.choice(["+", "-"])), "*"
      inner = a + b if o1 == "+" else a - b
      return f"({a}{o1}{b}){o2}{c}=", inner * c
    n_terms, lo, hi = {"mix3_1d": (3, 1, 9), "mix3_2d": (3, 1, 99), "mix4_2d": (4, 1, 99),
                       "mix5_1d": (5, 1, 9)}[name]
    nums = [r(lo, hi) for _ in range(n_terms)]
    o = ops(n_terms - 1)
    # Two-digit products of two-digit numbers belong to mul_2d_2d; keep one factor small here.
    for i, op in enumerate(o):
      if op == "*" and hi > 9:
        nums[i + 1] = r(2, 9)
    text = "".join(f"{n}{op}" for n, op in zip(nums, o)) + f"{nums[-1]}="
    return text, _eval_terms(nums, o)

  @staticmethod
  def _chain(rng, steps: int):
    value = int(rng.integers(1, 10))
    parts = []
    for k in range(steps):
      op = str(rng.choice(["+", "-", "*"]))
      b = int(rng.integers(2 if op == "*" else 1, 10))
      lhs = str(value) if k == 0 else _VARS[k - 1]
      parts.append(f"{_VARS[k]}={lhs}{op}{b}")
      value = value + b if op == "+" else value - b if op == "-" else value * b
    return ",".join(parts) + f",{_VARS[steps - 1]}=", value

  def _check(self, problem, answer):
    value = (parsing.parse_number(answer.rstrip(".").strip()) if self.template != "chat"
             else parsing.extract_number(answer))
    if value is None:
      return False, False
    return value == int(problem.answer), True
