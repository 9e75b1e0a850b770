"""A curriculum over the interaction horizon: how many turns an episode may take.

Multi-turn episodes end when the environment says so or after H turns of the policy. Short
horizons give short, cheap episodes and little room to explore; long ones let a policy gather
information before it answers. TTI raises H as training proceeds; this module gives three ways to
choose each step's H in 1 .. H_max:

  fixed    H = H_max every step
  linear   H moves in a straight line from `start` at step 1 to H_max at the last step (rounded
           to the nearest turn), TTI's schedule
  bandit   H is an arm of a K = H_max armed bandit, chosen by Boltzmann sampling over its values
           Q[h], which move by TD(0) toward the mean |r - group mean| of the step that used h
           (SEC's reward, here per horizon):  Q[h] <- Q[h] + alpha (R - Q[h])

The state is a pytree checkpointed with the run (`HorizonState`), so a resumed run chooses as the
uninterrupted one would.

References: Shen et al. (2025), "Thinking vs. Doing: Agents that Reason by Scaling Test-Time
Interaction", arXiv:2506.07976 (TTI, the horizon schedule); Chen et al. (2025), "Self-Evolving
Curriculum for LLM Reasoning", arXiv:2505.14970 (the bandit and its reward).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["HORIZONS", "HorizonState", "init", "linear", "select", "spread", "update"]

HORIZONS = ("fixed", "linear", "bandit")


class HorizonState(NamedTuple):
  """The bandit's values over horizons 1 .. H_max (kept for every mode: one checkpoint layout)."""
  q: jax.Array       # f32[H_max] value of each horizon (index h - 1)
  visits: jax.Array  # i32[H_max] steps that used each horizon


def init(max_turns: int) -> HorizonState:
  """Every horizon valued 0, none used."""
  return HorizonState(q=jnp.zeros((max_turns,), jnp.float32),
                      visits=jnp.zeros((max_turns,), jnp.int32))


def linear(step: int, steps: int, start: int, end: int) -> int:
  """H of step `step` (1 .. steps) on the line from `start` (step 1) to `end` (step `steps`)."""
  if steps <= 1:
    return int(end)
  return int(round(start + (end - start) * (step - 1) / (steps - 1)))


def select(mode: str, state: HorizonState, key: jax.Array, *, step: int, steps: int,
           start: int, temperature: float) -> int:
  """Step `step`'s horizon H in 1 .. H_max under `mode` (one of HORIZONS; module docstring).

  Raises:
    ValueError: an unknown mode.
  """
  end = int(state.q.shape[0])
  if mode == "fixed":
    return end
  if mode == "linear":
    return linear(step, steps, start, end)
  if mode == "bandit":
    logits = state.q / jnp.float32(temperature)
    return int(jax.random.categorical(key, logits)) + 1
  raise ValueError(f"unknown horizon mode {mode!r}; expected one of {HORIZONS}")


def spread(rewards: np.ndarray, valid: np.ndarray) -> float:
  """The bandit's reward for a step: mean over its valid episodes (bool[S, G]) of |r - the mean
  return of the episode's group| (returns f32[S, G]); 0 with no group of two valid episodes."""
  rewards, valid = np.asarray(rewards, np.float64), np.asarray(valid, bool)
  count = valid.sum(axis=1, keepdims=True)
  mean = np.where(valid, rewards, 0.0).sum(axis=1, keepdims=True) / np.maximum(count, 1)
  keep = valid & (count >= 2)
  return float(np.abs(rewards - mean)[keep].mean()) if keep.any() else 0.0


def update(state: HorizonState, horizon: int, reward: float, alpha: float) -> HorizonState:
  """TD(0): the value of `horizon` moved by `alpha` toward `reward`; its visit counted."""
  h = int(horizon) - 1
  q = state.q.at[h].add(jnp.float32(alpha) * (jnp.float32(reward) - state.q[h]))
  return HorizonState(q=q, visits=state.visits.at[h].add(1))
