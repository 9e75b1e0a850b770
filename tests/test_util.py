"""Helpers shared by the test files: tolerances, the jit/no-jit parametrization, feedback batches.

Test files import it as `import test_util` (pyproject.toml's pytest `pythonpath` puts tests/ on
sys.path).
"""

import functools
from typing import Callable

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.types import Feedback

# Tolerance of float32 kernels checked against float64 references.
TOL = dict(rtol=1e-5, atol=1e-5)
# Every kernel test runs eagerly and under jit.
JIT = pytest.mark.parametrize("use_jit", [False, True], ids=["nojit", "jit"])
# Property tests: reproducible (derandomized), no per-example deadline (first calls compile).
SETTINGS = hypothesis.settings(max_examples=50, deadline=None, derandomize=True)


def maybe_jit(fn: Callable, use_jit: bool, **kwargs) -> Callable:
  """`fn` with `kwargs` bound (as static values), jitted when `use_jit`."""
  fn = functools.partial(fn, **kwargs)
  return jax.jit(fn) if use_jit else fn


def feedback(correct=None, *, rewards=None, ids=None, arms=None, advantages=None,
             valid=None) -> Feedback:
  """A `Feedback` of P prompts x G completions from whichever fields a test cares about.

  Give `correct` (bool[P, G]) or `rewards` (f32[P, G]), or both. Left out: rewards = correct as
  0/1, correct = rewards > 0.5, prompt ids 0..P-1, arms all 0, advantages all 0, valid None (every
  completion valid).
  """
  if correct is None and rewards is None:
    raise ValueError("give correct or rewards")
  if rewards is None:
    rewards = np.asarray(correct, np.float32)
  rewards = jnp.asarray(rewards, jnp.float32)
  if correct is None:
    correct = rewards > 0.5
  p = rewards.shape[0]
  return Feedback(
      prompt_ids=jnp.arange(p, dtype=jnp.int32) if ids is None else jnp.asarray(ids, jnp.int32),
      arms=jnp.zeros(p, jnp.int32) if arms is None else jnp.asarray(arms, jnp.int32),
      rewards=rewards, correct=jnp.asarray(correct, bool),
      advantages=(jnp.zeros(rewards.shape, jnp.float32) if advantages is None
                  else jnp.asarray(advantages, jnp.float32)),
      valid=None if valid is None else jnp.asarray(valid, bool))
