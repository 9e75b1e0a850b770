"""`zebra`: logic-grid (Einstein) puzzles with a unique solution; the question asks for one cell.

A puzzle has H houses in a row (numbered 1..H from the left) and A attributes (colour, pet, drink,
...), each attribute taking H distinct values, one per house. Bins are H x A:

  0 2x2   1 2x3   2 3x3   3 3x4   4 4x3   5 4x4

Generation (deterministic in seed and bin): draw attributes, values and a hidden solution; add
random true clues, keeping only those that rule out a remaining candidate, until exactly one
assignment is left; then drop every clue whose removal keeps the solution unique (so puzzles are
minimal); finally ask for the value of one attribute in one house, preferring cells that no
"lives in house k" clue states directly.

Solver: exhaustive and vectorised. All (H!)^A assignments are enumerated once per bin as an array
of house indices (at most 24^4 = 331,776 rows for 4x4) and each clue is a boolean mask over them,
so "unique" is proved, not assumed: `solutions(puzzle_meta)` returns every assignment that
satisfies all clues.

Clue kinds: at (X lives in house k), not_at, same (X is Y), not_same, left (X lives directly left
of Y), next (X lives next to Y), before (X lives somewhere left of Y).

Verification: the answer is lower-cased and split into words; punctuation around a word and the
word "the" are dropped, and a word that still holds anything but letters ("red0", "$eve$") makes
the answer unreadable. Correct when the words are the solution's value; formatted when they are
one of that attribute's H value names.
"""

import functools
import itertools
import re

import numpy as np

from rl_curriculum.tasks import base

__all__ = ["ZebraTask", "BINS", "solutions", "clue_holds", "ATTRIBUTES"]

BINS = ("2x2", "2x3", "3x3", "3x4", "4x3", "4x4")
_SIZES = tuple(tuple(int(x) for x in b.split("x")) for b in BINS)

# attribute -> (values, phrase for a holder of value v, question about house k)
ATTRIBUTES = {
    "colour": (("red", "green", "blue", "yellow", "white"),
               "the person in the {v} house", "What colour is house {k}?"),
    "pet": (("cat", "dog", "bird", "fish", "horse"),
            "the person who keeps the {v}", "Which pet is kept in house {k}?"),
    "drink": (("tea", "coffee", "milk", "juice", "water"),
              "the person who drinks {v}", "What does the person in house {k} drink?"),
    "name": (("alice", "bob", "carol", "dave", "eve"),
             "{V}", "What is the name of the person in house {k}?"),
    "job": (("doctor", "teacher", "painter", "baker", "pilot"),
            "the {v}", "What is the job of the person in house {k}?"),
    "sport": (("tennis", "chess", "soccer", "golf", "rowing"),
              "the person who plays {v}", "Which sport is played in house {k}?"),
}
_ATTR_NAMES = tuple(ATTRIBUTES)
_PUNCTUATION = ".,;:!?\"'()*"  # stripped from either end of an answer's words
_WORD = re.compile(r"[a-z]+")
_KINDS = ("at", "not_at", "same", "not_same", "left", "next", "before")


@functools.lru_cache(maxsize=None)
def _all_assignments(houses: int, attrs: int) -> np.ndarray:
  """int8[(H!)^A, A, H]: entry [s, a, v] is the house (0-based) of value v of attribute a."""
  perms = np.array(list(itertools.permutations(range(houses))), np.int8)   # [H!, H]
  idx = np.indices((len(perms),) * attrs).reshape(attrs, -1).T             # [(H!)^A, A]
  return perms[idx]


def _mask(cands: np.ndarray, clue) -> np.ndarray:
  """bool[S]: which candidate assignments satisfy `clue`."""
  kind, a1, v1, a2, v2, k = clue
  p = cands[:, a1, v1].astype(np.int16)
  if kind == "at":
    return p == k
  if kind == "not_at":
    return p != k
  q = cands[:, a2, v2].astype(np.int16)
  return {"same": p == q, "not_same": p != q, "left": p + 1 == q,
          "next": np.abs(p - q) == 1, "before": p < q}[kind]


def clue_holds(pos, clue) -> bool:
  """Whether `clue` holds for pos[a][v] = house of value v of attribute a (a plain-Python check)."""
  kind, a1, v1, a2, v2, k = clue
  p = pos[a1][v1]
  if kind == "at":
    return p == k
  if kind == "not_at":
    return p != k
  q = pos[a2][v2]
  return {"same": p == q, "not_same": p != q, "left": p + 1 == q, "next": abs(p - q) == 1,
          "before": p < q}[kind]


def solutions(meta) -> np.ndarray:
  """int8[S, A, H]: every assignment satisfying all clues of a puzzle (its `Problem.meta`)."""
  cands = _all_assignments(meta["houses"], len(meta["attributes"]))
  keep = np.ones(len(cands), bool)
  for clue in meta["clues"]:
    keep &= _mask(cands, tuple(clue))
  return cands[keep]


def _describe(attr: str, value: str, capital: bool) -> str:
  text = ATTRIBUTES[attr][1].format(v=value, V=value.capitalize())
  return text[0].upper() + text[1:] if capital else text


def _clue_text(clue, attrs, values) -> str:
  kind, a1, v1, a2, v2, k = clue
  x = _describe(attrs[a1], values[a1][v1], True)
  if kind in ("at", "not_at"):
    return f"{x} {'lives' if kind == 'at' else 'does not live'} in house {k + 1}."
  y = _describe(attrs[a2], values[a2][v2], False)
  return {"same": f"{x} is {y}.", "not_same": f"{x} is not {y}.",
          "left": f"{x} lives directly left of {y}.", "next": f"{x} lives next to {y}.",
          "before": f"{x} lives somewhere left of {y}."}[kind]


def _random_true_clue(rng, pos, houses, attrs):
  kind = _KINDS[int(rng.integers(len(_KINDS)))]
  a1, v1 = int(rng.integers(attrs)), int(rng.integers(houses))
  p = int(pos[a1][v1])
  if kind in ("at", "not_at"):
    k = p if kind == "at" else int(rng.choice([h for h in range(houses) if h != p]))
    return (kind, a1, v1, 0, 0, k)
  if attrs == 1 and kind in ("same", "not_same"):
    return None
  others = [a for a in range(attrs) if a != a1] if kind in ("same", "not_same") else range(attrs)
  a2 = int(rng.choice(list(others)))
  houses_ok = [h for h in range(houses) if clue_holds(
      [[p], [h]], (kind, 0, 0, 1, 0, 0)) and (a2 != a1 or h != p)]
  if not houses_ok:
    return None
  h = int(rng.choice(houses_ok))
  v2 = int(np.flatnonzero(np.asarray(pos[a2]) == h)[0])
  return (kind, a1, v1, a2, v2, 0)


class ZebraTask(base.Task):
  """Logic-grid puzzles; see the module docstring."""
  name = "zebra"
  bin_names = BINS
  answer_kind = "value"

  def _make(self, seed, difficulty):
    rng = base.rng_for(self.name, seed, difficulty)
    houses, n_attrs = _SIZES[difficulty]
    attrs = [_ATTR_NAMES[i] for i in sorted(rng.choice(len(_ATTR_NAMES), n_attrs, replace=False))]
    values = [[ATTRIBUTES[a][0][i] for i in sorted(rng.choice(5, houses, replace=False))]
              for a in attrs]
    pos = [[int(h) for h in rng.permutation(houses)] for _ in attrs]   # pos[a][v] = house
    cands = _all_assignments(houses, n_attrs)
    alive = np.ones(len(cands), bool)
    clues, masks = [], []
    while alive.sum() > 1:
      clue = _random_true_clue(rng, pos, houses, n_attrs)
      if clue is None or clue in clues:
        continue
      m = _mask(cands, clue)
      if (alive & ~m).any():
        clues.append(clue)
        masks.append(m)
        alive &= m
    # Drop redundant clues (random order) so the puzzle is minimal.
    keep = list(range(len(clues)))
    for i in rng.permutation(len(clues)):
      rest = [j for j in keep if j != i]
      if rest and np.logical_and.reduce([masks[j] for j in rest]).sum() == 1:
        keep = rest
    clues = [clues[j] for j in keep]
    order = rng.permutation(len(clues))
    clues = [clues[j] for j in order]
    # Ask about a cell that no "at" clue gives away, when there is one.
    stated = {(c[1], pos[c[1]][c[2]]) for c in clues if c[0] == "at"}
    cells = [(a, h) for a in range(n_attrs) for h in range(houses) if (a, h) not in stated]
    cells = cells or [(a, h) for a in range(n_attrs) for h in range(houses)]
    a, h = cells[int(rng.integers(len(cells)))]
    answer = values[a][pos[a].index(h)]
    lines = [f"There are {houses} houses in a row, numbered 1 to {houses} from left to right. "
             "Each house has one person, and each of the following properties takes a different "
             "value in each house:"]
    lines += [f"- {attr}: {', '.join(v)}" for attr, v in zip(attrs, values)]
    lines += ["Clues:"] + [f"{i + 1}. {_clue_text(c, attrs, values)}"
                           for i, c in enumerate(clues)]
    lines += [ATTRIBUTES[attrs[a]][2].format(k=h + 1)]
    question = "\n".join(lines)
    meta = {"houses": houses, "attributes": attrs, "values": values,
            "clues": [list(c) for c in clues], "ask": [a, h], "choices": values[a]}
    return base.Problem(task=self.name, difficulty=difficulty, prompt=f"{question}\nAnswer:",
                        question=question, answer=answer, target=f" {answer}", seed=seed,
                        meta=meta)

  def _check(self, problem, answer):
    words = [w.strip(_PUNCTUATION) for w in answer.lower()[:200].split()]
    words = [w for w in words if w and w != "the"]
    if not all(_WORD.fullmatch(w) for w in words):
      return False, False
    guess = " ".join(words)
    choices = [c.lower() for c in problem.meta["choices"]]
    return guess == problem.answer.lower(), guess in choices
