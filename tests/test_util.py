"""Helpers shared by the test files: tolerances, the jit/no-jit parametrization, feedback batches.

Test files import it as `import test_util` (pyproject.toml's pytest `pythonpath` puts tests/ on
sys.path).
"""

import functools
import os
import shutil
from typing import Callable, Optional

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


def set_fields(config, **fields):
  """`config` with fields set by name, "section__field" for config.section.field (the ConfigDict
  is changed in place and returned)."""
  for path, value in fields.items():
    section, name = path.split("__")
    config[section][name] = value
  return config


# The caches a workdir keeps for its tokenizer and SFT warm start (`warm_start`), not its RL run.
WARM_START = ("warm_start.json", "tokenizer.model", "sft")


def run_rl(config, workdir: str, warm_from: Optional[str] = None) -> list[dict]:
  """Rows of metrics.jsonl of the RL steps (step >= 1) of `loop.train_and_evaluate(config,
  workdir)`; with `warm_from`, the run starts from that workdir's tokenizer and SFT caches (made
  with the same task, model and SFT settings)."""
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.metrics import read_jsonl  # pylint: disable=import-outside-toplevel
  if warm_from is not None:
    os.makedirs(workdir)
    for name in WARM_START:
      source = os.path.join(warm_from, name)
      copy = shutil.copytree if os.path.isdir(source) else shutil.copy
      copy(source, os.path.join(workdir, name))
  loop.train_and_evaluate(config, workdir)
  rows = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["step"] >= 1]
  assert [r["step"] for r in rows] == list(range(1, config.rl.steps + 1))
  return rows
