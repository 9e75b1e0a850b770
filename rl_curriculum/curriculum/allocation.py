"""Rollout budget allocation: B completions a step spread over P prompts.

Shapes stay static: every prompt owns G_max completion slots, and a mask bool[P, G_max] marks the
`counts[p]` slots that are sampled (the first ones of the row). Every allocator returns counts that
sum to B exactly, with `min_per_prompt <= counts[p] <= G_max`.

Rounding (our choice, shared by all allocators): each prompt first gets `min_per_prompt`; the rest,
R = B - P * min_per_prompt, is split in proportion to non-negative weights w[p] with each prompt
capped at G_max - min_per_prompt (water-filling: x[p] = min(cap, lambda * w[p]) with lambda chosen
so that sum(x) = R); then the floors of x are taken and the R - sum(floor(x)) leftover units go to
the prompts with the largest fractional parts (largest remainder; ties to the lower index). Prompts
with zero weight receive more than the minimum only once every positive-weight prompt is full, and
then uniformly. Allocations are deterministic.

  uniform:    w[p] = 1                                      (the default)
  variance:   w[p] = a b / ((a + b)^2 (a + b + 1))          (Beta posterior variance)
  difficulty: w[p] = 1 - success_prob[p]                    (more rollouts where success is rare)
"""

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class Allocation(NamedTuple):
  """Completions per prompt for one step."""
  counts: jax.Array  # i32[P] completions sampled for prompt p; sum = B
  mask: jax.Array    # bool[P, G_max] slot g of prompt p is sampled (g < counts[p])


def _check(num_prompts: int, budget: int, max_per_prompt: int, min_per_prompt: int) -> None:
  if num_prompts < 1:
    raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
  if max_per_prompt < 1:
    raise ValueError(f"max_per_prompt must be >= 1, got {max_per_prompt}")
  if not 0 <= min_per_prompt <= max_per_prompt:
    raise ValueError(f"min_per_prompt must lie in [0, max_per_prompt={max_per_prompt}], "
                     f"got {min_per_prompt}")
  lo, hi = num_prompts * min_per_prompt, num_prompts * max_per_prompt
  if not lo <= budget <= hi:
    raise ValueError(f"budget must lie in [P * min_per_prompt, P * max_per_prompt] = [{lo}, {hi}] "
                     f"for P={num_prompts}, got {budget}")


def _water_fill(total: jax.Array, cap: jax.Array, w: jax.Array) -> jax.Array:
  """f32[P] x = min(cap, lambda * w) with sum(x) = total; w > 0 wherever cap > 0 matters.

  Requires total <= sum(cap over w > 0). Exact up to float rounding: the saturation thresholds
  cap / w are sorted and the first j (smallest thresholds) are saturated for the smallest j whose
  lambda_j = (total - sum_{i<j} cap_i) / sum_{i>=j} w_i does not exceed threshold j.
  """
  positive = w > 0
  thresh = jnp.where(positive, cap / jnp.where(positive, w, 1.0), jnp.inf)
  order = jnp.argsort(thresh, stable=True)
  t_sorted = thresh[order]
  c_sorted = jnp.where(positive, cap, 0.0)[order]
  w_sorted = jnp.where(positive, w, 0.0)[order]
  cap_before = jnp.cumsum(c_sorted) - c_sorted          # sum_{i<j} cap_i
  w_from = jnp.cumsum(w_sorted[::-1])[::-1]             # sum_{i>=j} w_i
  lam = (total - cap_before) / jnp.where(w_from > 0, w_from, 1.0)
  ok = (lam <= t_sorted) & (w_from > 0)
  j = jnp.argmax(ok)
  lam_star = jnp.where(jnp.any(ok), lam[j], 0.0)
  return jnp.where(positive, jnp.clip(lam_star * w, 0.0, cap), 0.0)


def _round(x: jax.Array, cap: jax.Array, total: jax.Array) -> jax.Array:
  """Largest-remainder rounding of x (sum total, x <= cap) to integers summing to total."""
  base = jnp.clip(jnp.floor(x), 0.0, cap)
  frac = jnp.where(base < cap, x - base, -1.0)
  left = total - base.sum()
  rank = jnp.argsort(jnp.argsort(-frac, stable=True), stable=True)
  return (base + (rank < left)).astype(jnp.int32)


def allocate_proportional(weights: jax.Array, *, budget: int, max_per_prompt: int,
                          min_per_prompt: int = 1) -> Allocation:
  """Splits `budget` completions over P prompts in proportion to `weights` (module docstring).

  Args:
    weights: f32[P] non-negative weights (negative values count as 0; NaN is not allowed).
    budget: B, total completions of the step (a Python int).
    max_per_prompt: G_max, slots per prompt.
    min_per_prompt: completions every prompt gets (default 1).
  Returns:
    Allocation(counts i32[P] summing to B, mask bool[P, G_max]).
  Raises:
    ValueError: if P * min_per_prompt <= B <= P * G_max does not hold or an argument is malformed.
  """
  weights = jnp.asarray(weights, jnp.float32)
  if weights.ndim != 1:
    raise ValueError(f"weights must be 1-D (f32[P]), got shape {weights.shape}")
  p = weights.shape[0]
  budget, max_per_prompt, min_per_prompt = int(budget), int(max_per_prompt), int(min_per_prompt)
  _check(p, budget, max_per_prompt, min_per_prompt)
  return _allocate(weights, jnp.int32(budget), jnp.int32(min_per_prompt), max_per_prompt)


@functools.partial(jax.jit, static_argnums=3)
def _allocate(weights: jax.Array, budget: jax.Array, min_per_prompt: jax.Array,
              max_per_prompt: int) -> Allocation:
  """The arithmetic of `allocate_proportional` once the arguments are checked."""
  p = weights.shape[0]
  w = jnp.maximum(weights, 0.0)
  cap = jnp.full((p,), max_per_prompt - min_per_prompt, jnp.float32)
  total = (budget - p * min_per_prompt).astype(jnp.float32)
  positive = w > 0
  first = jnp.minimum(total, jnp.where(positive, cap, 0.0).sum())
  x = _water_fill(first, jnp.where(positive, cap, 0.0), w)
  # Whatever positive-weight prompts cannot take goes uniformly to the zero-weight ones.
  x = x + _water_fill(total - first, jnp.where(positive, 0.0, cap), (~positive).astype(jnp.float32))
  counts = min_per_prompt + _round(x, cap, total)
  mask = jnp.arange(max_per_prompt)[None, :] < counts[:, None]
  return Allocation(counts=counts, mask=mask)


def allocate_uniform(num_prompts: int, *, budget: int, max_per_prompt: int,
                     min_per_prompt: int = 1) -> Allocation:
  """Equal shares: B // P each, the B mod P leftover completions to the first prompts."""
  return allocate_proportional(jnp.ones((int(num_prompts),), jnp.float32), budget=budget,
                               max_per_prompt=max_per_prompt, min_per_prompt=min_per_prompt)


def beta_variance(a: jax.Array, b: jax.Array) -> jax.Array:
  """Variance of Beta(a, b): a b / ((a + b)^2 (a + b + 1)); f32, same shape as a and b."""
  a = jnp.asarray(a, jnp.float32)
  b = jnp.asarray(b, jnp.float32)
  return a * b / ((a + b) ** 2 * (a + b + 1.0))


def allocate_by_variance(beta_a: jax.Array, beta_b: jax.Array, *, budget: int,
                         max_per_prompt: int, min_per_prompt: int = 1) -> Allocation:
  """More rollouts where the Beta posterior of success is widest (weights = Beta variance).

  Args:
    beta_a, beta_b: f32[P] posterior parameters of the selected prompts (for example
      `stats.beta_a[selection.prompt_ids]`), all > 0.
  """
  chex.assert_equal_shape([beta_a, beta_b])
  return allocate_proportional(beta_variance(beta_a, beta_b), budget=budget,
                               max_per_prompt=max_per_prompt, min_per_prompt=min_per_prompt)


def allocate_by_difficulty(success_prob: jax.Array, *, budget: int, max_per_prompt: int,
                           min_per_prompt: int = 1) -> Allocation:
  """More rollouts for hard prompts (weights = 1 - success_prob), to find at least one success.

  Args:
    success_prob: f32[P] estimated success probability of each selected prompt in [0, 1] (for
      example the Beta posterior mean a / (a + b)); values outside are clipped.
  """
  s = jnp.clip(jnp.asarray(success_prob, jnp.float32), 0.0, 1.0)
  return allocate_proportional(1.0 - s, budget=budget, max_per_prompt=max_per_prompt,
                               min_per_prompt=min_per_prompt)
