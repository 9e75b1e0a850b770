"""Argument checks shared by the curricula: construction time (outside jit) and trace time.

Every curriculum constructor has the form `name(pool, *, batch_size, **options)`, where `pool` is
the `PromptPool` the curriculum will select from, or just its number of arms K where no pool exists
yet (a config check). The helpers below raise ValueError naming the argument and its allowed
values; `check_feedback` checks a `Feedback`'s static shapes while `update` is traced.
"""

from typing import Optional, Sequence, Union

import jax
import numpy as np

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.types import Feedback

PoolOrNumArms = Union[PromptPool, int]


def num_arms(pool: PoolOrNumArms) -> int:
  """K, the number of arms of a PromptPool, or `pool` itself when it is an int >= 1."""
  if isinstance(pool, PromptPool):
    return int(pool.num_arms)
  if isinstance(pool, (int, np.integer)) and not isinstance(pool, bool):
    if pool < 1:
      raise ValueError(f"pool must be a PromptPool or its number of arms (an int >= 1), got "
                       f"{pool}")
    return int(pool)
  raise ValueError(f"pool must be a PromptPool or its number of arms (an int >= 1), got "
                   f"{type(pool).__name__}")


def choice(name: str, value: str, allowed: Sequence[str]) -> str:
  """`value` when it is one of `allowed`."""
  if value not in allowed:
    raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
  return value


def positive(name: str, value, *, integer: bool = False):
  """`value` as a float > 0, or as an int >= 1 with `integer=True`; a traced value (an option the
  programs trace, checked before with its concrete value) as it is."""
  if isinstance(value, jax.core.Tracer):
    return value
  ok = value > 0 and (not integer or float(value).is_integer())
  if not ok:
    kind = "a positive integer" if integer else "> 0"
    raise ValueError(f"{name} must be {kind}, got {value!r}")
  return int(value) if integer else float(value)


def non_negative(name: str, value) -> float:
  """`value` as a float >= 0; a traced value as it is (see `positive`)."""
  if isinstance(value, jax.core.Tracer):
    return value
  if not value >= 0:
    raise ValueError(f"{name} must be >= 0, got {value!r}")
  return float(value)


def unit(name: str, value, *, closed_low: bool = True, closed_high: bool = True) -> float:
  """`value` as a float in [0, 1]; `closed_low` / `closed_high` False exclude 0 / 1; a traced
  value as it is (see `positive`)."""
  if isinstance(value, jax.core.Tracer):
    return value
  lo_ok = value >= 0 if closed_low else value > 0
  hi_ok = value <= 1 if closed_high else value < 1
  if not (lo_ok and hi_ok):
    lo = "[" if closed_low else "("
    hi = "]" if closed_high else ")"
    raise ValueError(f"{name} must lie in {lo}0, 1{hi}, got {value!r}")
  return float(value)


def arm_order(order: Optional[Sequence[int]], pool: PoolOrNumArms) -> np.ndarray:
  """i32[K] arm order, easiest first.

  Default: with a PromptPool, the arms sorted by the mean difficulty of their prompts
  (`PromptPool.difficulty`; ties and empty arms keep index order), so a pool whose arms are
  listed in any order of difficulty still starts easy; with a number of arms, 0, 1, ..., K-1.

  Raises:
    ValueError: `order` is given and is not a permutation of range(K).
  """
  k = num_arms(pool)
  if order is None:
    if not isinstance(pool, PromptPool):
      return np.arange(k, dtype=np.int32)
    arms = np.asarray(pool.arms)
    diff = np.asarray(pool.difficulty, np.float64)
    count = np.bincount(arms, minlength=k)
    total = np.bincount(arms, weights=diff, minlength=k)
    mean = np.where(count > 0, total / np.maximum(count, 1), np.inf)
    return np.argsort(mean, kind="stable").astype(np.int32)
  arr = np.asarray(order, np.int32)
  if arr.shape != (k,) or sorted(arr.tolist()) != list(range(k)):
    raise ValueError(f"order must be a permutation of range({k}), got {list(order)}")
  return arr


def check_init_pool(pool: PromptPool, expected_arms: int) -> None:
  """Raises ValueError unless the pool given to `init` has the arms the curriculum was built for."""
  if pool.num_arms != expected_arms:
    raise ValueError(f"the curriculum was built for {expected_arms} arms but the pool has "
                     f"{pool.num_arms}; build it from this pool")


def check_feedback(feedback: Feedback) -> None:
  """Checks static shapes at trace time: rewards, correct, advantages (and valid) f32[P, G]."""
  shape = feedback.rewards.shape
  if len(shape) != 2:
    raise ValueError(f"Feedback.rewards must be [P, G], got shape {shape}")
  others = [("correct", feedback.correct), ("advantages", feedback.advantages)]
  if feedback.valid is not None:
    others.append(("valid", feedback.valid))
  for name, x in others:
    if x.shape != shape:
      raise ValueError(f"Feedback.{name} has shape {x.shape}, expected {shape} like rewards")
  for name, x in [("arms", feedback.arms), ("prompt_ids", feedback.prompt_ids)]:
    if x.shape != shape[:1]:
      raise ValueError(f"Feedback.{name} has shape {x.shape}, expected ({shape[0]},)")
