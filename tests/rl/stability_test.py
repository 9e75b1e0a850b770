"""Tests for rl_curriculum.rl.stability: whitening, ratio guard, rollback, temperature, LoRA."""

import doctest
import functools
import math

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.rl import stability
import test_util



# --- Reward whitening ---------------------------------------------------------------------------


def ref_weighted_stats(batches, decay=None):
  """Weighted mean and population variance of all masked rewards; batch k of K weighs
  decay^(K-1-k) (1 without decay). Loops over entries."""
  total_w, total = 0.0, 0.0
  entries = []
  for k, (rewards, mask) in enumerate(batches):
    weight = 1.0 if decay is None else decay ** (len(batches) - 1 - k)
    for r, m in zip(np.ravel(rewards), np.ravel(mask)):
      if m:
        entries.append((weight, float(r)))
        total_w += weight
        total += weight * float(r)
  if not entries:
    return 0.0, 0.0, 0.0
  mean = total / total_w
  var = sum(w * (r - mean) ** 2 for w, r in entries) / total_w
  return total_w, mean, var


@test_util.JIT
@pytest.mark.parametrize("decay", [None, 0.9])
def test_whitening_matches_reference(use_jit, decay):
  rng = np.random.default_rng(0)
  batches = []
  for k in range(5):
    rewards = (rng.normal(size=(3, 4)) * (k + 1) + k).astype(np.float32)
    mask = rng.random((3, 4)) < 0.7
    if k == 2:
      mask[:] = False  # an empty batch changes nothing
    batches.append((rewards, mask))
  update = test_util.maybe_jit(stability.whitening_update, use_jit, decay=decay)
  state = stability.whitening_init()
  for rewards, mask in batches:
    state = update(state, rewards, mask)
  count, mean, var = ref_weighted_stats(batches, decay)
  np.testing.assert_allclose(state.count, count, **test_util.TOL)
  np.testing.assert_allclose(state.mean, mean, **test_util.TOL)
  np.testing.assert_allclose(state.m2 / state.count, var, rtol=1e-5, atol=1e-4)
  x = np.array([-3.0, 0.0, 2.5], np.float32)
  whitened = test_util.maybe_jit(stability.whiten, use_jit)(state, x)
  expected = [(v - mean) / (math.sqrt(var) + 1e-6) for v in x]
  np.testing.assert_allclose(whitened, expected, rtol=1e-5, atol=1e-5)


def test_whiten_is_identity_before_any_update_and_standardises_after():
  state = stability.whitening_init()
  x = jnp.array([[3.0, -1.0, 2.0]])
  np.testing.assert_array_equal(stability.whiten(state, x), x)
  state = stability.whitening_update(state, x)
  out = np.asarray(stability.whiten(state, x), np.float64)
  np.testing.assert_allclose(out.mean(), 0.0, atol=1e-6)
  np.testing.assert_allclose(out.std(), 1.0, rtol=1e-5)


@test_util.SETTINGS
@hypothesis.given(
    st.lists(st.floats(-100, 100, width=32), min_size=1, max_size=40),
    st.lists(st.integers(1, 8), min_size=1, max_size=6),
)
def test_property_whitening_independent_of_batching(values, sizes):
  data = np.array(values, np.float32)
  state = _UPDATE(stability.whitening_init(), jnp.asarray(data))
  split = stability.whitening_init()
  start = 0
  for size in sizes:
    chunk = data[start:start + size]
    start += size
    if chunk.size:
      split = _UPDATE(split, jnp.asarray(chunk))
  if start < data.size:
    split = _UPDATE(split, jnp.asarray(data[start:]))
  scale = max(1.0, float(np.abs(data).max()))
  np.testing.assert_allclose(split.count, data.size)
  np.testing.assert_allclose(split.mean, state.mean, atol=1e-5 * scale)
  np.testing.assert_allclose(split.m2 / split.count, state.m2 / state.count,
                             rtol=1e-4, atol=1e-5 * scale * scale)
  _, mean, var = ref_weighted_stats([(data, np.ones(data.shape, bool))])
  np.testing.assert_allclose(split.mean, mean, atol=1e-5 * scale)
  np.testing.assert_allclose(split.m2 / split.count, var, rtol=1e-4, atol=1e-5 * scale * scale)


_UPDATE = jax.jit(stability.whitening_update)


# --- Ratio guard --------------------------------------------------------------------------------


@test_util.JIT
def test_ratio_guard_matches_reference(use_jit):
  logp_old = np.zeros((2, 4), np.float32)
  logp = np.array([[0.5, -6.0, np.nan, 3.0], [7.0, 0.0, -2.0, 10.0]], np.float32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
  new_mask, frac = test_util.maybe_jit(stability.ratio_guard, use_jit, max_log_ratio=5.0)(
      logp, logp_old, mask)
  expected = np.zeros_like(mask)
  dropped, total = 0.0, 0.0
  for b in range(2):
    for t in range(4):
      d = abs(float(logp[b, t]) - float(logp_old[b, t]))
      keep = d <= 5.0  # NaN compares False
      expected[b, t] = mask[b, t] if keep else 0.0
      dropped += 0.0 if keep else mask[b, t]
      total += mask[b, t]
  np.testing.assert_array_equal(new_mask, expected)
  np.testing.assert_allclose(frac, dropped / total, **test_util.TOL)
  _, frac_empty = stability.ratio_guard(logp, logp_old, np.zeros_like(mask))
  assert float(frac_empty) == 0.0


def test_ratio_guard_bfloat16_inputs():
  logp = jnp.array([[-100.0, -0.5]], jnp.bfloat16)
  logp_old = jnp.array([[-0.5, -0.5]], jnp.bfloat16)
  new_mask, frac = stability.ratio_guard(logp, logp_old, jnp.ones((1, 2)), max_log_ratio=20.0)
  np.testing.assert_array_equal(new_mask, [[0.0, 1.0]])
  np.testing.assert_allclose(frac, 0.5)


# --- Skip and roll back -------------------------------------------------------------------------


@test_util.JIT
def test_all_finite(use_jit):
  fn = test_util.maybe_jit(stability.all_finite, use_jit)
  good = {"w": jnp.ones((2, 3)), "step": jnp.int32(4), "flag": jnp.array([True]),
          "h": jnp.ones(2, jnp.bfloat16)}
  assert bool(fn(good))
  assert bool(fn({}))
  for bad_value in (jnp.nan, jnp.inf, -jnp.inf):
    bad = dict(good, w=good["w"].at[1, 2].set(bad_value))
    assert not bool(fn(bad))
  assert not bool(fn(dict(good, h=jnp.array([1.0, jnp.inf], jnp.bfloat16))))


@test_util.JIT
def test_should_skip(use_jit):
  fn = test_util.maybe_jit(stability.should_skip, use_jit, max_kl=0.1)
  cases = [((1.0, 0.05), False), ((1.0, 0.2), True), ((np.nan, 0.0), True),
           ((1.0, np.inf), True), ((-np.inf, 0.0), True), ((0.0, np.nan), True)]
  for (loss, kl), expected in cases:
    assert bool(fn(jnp.float32(loss), jnp.float32(kl))) == expected, (loss, kl)
  assert not bool(stability.should_skip(jnp.float32(1.0), jnp.float32(50.0)))  # no bound given


@test_util.JIT
def test_select_tree_rolls_back_a_non_finite_update(use_jit):
  old = {"params": {"w": jnp.arange(3.0)}, "step": jnp.int32(7)}

  def step(state, lr):
    grads = jnp.log(lr) * jnp.ones(3)  # NaN for a negative rate
    new = {"params": {"w": state["params"]["w"] - grads}, "step": state["step"] + 1}
    loss = jnp.sum(grads)
    skip = stability.should_skip(loss, jnp.float32(0.0), max_kl=1.0) | ~stability.all_finite(new)
    return stability.select_tree(skip, state, new), skip

  step = jax.jit(step) if use_jit else step
  rolled, skipped = step(old, jnp.float32(-1.0))
  assert bool(skipped)
  jax.tree_util.tree_map(np.testing.assert_array_equal, rolled, old)
  advanced, skipped = step(old, jnp.float32(math.e))
  assert not bool(skipped)
  np.testing.assert_allclose(advanced["params"]["w"], np.arange(3.0) - 1.0, **test_util.TOL)
  assert int(advanced["step"]) == 8


def test_select_tree_requires_matching_trees():
  with pytest.raises(AssertionError):
    stability.select_tree(jnp.array(True), {"a": jnp.ones(2)}, {"a": jnp.ones(3)})


# --- Adaptive temperature -----------------------------------------------------------------------


@test_util.JIT
def test_temperature_update_matches_formula(use_jit):
  update = test_util.maybe_jit(stability.temperature_update, use_jit, target=1.0, rate=0.5,
                               t_min=0.4, t_max=1.6)
  state = stability.temperature_init(1.0)
  tau = 1.0
  for h in [0.2, 0.5, 3.0, 1.0, 0.0, 0.0, 0.0, 5.0, 5.0]:
    state = update(state, jnp.float32(h))
    tau = min(max(tau * math.exp(0.5 * (1.0 - h)), 0.4), 1.6)
    np.testing.assert_allclose(state.temperature, tau, **test_util.TOL)
  same = update(state, jnp.float32(np.nan))
  np.testing.assert_array_equal(same.temperature, state.temperature)


def test_temperature_controller_holds_entropy_near_target():
  # A toy policy whose entropy per token grows with temperature: softmax(logits / tau).
  logits = jnp.array([4.0, 2.0, 1.0, 0.0, -1.0])

  def entropy_at(tau):
    p = jax.nn.softmax(logits / tau)
    return -jnp.sum(p * jnp.log(p))

  target = float(entropy_at(1.3))
  state = stability.temperature_init(0.7)
  update = jax.jit(functools.partial(stability.temperature_update, target=target, rate=0.5,
                                     t_min=0.3, t_max=2.0))
  for _ in range(200):
    state = update(state, entropy_at(state.temperature))
  np.testing.assert_allclose(state.temperature, 1.3, rtol=1e-3)
  with pytest.raises(ValueError, match="t_min"):
    stability.temperature_update(state, jnp.float32(1.0), target=1.0, t_min=2.0, t_max=1.0)


# --- LoRA health --------------------------------------------------------------------------------


@test_util.JIT
def test_adapter_health(use_jit):
  rng = np.random.default_rng(1)
  old = {"lora_a": rng.normal(size=(4, 2)).astype(np.float32),
         "lora_b": np.zeros((2, 4), np.float32)}
  grads = {"lora_a": np.zeros((4, 2), np.float32), "lora_b": rng.normal(size=(2, 4))}
  grads["lora_b"] = grads["lora_b"].astype(np.float32)
  new = {"lora_a": old["lora_a"], "lora_b": (old["lora_b"] - 0.1 * grads["lora_b"])}
  fn = test_util.maybe_jit(stability.adapter_health, use_jit)

  def norm(tree):
    return math.sqrt(sum(float(v) ** 2 for leaf in tree.values() for v in np.ravel(leaf)))

  out = fn(grads, old, new)
  np.testing.assert_allclose(out["adapter_grad_norm"], norm(grads), **test_util.TOL)
  delta = {k: new[k] - old[k] for k in old}
  np.testing.assert_allclose(out["adapter_update_norm"], norm(delta), **test_util.TOL)
  np.testing.assert_allclose(out["adapter_param_norm"], norm(new), **test_util.TOL)
  assert not bool(out["adapter_frozen"])

  zero_grads = jax.tree_util.tree_map(np.zeros_like, grads)
  assert bool(fn(zero_grads, old, new)["adapter_frozen"])  # no gradient reaches the adapter
  assert bool(fn(grads, old, old)["adapter_frozen"])  # the update was lost
  # A bfloat16 adapter whose update is below its rounding step does not change.
  old_bf16 = {"w": jnp.full((8,), 256.0, jnp.bfloat16)}
  new_bf16 = {"w": old_bf16["w"] + jnp.asarray(1e-3, jnp.bfloat16)}
  assert bool(stability.adapter_health({"w": jnp.ones(8)}, old_bf16, new_bf16)["adapter_frozen"])


def test_docstring_examples_run():
  result = doctest.testmod(stability)
  assert result.attempted > 0 and result.failed == 0
