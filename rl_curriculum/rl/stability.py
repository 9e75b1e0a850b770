"""Stability pack for RL on small models in bfloat16 with LoRA.

The failure modes it guards against (adapters that silently stop learning, importance ratios that
overflow in bfloat16, a policy that collapses after reward errors) and the remedies (reward
whitening, a ratio guard, rollback to the last good state) follow the study of PPO on 70M-500M
models in Haque, Islam and Karray (2026), "Towards Robust Reinforcement Learning for Small-Scale
Language Model Agents", IEEE SMC 2026 (https://github.com/rezwanh001/slm-rl-agents).

Pure functions and NamedTuple states, all jittable:

- reward whitening with running statistics: `whitening_init`, `whitening_update`, `whiten`;
- an importance-ratio guard that drops tokens with extreme log-ratios: `ratio_guard`;
- update rollback: `all_finite`, `should_skip`, `select_tree`
    skip = should_skip(loss, kl, max_kl=...)
    state = select_tree(skip, state_before, candidate)
- an adaptive sampling temperature that holds policy entropy near a target:
  `temperature_init`, `temperature_update`;
- a detector of silently frozen LoRA adapters: `adapter_health`.

Shape legend: P prompts, G completions per prompt, B rows, T tokens.
"""

from typing import Any, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

__all__ = [
    "WhiteningState",
    "whitening_init",
    "whitening_update",
    "whiten",
    "ratio_guard",
    "all_finite",
    "should_skip",
    "select_tree",
    "TemperatureState",
    "temperature_init",
    "temperature_update",
    "adapter_health",
]


# --- Reward whitening -------------------------------------------------------------------------


class WhiteningState(NamedTuple):
  """Running (optionally exponentially weighted) count, mean and sum of squared deviations."""
  count: jax.Array  # f32[] effective number of rewards seen
  mean: jax.Array   # f32[] running mean, reward units
  m2: jax.Array     # f32[] running sum of squared deviations from the mean, reward units^2


def whitening_init() -> WhiteningState:
  """An empty whitening state: `whiten` is the identity until the first update."""
  zero = jnp.zeros((), jnp.float32)
  return WhiteningState(count=zero, mean=zero, m2=zero)


def whitening_update(
    state: WhiteningState,
    rewards: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    decay: Optional[float] = None,
) -> WhiteningState:
  """Merges a batch of rewards into the running statistics (Chan et al. parallel update).

  With batch count n_b, mean mu_b and squared-deviation sum M2_b over entries where mask != 0,
    (if decay) n_a <- decay * n_a,  M2_a <- decay * M2_a
    n  = n_a + n_b,  delta = mu_b - mu_a
    mu = mu_a + delta * n_b / n
    M2 = M2_a + M2_b + delta^2 * n_a * n_b / n.
  An empty batch (no unmasked entry) leaves the state unchanged (apart from the decay).

  References: Chan, Golub and LeVeque (1979), "Updating Formulae and a Pairwise Algorithm for
  Computing Sample Variances" (Stanford report STAN-CS-79-773); reward whitening for small models:
  Haque, Islam and Karray (2026), "Towards Robust Reinforcement Learning for Small-Scale Language
  Model Agents" (see the module docstring).

  Args:
    state: the running statistics.
    rewards: f32[...] rewards of any shape (e.g. [P, G]), in reward units.
    mask: optional array of rewards' shape, nonzero on entries to include (e.g. `valid`).
    decay: None for exact running statistics over all batches, or a factor in (0, 1] that
      down-weights earlier batches (an exponential moving window of about 1 / (1 - decay) batches).

  Returns:
    The updated WhiteningState.
  """
  chex.assert_type(rewards, float)
  r = rewards.astype(jnp.float32)
  w = jnp.ones_like(r) if mask is None else (mask != 0).astype(jnp.float32)
  chex.assert_equal_shape([r, w])
  n_a, mean_a, m2_a = state.count, state.mean, state.m2
  if decay is not None:
    n_a, m2_a = decay * n_a, decay * m2_a
  n_b = jnp.sum(w)
  mean_b = jnp.sum(jnp.where(w > 0, r, 0.0)) / jnp.maximum(n_b, 1.0)
  m2_b = jnp.sum(jnp.where(w > 0, jnp.square(r - mean_b), 0.0))
  n = n_a + n_b
  safe_n = jnp.maximum(n, 1e-12)
  delta = mean_b - mean_a
  mean = jnp.where(n_b > 0, mean_a + delta * n_b / safe_n, mean_a)
  m2 = jnp.where(n_b > 0, m2_a + m2_b + jnp.square(delta) * n_a * n_b / safe_n, m2_a)
  return WhiteningState(count=n, mean=mean, m2=m2)


def whiten(state: WhiteningState, rewards: jax.Array, *, eps: float = 1e-6) -> jax.Array:
  """Standardises rewards with the running statistics: (r - mean) / (std + eps).

  std = sqrt(M2 / count) (population). Before any update (count == 0) returns the rewards
  unchanged (as float32).

  Args:
    state: running statistics from `whitening_update`.
    rewards: f32[...] rewards, in reward units.
    eps: added to the std, in reward units.

  Returns:
    f32[...] whitened rewards (dimensionless), rewards' shape.
  """
  chex.assert_type(rewards, float)
  r = rewards.astype(jnp.float32)
  seen = state.count > 0
  std = jnp.sqrt(jnp.maximum(state.m2, 0.0) / jnp.maximum(state.count, 1e-12))
  return jnp.where(seen, (r - state.mean) / (std + eps), r)


# --- Importance-ratio guard -------------------------------------------------------------------


def ratio_guard(
    logp: jax.Array,
    logp_old: jax.Array,
    mask: jax.Array,
    *,
    max_log_ratio: float = 5.0,
) -> tuple[jax.Array, jax.Array]:
  """Drops tokens whose importance log-ratio is extreme.

  keep[b, t] = |logp[b, t] - logp_old[b, t]| <= max_log_ratio   (float32; NaN counts as extreme)
  new_mask = mask * keep

  Extreme ratios on a few tokens are the usual sign of a reward or numerical error in a small bf16
  model; dropping those tokens keeps one of them from dominating the update.

  Args:
    logp: float[B, T] log-probs under the policy being trained, in nats.
    logp_old: float[B, T] log-probs under the sampling policy, in nats.
    mask: f32[B, T] 1 on completion tokens that count.
    max_log_ratio: bound on |log-ratio|, in nats (5 means ratios outside [0.0067, 148]).

  Returns:
    (new_mask f32[B, T] without gradient, frac_dropped f32[] = dropped / unmasked tokens, 0 if
    there are none).
  """
  chex.assert_rank([logp, logp_old, mask], 2)
  chex.assert_equal_shape([logp, logp_old, mask])
  chex.assert_type([logp, logp_old], float)
  m = mask.astype(jnp.float32)
  diff = jnp.abs(logp.astype(jnp.float32) - logp_old.astype(jnp.float32))
  keep = diff <= max_log_ratio  # False for NaN
  new_mask = jnp.where(keep, m, 0.0)
  dropped = jnp.sum(jnp.where(keep, 0.0, m)) / jnp.maximum(jnp.sum(m), 1e-8)
  return jax.lax.stop_gradient(new_mask), jax.lax.stop_gradient(dropped)


# --- Skip and roll back -----------------------------------------------------------------------


def all_finite(tree: Any) -> jax.Array:
  """True iff every floating entry of every leaf is finite (integer and bool leaves always are).

  Args:
    tree: a pytree of arrays.

  Returns:
    bool[].
  """
  flags = [
      jnp.all(jnp.isfinite(x))
      for x in jax.tree_util.tree_leaves(tree)
      if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)
  ]
  if not flags:
    return jnp.array(True)
  return jnp.all(jnp.stack(flags))


def should_skip(loss: jax.Array, kl: jax.Array, *, max_kl: Optional[float] = None) -> jax.Array:
  """Whether to discard an update: non-finite loss or KL, or KL above a bound.

  skip = !isfinite(loss) | !isfinite(kl) | (kl > max_kl)

  Args:
    loss: f32[] training loss of the step.
    kl: f32[] a KL measure of the step (e.g. approx_kl to the sampling policy), in nats.
    max_kl: bound in nats; None checks finiteness only.

  Returns:
    bool[].
  """
  chex.assert_rank([loss, kl], 0)
  skip = ~jnp.isfinite(loss) | ~jnp.isfinite(kl)
  if max_kl is not None:
    skip = skip | (kl > max_kl)
  return skip


def select_tree(pred: jax.Array, if_true: Any, if_false: Any) -> Any:
  """Leafwise `if_true if pred else if_false` for two pytrees of one structure.

  The argument order is that of `jax.lax.select(pred, on_true, on_false)`: the tree returned
  when `pred` holds comes first. To roll back a rejected update, pass the state from before it
  first:

    state = select_tree(skip, state_before, candidate)  # state_before where skip is True

  Args:
    pred: bool[] scalar predicate.
    if_true: pytree returned where pred is True.
    if_false: pytree of the same structure, shapes and dtypes, returned where pred is False.

  Returns:
    A pytree like `if_true`.

  Example:
    >>> import jax.numpy as jnp
    >>> select_tree(jnp.array(True), {"w": jnp.zeros(2)}, {"w": jnp.ones(2)})["w"].tolist()
    [0.0, 0.0]
  """
  chex.assert_rank(pred, 0)
  chex.assert_trees_all_equal_shapes_and_dtypes(if_true, if_false)
  pred = jnp.asarray(pred, bool)
  return jax.tree_util.tree_map(lambda a, b: jax.lax.select(pred, a, b), if_true, if_false)


# --- Adaptive sampling temperature ------------------------------------------------------------


class TemperatureState(NamedTuple):
  """Sampling temperature steered towards a target policy entropy."""
  temperature: jax.Array  # f32[] current sampling temperature (dimensionless, > 0)


def temperature_init(temperature: float = 1.0) -> TemperatureState:
  """Initial controller state at the given temperature."""
  return TemperatureState(temperature=jnp.asarray(temperature, jnp.float32))


def temperature_update(
    state: TemperatureState,
    entropy: jax.Array,
    *,
    target: float,
    rate: float = 0.1,
    t_min: float = 0.5,
    t_max: float = 1.5,
) -> TemperatureState:
  """Multiplicative controller that nudges the temperature to hold entropy near `target`.

  tau <- clip(tau * exp(rate * (target - H)), t_min, t_max)

  Entropy rises with temperature, so a measured entropy below the target raises the temperature
  and one above it lowers it. Working in log-temperature keeps tau positive and makes the step
  size relative. A non-finite measurement leaves the temperature unchanged.

  Args:
    state: current TemperatureState.
    entropy: f32[] measured mean policy entropy per token on the last rollouts, in nats.
    target: desired entropy per token, in nats.
    rate: gain, in 1/nats.
    t_min: lowest temperature allowed.
    t_max: highest temperature allowed.

  Returns:
    The updated TemperatureState.
  """
  chex.assert_rank(entropy, 0)
  traced = any(isinstance(x, jax.core.Tracer) for x in (t_min, t_max))
  if not traced and not 0 < t_min <= t_max:
    raise ValueError(f"need 0 < t_min <= t_max, got t_min={t_min}, t_max={t_max}")
  h = entropy.astype(jnp.float32)
  tau = state.temperature * jnp.exp(rate * (target - h))
  tau = jnp.where(jnp.isfinite(h), jnp.clip(tau, t_min, t_max), state.temperature)
  return TemperatureState(temperature=tau)


# --- LoRA freeze detector ---------------------------------------------------------------------


def _global_norm(tree: Any) -> jax.Array:
  leaves = jax.tree_util.tree_leaves(tree)
  if not leaves:
    return jnp.zeros((), jnp.float32)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def adapter_health(
    grads: Any, old_params: Any, new_params: Any, *, tol: float = 0.0
) -> dict[str, jax.Array]:
  """Detects LoRA adapters that silently stop learning.

  grad_norm   = ||grads||_2 over all leaves (global norm, float32)
  update_norm = ||new_params - old_params||_2
  param_norm  = ||new_params||_2
  frozen      = grad_norm <= tol or update_norm <= tol

  A common failure with LoRA on small models is an adapter that receives zero gradient (wrong
  parameter filter, a B matrix initialised to 0 and never reached) or whose update is rounded
  away in bfloat16; both show as a zero norm here. Pass the adapter subtrees only.

  Args:
    grads: pytree of adapter gradients.
    old_params: pytree of adapter parameters before the update.
    new_params: pytree of adapter parameters after the update (old_params' structure).
    tol: threshold on the norms below which the adapter counts as frozen.

  Returns:
    dict with f32[] "adapter_grad_norm", "adapter_update_norm", "adapter_param_norm" and bool[]
    "adapter_frozen".
  """
  chex.assert_trees_all_equal_shapes(old_params, new_params)
  delta = jax.tree_util.tree_map(
      lambda a, b: b.astype(jnp.float32) - a.astype(jnp.float32), old_params, new_params)
  grad_norm = _global_norm(grads)
  update_norm = _global_norm(delta)
  return {
      "adapter_grad_norm": grad_norm,
      "adapter_update_norm": update_norm,
      "adapter_param_norm": _global_norm(new_params),
      "adapter_frozen": (grad_norm <= tol) | (update_norm <= tol),
  }
